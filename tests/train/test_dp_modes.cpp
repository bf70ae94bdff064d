// SPDX-License-Identifier: Apache-2.0
// Data-parallel variants against their references, and the same Gpt on another execution space:
// - ZeRO-1 (AdamW state sharded over dp) equals plain synchronous DP (losses and parameters),
//   with clipping on, at dp = np and (np = 4) dp 2 x tp 2; its state is 1/dp of plain AdamW's.
// - A ZeRO-1 checkpoint resumes bit for bit, and plain AdamW on one rank resumes it as well.
// - ZeRO-2 equals plain DP with two microbatches (its buckets reduce-scattered in each); its
//   checkpoint resumes bit for bit, and ZeRO-1 and plain AdamW on one rank resume it as well.
// - GradSync sums gradients over dp once armed, and refuses a finish() without arm().
// - Local SGD with H = 1 and plain SGD equals synchronous DP with plain SGD.
// - Local SGD with H = 3 keeps replicas apart between averages and equal right after them.
// - Gpt<double, Kokkos::Serial> computes what Gpt<double, Kokkos::OpenMP> does.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "../comm/comm_test.hpp"
#include "pmt/io/checkpoint.hpp"
#include "pmt/nn/gpt.hpp"
#include "pmt/nn/linear.hpp"
#include "pmt/optim/optimizers.hpp"
#include "pmt/optim/zero.hpp"
#include "pmt/optim/zero2.hpp"
#include "pmt/parallel/grad_sync.hpp"
#include "pmt/train/trainer.hpp"
#include "train_test.hpp"

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

using Host    = Kokkos::DefaultHostExecutionSpace;
using Backend = pmt::test::World::backend;

namespace {

constexpr std::size_t V = 96, Tn = 8, B_global = 8;
const pmt::nn::GptConfig cfg{V, /*context=*/8, /*layers=*/1, /*width=*/32, /*heads=*/4, /*seed=*/17};

template <class Ids>
pmt::train::Microbatch<Ids> batch(int step, std::size_t first_seq, std::size_t B) {
  return pmt::test::synthetic_batch<Ids>(step, first_seq, B, Tn, V, /*ignore=*/false);
}

/// Largest norm-wise relative difference over the parameters of two models of the same layout
/// (floored at 1e-3 for parameters near zero).
template <class Model>
double param_diff(Model& a, Model& b) {
  auto pa = a.parameters(), pb = b.parameters();
  double worst = 0;
  for (std::size_t i = 0; i < pa.size(); ++i) {
    double d = 0, r = 0;
    for (std::size_t k = 0; k < pa[i]->size(); ++k) {
      const double x = pa[i]->value(k), y = pb[i]->value(k);
      d += (x - y) * (x - y);
      r += y * y;
    }
    worst = std::max(worst, std::sqrt(d) / std::max(std::sqrt(r), 1e-3));
  }
  return worst;
}

}  // namespace

TEMPLATE_TEST_CASE("ZeRO-1 equals plain data parallelism and holds 1/dp of the optimizer state",
                   "[train][zero][dp][mpi]", double, float) {
  using T          = TestType;
  using Model      = pmt::nn::Gpt<T, Host, Backend>;
  using Ids        = typename Model::Ids;
  const auto& w    = pmt::test::world();
  const int n      = w.size();
  const double tol = std::is_same_v<T, double> ? 1e-10 : 1e-5;
  const pmt::optim::AdamWOptions hyper{0.9, 0.95, 1e-8, 0.1};
  for (int tp : {1, 2}) {
    if (n % tp != 0 || (tp == 2 && n < 4)) continue;
    const int dp = n / tp;
    DYNAMIC_SECTION("dp " << dp << " x tp " << tp) {
      pmt::Mesh<Backend> mesh(w, pmt::MeshShape{dp, tp, 1});
      Model plain(mesh, cfg), zero(mesh, cfg);
      pmt::optim::AdamW<T, Host> plain_opt(plain.parameters(), hyper);
      pmt::optim::ZeroAdamW<T, Host, Backend> zero_opt(zero.parameters(), hyper, mesh.comm(pmt::Axis::dp),
                                                       mesh.comm(pmt::Axis::tp));
      pmt::train::Trainer<Model, pmt::optim::AdamW<T, Host>, Host, Backend> plain_tr(mesh, plain, plain_opt);
      pmt::train::Trainer<Model, pmt::optim::ZeroAdamW<T, Host, Backend>, Host, Backend> zero_tr(mesh, zero, zero_opt);
      const std::size_t B     = B_global / static_cast<std::size_t>(dp),
                        first = B * static_cast<std::size_t>(mesh.coord(pmt::Axis::dp));
      double worst_loss = 0, worst_norm = 0;
      for (int step = 0; step < 10; ++step) {
        const pmt::train::StepOptions o{double(B_global * Tn), 3e-3, 0.5};  // clipping active
        const double lp = plain_tr.step({batch<Ids>(step, first, B)}, o);
        const double lz = zero_tr.step({batch<Ids>(step, first, B)}, o);
        worst_loss      = std::max(worst_loss, std::abs(lp - lz) / std::abs(lp));
        worst_norm      = std::max(
                 worst_norm, std::abs(plain_tr.last_grad_norm() - zero_tr.last_grad_norm()) / plain_tr.last_grad_norm());
      }
      std::size_t P = 0;
      for (auto* p : plain.parameters()) P += p->size();
      const std::size_t expect_state = 2 * ((P + dp - 1) / dp) * sizeof(T);
      const double pd                = param_diff(plain, zero);
      INFO("loss " << worst_loss << ", grad norm " << worst_norm << ", parameters " << pd << "; state "
                   << zero_opt.state_bytes() << " B vs plain " << 2 * P * sizeof(T) << " B");
      CHECK(pmt::test::all_ranks(worst_loss <= tol && worst_norm <= tol && pd <= tol &&
                                 zero_opt.state_bytes() == expect_state));
    }
  }
}

