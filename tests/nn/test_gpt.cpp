// SPDX-License-Identifier: Apache-2.0
// The tensor-parallel Gpt equals the one-rank Gpt (design invariant 4): the same loss and, for
// every parameter, this rank's gradient shard equals the matching slice of the one-rank gradient
// (matched through the shard's GlobalSlice). tp = np (1, 2, 4); float and double.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "../comm/comm_test.hpp"
#include "model_test.hpp"
#include "pmt/nn/gpt.hpp"

#include <cmath>

using Host    = Kokkos::DefaultHostExecutionSpace;
using Backend = pmt::test::World::backend;

TEMPLATE_TEST_CASE("the tensor-parallel Gpt gives the one-rank loss and gradients", "[nn][gpt][tp][mpi]", float,
                   double) {
  using T       = TestType;
  const auto& w = pmt::test::world();
  const int tp = w.size(), r = w.rank();
  Host exec;
  pmt::Mesh<Backend> one(w.split(r, 0), pmt::MeshShape{});
  pmt::Mesh<Backend> mesh(w, pmt::MeshShape{1, tp, 1});
  const pmt::nn::GptConfig cfg{/*vocab=*/96, /*context=*/16, /*layers=*/2,
                               /*width=*/32, /*heads=*/4,    /*seed=*/99};
  pmt::nn::Gpt<T, Host, Backend> ref(one, cfg), par(mesh, cfg);
  const std::size_t B = 2, Tn = 12;
  typename pmt::nn::Gpt<T, Host, Backend>::Ids ids("ids", B * Tn), targets("targets", B * Tn);
  for (std::size_t n = 0; n < B * Tn; ++n) {
    ids(n)     = static_cast<std::int32_t>((n * 37 + 5) % cfg.vocab);
    targets(n) = n % 7 == 3 ? -100 : static_cast<std::int32_t>((n * 11 + 2) % cfg.vocab);
  }
  const double l_ref = ref.forward_backward(exec, ids, targets, B, Tn, /*normaliser=*/20.0);
  const double l_par = par.forward_backward(exec, ids, targets, B, Tn, 20.0);
  exec.fence();
  const double tol = std::is_same_v<T, double> ? 1e-10 : 1e-5;
  bool ok          = std::abs(l_par - l_ref) <= tol * std::abs(l_ref) && std::isfinite(l_ref) && l_ref > 0;
  auto pr = ref.parameters(), pp = par.parameters();
  ok                  = ok && pr.size() == pp.size();
  double largest_grad = 0;  // over the whole one-rank model
  for (auto* p : pr)
    for (std::size_t i = 0; i < p->size(); ++i) largest_grad = std::max(largest_grad, std::abs(double(p->grad(i))));
  std::string worst_name;
  double worst = 0;
  for (std::size_t i = 0; ok && i < pr.size(); ++i) {
    const double e = std::max(pmt::test::shard_error(*pp[i], *pr[i], false, 0.0),
                              pmt::test::shard_error(*pp[i], *pr[i], true, 1e-3 * largest_grad));
    if (e > worst) worst = e, worst_name = pp[i]->name;
  }
  INFO("loss " << l_ref << " vs " << l_par << "; worst parameter " << worst_name << " relative error " << worst);
  ok = ok && worst <= tol;
  // Memory: every tp-split parameter holds exactly 1/tp of the one-rank bytes; the rest all of them.
  std::size_t split_params = 0;
  for (std::size_t i = 0; ok && i < pr.size(); ++i) {
    const bool split = !pp[i]->tp_replicated;
    split_params += split;
    ok = ok && pp[i]->bytes() * (split ? static_cast<std::size_t>(tp) : 1) == pr[i]->bytes();
  }
  // Split per block: the fused q, k, v weight and the q and v biases, proj weight (4); MLP Col
  // weight+bias, Row weight (3). Plus the token embedding when tp > 1 (its vocabulary split).
  ok = ok && split_params == cfg.layers * 7 + (tp > 1 ? 1 : 0);
  CHECK(pmt::test::all_ranks(ok));
}

TEST_CASE("Gpt refuses sizes that do not divide by tp and names them", "[nn][gpt][errors][mpi]") {
  const auto& w = pmt::test::world();
  const int tp  = w.size();
  pmt::Mesh<Backend> mesh(w, pmt::MeshShape{1, tp, 1});
  using Catch::Matchers::ContainsSubstring;
  if (tp > 1) {
    pmt::nn::GptConfig bad_vocab{
        /*vocab=*/static_cast<std::size_t>(4 * tp + 1), 8, 1, 16, 4 * static_cast<std::size_t>(tp), 1};
    CHECK_THROWS_WITH((pmt::nn::Gpt<double, Host, Backend>(mesh, bad_vocab)),
                      ContainsSubstring("vocabulary size " + std::to_string(4 * tp + 1) +
                                        " is not divisible by tp = " + std::to_string(tp) + "; pad the vocabulary"));
    pmt::nn::GptConfig bad_heads{static_cast<std::size_t>(8 * tp), 8, 1, 16 * static_cast<std::size_t>(tp), 1, 1};
    CHECK_THROWS_WITH((pmt::nn::Gpt<double, Host, Backend>(mesh, bad_heads)),
                      ContainsSubstring("heads 1 are not divisible by tp = " + std::to_string(tp)));
  }
  pmt::nn::GptConfig zero{8, 8, 0, 16, 4, 1};
  CHECK_THROWS_AS((pmt::nn::Gpt<double, Host, Backend>(mesh, zero)), pmt::ShapeError);
  CHECK(pmt::test::all_ranks(true));
}

TEST_CASE("a target outside the vocabulary raises on every tp rank, before the loss's collectives",
          "[nn][gpt][errors][mpi]") {
  // The targets are the same on every tp rank, so every rank raises at the same check and none
  // is left waiting in the vocab-parallel cross-entropy's all-reduces.
  const auto& w = pmt::test::world();
  pmt::Mesh<Backend> mesh(w, pmt::MeshShape{1, w.size(), 1});
  const pmt::nn::GptConfig cfg{/*vocab=*/96, /*context=*/16, /*layers=*/1,
                               /*width=*/32, /*heads=*/4,    /*seed=*/5};
  pmt::nn::Gpt<float, Host, Backend> gpt(mesh, cfg);
  const std::size_t B = 2, Tn = 12;
  typename pmt::nn::Gpt<float, Host, Backend>::Ids ids("ids", B * Tn), targets("targets", B * Tn);
  for (std::size_t n = 0; n < B * Tn; ++n) targets(n) = static_cast<std::int32_t>(n % cfg.vocab);
  targets(5) = 96;  // one past the vocabulary
  targets(7) = -1;  // negative, and not the ignore index (-100)
  targets(9) = -100;
  using Catch::Matchers::StartsWith;
  CHECK_THROWS_WITH(gpt.forward_backward(Host(), ids, targets, B, Tn, 22.0),
                    StartsWith("pmt::nn::vocab_parallel_cross_entropy: 2 of 24 targets lie outside [0, 96) and are "
                               "not ignore_index (-100); logits is (24, " +
                               std::to_string(96 / w.size()) + ")"));
  targets(5) = 1;
  targets(7) = 2;
  CHECK(std::isfinite(gpt.forward_backward(Host(), ids, targets, B, Tn, 22.0)));
  CHECK(pmt::test::all_ranks(true));
}