TEST_CASE("a ZeRO-1 checkpoint resumes exactly, and plain AdamW on one rank resumes it too",
          "[train][zero][checkpoint][mpi]") {
  using Model   = pmt::nn::Gpt<double, Host, Backend>;
  using Ids     = typename Model::Ids;
  using Zero    = pmt::optim::ZeroAdamW<double, Host, Backend>;
  using Plain   = pmt::optim::AdamW<double, Host>;
  const auto& w = pmt::test::world();
  const int dp  = w.size();
  const pmt::optim::AdamWOptions hyper{0.9, 0.95, 1e-8, 0.1};
  const pmt::train::StepOptions o{double(B_global * Tn), 3e-3, 0.5};
  const std::size_t B = B_global / static_cast<std::size_t>(dp), first = B * static_cast<std::size_t>(w.rank());
  const std::string dir = pmt::test::shared_temp_path(w, "pmt-test-zero-checkpoint");
  pmt::Mesh<Backend> mesh(w, pmt::MeshShape{dp, 1, 1});
  pmt::Mesh<Backend> one(w.split(w.rank(), 0), pmt::MeshShape{});
  pmt::io::CheckpointInfo info;
  info.step  = 3;
  info.model = "test gpt";

  // 6 steps straight, saved after the third
  Model straight(mesh, cfg);
  Zero opt(straight.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp));
  pmt::train::Trainer<Model, Zero, Host, Backend> tr(mesh, straight, opt);
  std::vector<double> losses;
  for (int step = 0; step < 6; ++step) {
    losses.push_back(tr.step({batch<Ids>(step, first, B)}, o));
    if (step == 2) pmt::io::save_checkpoint(dir, mesh, opt, info);
  }

  // the same layout and optimizer from the checkpoint: bit for bit
  pmt::nn::GptConfig other = cfg;
  other.seed               = cfg.seed + 1;  // the checkpoint must overwrite every value
  Model resumed(mesh, other);
  Zero resumed_opt(resumed.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp));
  const auto got = pmt::io::load_checkpoint(pmt::io::latest_checkpoint(dir), mesh, resumed_opt, info.model);
  CHECK(got.step == 3);
  CHECK(resumed_opt.steps() == 3);
  pmt::train::Trainer<Model, Zero, Host, Backend> resumed_tr(mesh, resumed, resumed_opt);
  bool same = true;
  for (int step = 3; step < 6; ++step)
    same = resumed_tr.step({batch<Ids>(step, first, B)}, o) == losses[std::size_t(step)] && same;
  CHECK(pmt::test::all_ranks(same && param_diff(resumed, straight) == 0));

  // plain AdamW on one rank, the whole batch: the same numbers within 1e-10 (only the order of
  // the dp sums differs), which needs every rank's part of the moments and the step count
  Model whole(one, other);
  Plain whole_opt(whole.parameters(), hyper);
  pmt::io::load_checkpoint(pmt::io::latest_checkpoint(dir), one, whole_opt, info.model);
  pmt::train::Trainer<Model, Plain, Host, Backend> whole_tr(one, whole, whole_opt);
  double worst = 0;
  for (int step = 3; step < 6; ++step)
    worst = std::max(worst, std::abs(whole_tr.step({batch<Ids>(step, 0, B_global)}, o) - losses[std::size_t(step)]) /
                                std::abs(losses[std::size_t(step)]));
  INFO("losses of plain AdamW on one rank after the ZeRO-1 checkpoint: " << worst);
  CHECK(pmt::test::all_ranks(worst <= 1e-10));

  pmt::comm::barrier(w);
  if (w.rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("ZeRO-2 equals plain DP; its checkpoint resumes exactly, and ZeRO-1 and plain AdamW resume it too",
          "[train][zero][zero2][checkpoint][mpi]") {
  using Model   = pmt::nn::Gpt<double, Host, Backend>;
  using Ids     = typename Model::Ids;
  using Zero2   = pmt::optim::Zero2AdamW<double, Host, Backend>;
  using Zero    = pmt::optim::ZeroAdamW<double, Host, Backend>;
  using Plain   = pmt::optim::AdamW<double, Host>;
  const auto& w = pmt::test::world();
  const int dp  = w.size();
  const pmt::optim::AdamWOptions hyper{0.9, 0.95, 1e-8, 0.1};
  const pmt::train::StepOptions o{double(B_global * Tn), 3e-3, 0.5};  // clipping active
  const std::size_t B = B_global / static_cast<std::size_t>(dp), first = B * static_cast<std::size_t>(w.rank());
  const auto mbs = [&](int step) {  // two microbatches where the local batch allows
    if (B < 2) return std::vector<pmt::train::Microbatch<Ids>>{batch<Ids>(step, first, B)};
    return std::vector<pmt::train::Microbatch<Ids>>{batch<Ids>(step, first, B / 2),
                                                    batch<Ids>(step, first + B / 2, B - B / 2)};
  };
  const std::string dir = pmt::test::shared_temp_path(w, "pmt-test-zero2-checkpoint");
  pmt::Mesh<Backend> mesh(w, pmt::MeshShape{dp, 1, 1});
  pmt::Mesh<Backend> one(w.split(w.rank(), 0), pmt::MeshShape{});
  pmt::io::CheckpointInfo info;
  info.step  = 3;
  info.model = "test gpt";

  // 6 steps straight with ZeRO-2 (small buckets), saved after the third; plain DP alongside
  Model straight(mesh, cfg), plain(mesh, cfg);
  Zero2 opt(straight.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp), std::nullopt, {},
            4 << 10);
  Plain plain_opt(plain.parameters(), hyper);
  pmt::train::Trainer<Model, Zero2, Host, Backend> tr(mesh, straight, opt);
  pmt::train::Trainer<Model, Plain, Host, Backend> plain_tr(mesh, plain, plain_opt);
  std::vector<double> losses;
  double worst_plain = 0;
  for (int step = 0; step < 6; ++step) {
    losses.push_back(tr.step(mbs(step), o));
    const double lp = plain_tr.step(mbs(step), o);
    worst_plain     = std::max(worst_plain, std::abs(lp - losses.back()) / std::abs(lp));
    if (step == 2) pmt::io::save_checkpoint(dir, mesh, opt, info);
  }
  INFO("ZeRO-2 against plain DP: losses " << worst_plain << ", parameters " << param_diff(straight, plain) << "; "
                                          << opt.buckets() << " buckets");
  CHECK(pmt::test::all_ranks(worst_plain <= 1e-10 && param_diff(straight, plain) <= 1e-10));
  std::size_t P = 0;
  for (auto* p : plain.parameters()) P += p->size();
  CHECK(opt.state_bytes() <= 2 * (P / static_cast<std::size_t>(dp) + opt.buckets()) * sizeof(double));

  // ZeRO-2 from the checkpoint: bit for bit
  pmt::nn::GptConfig other = cfg;
  other.seed               = cfg.seed + 1;  // the checkpoint must overwrite every value
  Model resumed(mesh, other);
  Zero2 resumed_opt(resumed.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp), std::nullopt, {},
                    4 << 10);
  const auto got = pmt::io::load_checkpoint(pmt::io::latest_checkpoint(dir), mesh, resumed_opt, info.model);
  CHECK(got.step == 3);
  CHECK(resumed_opt.steps() == 3);
  pmt::train::Trainer<Model, Zero2, Host, Backend> resumed_tr(mesh, resumed, resumed_opt);
  bool same = true;
  for (int step = 3; step < 6; ++step) same = resumed_tr.step(mbs(step), o) == losses[std::size_t(step)] && same;
  CHECK(pmt::test::all_ranks(same && param_diff(resumed, straight) == 0));

  // ZeRO-1 on the same ranks and plain AdamW on one rank: the same numbers within 1e-10 (the
  // dp sums in another order), which needs every rank's part of the moments and the step count
  Model zero1(mesh, other), whole(one, other);
  Zero zero1_opt(zero1.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp));
  Plain whole_opt(whole.parameters(), hyper);
  pmt::io::load_checkpoint(pmt::io::latest_checkpoint(dir), mesh, zero1_opt, info.model);
  pmt::io::load_checkpoint(pmt::io::latest_checkpoint(dir), one, whole_opt, info.model);
  pmt::train::Trainer<Model, Zero, Host, Backend> zero1_tr(mesh, zero1, zero1_opt);
  pmt::train::Trainer<Model, Plain, Host, Backend> whole_tr(one, whole, whole_opt);
  double worst = 0;
  for (int step = 3; step < 6; ++step) {
    const double l = losses[std::size_t(step)];
    worst          = std::max(worst, std::abs(zero1_tr.step(mbs(step), o) - l) / std::abs(l));
    worst          = std::max(worst, std::abs(whole_tr.step({batch<Ids>(step, 0, B_global)}, o) - l) / std::abs(l));
  }
  INFO("losses of ZeRO-1 and of plain AdamW on one rank after the ZeRO-2 checkpoint: " << worst);
  CHECK(pmt::test::all_ranks(worst <= 1e-10));

  pmt::comm::barrier(w);
  if (w.rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("GradSync sums over dp once armed, and finish() without arm() raises instead of skipping",
          "[train][dp][mpi]") {
  using Catch::Matchers::ContainsSubstring;
  const auto& w = pmt::test::world();
  const int dp  = w.size();
  pmt::Mesh<Backend> mesh(w, pmt::MeshShape{dp, 1, 1});
  pmt::nn::Linear<double, pmt::Replicate, Host, Backend> layer(mesh, 4, 3, {5, 1});
  const auto ps = layer.parameters();
  pmt::parallel::GradSync<double, Host, Backend> sync(mesh.comm(pmt::Axis::dp), ps, /*bucket_bytes=*/64);  // 2 buckets
  for (auto* p : ps) Kokkos::deep_copy(p->grad, double(w.rank() + 1));
  const std::string forgot =
      "pmt::parallel::GradSync::finish: arm() was not called since the last finish(), so nothing was "
      "summed over the " +
      std::to_string(dp) + " dp ranks";
  if (dp > 1)
    CHECK_THROWS_WITH(sync.finish(Host()), ContainsSubstring(forgot));
  else
    CHECK_NOTHROW(sync.finish(Host()));  // one rank: nothing to sum
  bool ok = true;
  for (auto* p : ps)
    for (std::size_t i = 0; i < p->size(); ++i) ok = ok && p->grad(i) == double(w.rank() + 1);  // untouched
  sync.arm(true);
  sync.ready(Host(), ps);
  sync.finish(Host());
  for (auto* p : ps)
    for (std::size_t i = 0; i < p->size(); ++i) ok = ok && p->grad(i) == dp * (dp + 1) / 2.0;  // summed, not averaged
  CHECK(pmt::test::all_ranks(ok));
  if (dp > 1) CHECK_THROWS_WITH(sync.finish(Host()), ContainsSubstring(forgot));  // every step arms again
}

TEST_CASE("local SGD with H = 1 and plain SGD equals synchronous data parallelism", "[train][localsgd][dp][mpi]") {
  using Model   = pmt::nn::Gpt<double, Host, Backend>;
  using Ids     = Model::Ids;
  using Opt     = pmt::optim::Sgd<double, Host>;
  const auto& w = pmt::test::world();
  const int dp  = w.size();
  pmt::Mesh<Backend> mesh(w, pmt::MeshShape{dp, 1, 1});
  Model sync_m(mesh, cfg), local_m(mesh, cfg);
  Opt sync_opt(sync_m.parameters(), {0.0, 0.0}), local_opt(local_m.parameters(), {0.0, 0.0});  // no momentum, no decay
  pmt::train::Trainer<Model, Opt, Host, Backend> sync_tr(mesh, sync_m, sync_opt);
  pmt::train::Trainer<Model, Opt, Host, Backend, pmt::LocalSgd<1>> local_tr(mesh, local_m, local_opt);
  const std::size_t B = B_global / static_cast<std::size_t>(dp), first = B * static_cast<std::size_t>(w.rank());
  double worst_loss = 0;
  for (int step = 0; step < 10; ++step) {
    const pmt::train::StepOptions o{double(B_global * Tn), 0.05, 0.0};  // no clipping: replicas' norms differ
    const double ls = sync_tr.step({batch<Ids>(step, first, B)}, o);
    const double ll = local_tr.step({batch<Ids>(step, first, B)}, o);
    worst_loss      = std::max(worst_loss, std::abs(ls - ll) / std::abs(ls));
  }
  const double pd = param_diff(sync_m, local_m);
  INFO("loss " << worst_loss << ", parameters " << pd);
  CHECK(pmt::test::all_ranks(worst_loss <= 1e-10 && pd <= 1e-10));
}

TEST_CASE("local SGD with H = 3 averages the replicas every third step only", "[train][localsgd][dp][mpi]") {
  using Model   = pmt::nn::Gpt<double, Host, Backend>;
  using Ids     = Model::Ids;
  using Opt     = pmt::optim::AdamW<double, Host>;
  const auto& w = pmt::test::world();
  const int dp  = w.size();
  pmt::Mesh<Backend> mesh(w, pmt::MeshShape{dp, 1, 1});
  Model m(mesh, cfg);
  Opt opt(m.parameters(), {0.9, 0.95, 1e-8, 0.0});
  pmt::train::Trainer<Model, Opt, Host, Backend, pmt::LocalSgd<3>> tr(mesh, m, opt);
  const std::size_t B = B_global / static_cast<std::size_t>(dp), first = B * static_cast<std::size_t>(w.rank());
  auto& probe = *m.parameters().back();  // the final LayerNorm's bias: changes every step
  bool ok     = true;
  for (int step = 1; step <= 6; ++step) {
    tr.step({batch<Ids>(step, first, B)}, pmt::train::StepOptions{double(B_global * Tn), 1e-3, 0.0});
    Kokkos::View<double*, Kokkos::HostSpace> lo("lo", probe.size()), hi("hi", probe.size());
    Kokkos::deep_copy(lo, probe.value);
    Kokkos::deep_copy(hi, probe.value);
    pmt::comm::all_reduce(w, Host(), lo, pmt::comm::ReduceOp::Min);
    pmt::comm::all_reduce(w, Host(), hi, pmt::comm::ReduceOp::Max);
    double spread = 0;
    for (std::size_t i = 0; i < probe.size(); ++i) spread = std::max(spread, hi(i) - lo(i));
    const bool averaged = step % 3 == 0;
    if (averaged) ok = ok && spread == 0.0;
    if (!averaged && dp > 1) ok = ok && spread > 0.0;
  }
  CHECK(pmt::test::all_ranks(ok));
}

TEST_CASE("the same Gpt source on Kokkos::Serial gives the OpenMP result", "[nn][gpt][spaces]") {
#if defined(KOKKOS_ENABLE_SERIAL) && defined(KOKKOS_ENABLE_OPENMP)
  pmt::comm::Communicator<pmt::comm::Self> self;
  pmt::Mesh<pmt::comm::Self> one(self, pmt::MeshShape{});
  pmt::nn::Gpt<double, Kokkos::Serial, pmt::comm::Self> serial(one, cfg);
  pmt::nn::Gpt<double, Kokkos::OpenMP, pmt::comm::Self> omp(one, cfg);
  auto a          = batch<pmt::nn::Gpt<double, Kokkos::Serial, pmt::comm::Self>::Ids>(0, 0, 2);
  const double ls = serial.forward_backward(Kokkos::Serial(), a.ids, a.targets, a.B, a.T, 16.0);
  const double lo = omp.forward_backward(Kokkos::OpenMP(), a.ids, a.targets, a.B, a.T, 16.0);
  Kokkos::fence();
  CHECK(std::abs(ls - lo) <= 1e-12 * std::abs(ls));
  auto ps      = serial.parameters();
  auto po      = omp.parameters();
  double worst = 0;
  for (std::size_t i = 0; i < ps.size(); ++i)
    for (std::size_t k = 0; k < ps[i]->size(); ++k) worst = std::max(worst, std::abs(ps[i]->grad(k) - po[i]->grad(k)));
  CHECK(worst <= 1e-12);
#else
  SKIP("needs both Kokkos::Serial and Kokkos::OpenMP");
#endif
}
