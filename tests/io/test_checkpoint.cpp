// SPDX-License-Identifier: Apache-2.0
// Checkpoints of a model built from layers (not the Gpt, whose checkpoints train_gpt's end-to-end
// test covers): parameters are matched by name, so two parameters of one name are refused before
// anything is written, and a model whose parameters have names of their own, saved tp-split on
// np ranks, loads into the one-rank model with every layer's own values; a parameter holding nan
// is never saved (LATEST keeps naming the last good checkpoint).
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "../comm/comm_test.hpp"
#include "pmt/io/checkpoint.hpp"
#include "pmt/nn/activation.hpp"
#include "pmt/nn/chain.hpp"
#include "pmt/nn/linear.hpp"
#include "pmt/optim/optimizers.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

using Host    = Kokkos::DefaultHostExecutionSpace;
using Backend = pmt::test::World::backend;

namespace {

using Col = pmt::nn::Linear<double, pmt::TensorSplit<pmt::Col>, Host, Backend>;
using Row = pmt::nn::Linear<double, pmt::TensorSplit<pmt::Row>, Host, Backend>;
using Act = pmt::nn::Gelu<double, Host>;
// Two MLP blocks of the same shapes: Linear's default names repeat ("...<TensorSplit<Col>>::weight").
using TwoBlocks = pmt::nn::Chain<Col, Act, Row, Col, Act, Row>;

TwoBlocks make(const pmt::Mesh<Backend>& mesh, std::uint64_t seed) {
  const std::size_t d = 8, hidden = 16;
  return TwoBlocks(Col(mesh, d, hidden, {seed, 1}), Act(), Row(mesh, hidden, d, {seed, 2}),
                   Col(mesh, d, hidden, {seed, 3}), Act(), Row(mesh, hidden, d, {seed, 4}));
}

}  // namespace

TEST_CASE("a checkpoint refuses two parameters of one name and reshards a model with its own names",
          "[io][checkpoint][mpi]") {
  const auto& w = pmt::test::world();
  const int tp = w.size(), r = w.rank();
  pmt::Mesh<Backend> mesh(w, pmt::MeshShape{1, tp, 1});
  pmt::Mesh<Backend> one(w.split(r, 0), pmt::MeshShape{});
  const std::filesystem::path dir = pmt::test::shared_temp_path(w, "pmt-test-checkpoint");
  pmt::io::CheckpointInfo info;
  info.step  = 3;
  info.model = "two mlp blocks d=8 hidden=16";

  TwoBlocks model = make(mesh, 7);
  pmt::optim::AdamW<double, Host> opt(model.parameters(), {});
  // Every rank raises the same error, and no rank leaves a file behind.
  CHECK_THROWS_WITH(pmt::io::save_checkpoint(dir.string(), mesh, opt, info),
                    Catch::Matchers::ContainsSubstring("pmt::io::checkpoint: parameters 0 and 4 are both named "
                                                       "\"pmt::nn::Linear<TensorSplit<Col>>::weight\"; checkpoints "
                                                       "match parameters by name"));
  CHECK(pmt::test::all_ranks(!std::filesystem::exists(dir)));

  pmt::nn::name_parameters(model.parameters(), "net");
  pmt::io::save_checkpoint(dir.string(), mesh, opt, info);

  // Loaded on one rank into a model drawn from another seed: every parameter becomes the one-rank
  // model's of seed 7, bit for bit. With one name for both blocks, each block would get the same
  // values (whichever record came last).
  TwoBlocks whole = make(one, 8), ref = make(one, 7);
  pmt::nn::name_parameters(whole.parameters(), "net");
  pmt::optim::AdamW<double, Host> whole_opt(whole.parameters(), {});
  const auto got = pmt::io::load_checkpoint(pmt::io::latest_checkpoint(dir.string()), one, whole_opt, info.model);
  CHECK(got.step == 3);
  CHECK(got.layout.tp == tp);
  bool equal    = true;
  const auto ps = whole.parameters(), qs = ref.parameters();
  for (std::size_t k = 0; k < ps.size(); ++k)
    for (std::size_t i = 0; i < ps[k]->size(); ++i) equal = equal && ps[k]->value(i) == qs[k]->value(i);
  CHECK(pmt::test::all_ranks(equal));

  // A parameter holding nan (on the last rank only) is never saved: every rank raises, the
  // raising rank names it, and LATEST keeps naming step 3, which still verifies.
  if (r == w.size() - 1) model.parameters()[2]->value(0) = std::nan("");
  info.step    = 4;
  bool refused = false;
  try {
    pmt::io::save_checkpoint(dir.string(), mesh, opt, info);
  } catch (const pmt::IoError& e) {
    const std::string what = e.what();
    refused = r == w.size() - 1 ? what.find("refusing to save step 4: param/net.2 holds nan at element 0 on rank " +
                                            std::to_string(r)) != std::string::npos
                                : what.find("failed on 1 other rank(s)") != std::string::npos;
    UNSCOPED_INFO(what);
  }
  CHECK(pmt::test::all_ranks(refused));
  CHECK(pmt::test::all_ranks(pmt::io::latest_checkpoint(dir.string()) == (dir / "step-00000003").string()));
  CHECK(pmt::test::all_ranks(pmt::io::verify_checkpoint((dir / "step-00000003").string()) == 3));
  CHECK(pmt::test::all_ranks(pmt::io::checkpoint_steps(dir.string()) == std::vector<std::string>{"step-00000003"}));

  pmt::comm::barrier(w);
  if (r == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("Sgd checkpoints and weights-only checkpoints round-trip across layouts; optimizers do not mix",
          "[io][checkpoint][mpi]") {
  const auto& w = pmt::test::world();
  const int tp = w.size(), r = w.rank();
  pmt::Mesh<Backend> mesh(w, pmt::MeshShape{1, tp, 1});
  pmt::Mesh<Backend> one(w.split(r, 0), pmt::MeshShape{});
  const std::filesystem::path dir = pmt::test::shared_temp_path(w, "pmt-test-checkpoint-sgd");
  pmt::io::CheckpointInfo info;
  info.step        = 2;
  info.model       = "two mlp blocks d=8 hidden=16";
  const auto named = [](TwoBlocks m) {
    pmt::nn::name_parameters(m.parameters(), "net");
    return m;
  };
  // Sgd with momentum: two steps on made-up gradients, so the velocities are not zero
  TwoBlocks model = named(make(mesh, 7));
  pmt::optim::Sgd<double, Host> sgd(model.parameters(), {0.9, 0.01});
  // gradients keyed by the global element, so every layout applies the same update
  const auto global_grads = [](TwoBlocks& m) {
    for (auto* p : m.parameters()) {
      const auto g         = p->grad2d();
      const std::size_t r0 = p->slice.offset[0], c0 = p->local_shape.size() > 1 ? p->slice.offset[1] : 0;
      for (std::size_t a = 0; a < g.extent(0); ++a)
        for (std::size_t b = 0; b < g.extent(1); ++b) g(a, b) = std::sin(double(3 * (r0 + a) + 5 * (c0 + b)));
    }
  };
  for (int s = 0; s < 2; ++s) global_grads(model), sgd.step(Host(), 0.1);
  Host().fence();
  const std::string saved = pmt::io::save_checkpoint(dir.string(), mesh, sgd, info);

  // the one-rank twin: the same two steps, then a third; the resumed run's third step equals it
  TwoBlocks ref = named(make(one, 7));
  pmt::optim::Sgd<double, Host> ref_sgd(ref.parameters(), {0.9, 0.01});
  for (int s = 0; s < 3; ++s) global_grads(ref), ref_sgd.step(Host(), 0.1);
  TwoBlocks resumed = named(make(one, 8));
  pmt::optim::Sgd<double, Host> resumed_sgd(resumed.parameters(), {0.9, 0.01});
  pmt::io::load_checkpoint(saved, one, resumed_sgd, info.model);
  global_grads(resumed), resumed_sgd.step(Host(), 0.1);
  Host().fence();
  double worst  = 0;
  const auto ps = resumed.parameters(), qs = ref.parameters();
  for (std::size_t k = 0; k < ps.size(); ++k)
    for (std::size_t i = 0; i < ps[k]->size(); ++i)
      worst = std::max(worst, std::abs(ps[k]->value(i) - qs[k]->value(i)) / std::max(1e-3, std::abs(qs[k]->value(i))));
  UNSCOPED_INFO("resumed Sgd step against the uninterrupted one: " << worst);
  CHECK(pmt::test::all_ranks(worst <= 1e-14));  // without the velocities it is about 1e-1

  // an Sgd checkpoint does not load into AdamW (every rank raises), but its weights load anywhere
  TwoBlocks other = named(make(one, 9));
  pmt::optim::AdamW<double, Host> adam(other.parameters(), {});
  CHECK_THROWS_WITH(
      pmt::io::load_checkpoint(saved, one, adam, info.model),
      Catch::Matchers::ContainsSubstring("holds the state of optimizer \"sgd\"; this run's is \"adamw\""));
  pmt::io::load_weights(saved, one, other.parameters(), info.model);
  bool same     = true;
  const auto os = other.parameters();
  // the saved weights are model's after two steps: compare with a one-rank twin of two steps
  TwoBlocks two = named(make(one, 7));
  pmt::optim::Sgd<double, Host> two_sgd(two.parameters(), {0.9, 0.01});
  for (int s = 0; s < 2; ++s) global_grads(two), two_sgd.step(Host(), 0.1);
  Host().fence();
  const auto ts = two.parameters();
  for (std::size_t k = 0; k < os.size(); ++k)
    for (std::size_t i = 0; i < os[k]->size(); ++i) same = same && os[k]->value(i) == ts[k]->value(i);
  CHECK(pmt::test::all_ranks(same));

  // weights only: saved without any optimizer on tp ranks, loaded on one rank, bit for bit
  info.step                 = 5;
  const std::string weights = pmt::io::save_weights(dir.string(), mesh, model.parameters(), info);
  TwoBlocks fresh           = named(make(one, 10));
  const auto got            = pmt::io::load_weights(weights, one, fresh.parameters(), info.model);
  CHECK(got.step == 5);
  same          = true;
  const auto fs = fresh.parameters();
  for (std::size_t k = 0; k < fs.size(); ++k)
    for (std::size_t i = 0; i < fs[k]->size(); ++i) same = same && fs[k]->value(i) == ts[k]->value(i);
  CHECK(pmt::test::all_ranks(same));
  // ... and an optimizer that needs state refuses it
  pmt::optim::Sgd<double, Host> needs_state(fresh.parameters(), {});
  CHECK_THROWS_WITH(
      pmt::io::load_checkpoint(weights, one, needs_state, info.model),
      Catch::Matchers::ContainsSubstring("holds weights only, no optimizer state; this run's optimizer \"sgd\""));

  pmt::comm::barrier(w);
  if (r == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("the checkpoint's file-system calls agree with std::filesystem and remove links, not their targets", "[io]") {
  namespace fs = std::filesystem;
  if (pmt::world_rank() != 0) return;  // no collective here: every rank may return alone
  const fs::path root = fs::temp_directory_path() / ("pmt_fs_test_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const std::string deep = (root / "a" / "b" / "c").string();
  bool created           = false;
  CHECK(pmt::io::detail::create_directories(deep, &created));
  CHECK(created);
  CHECK(fs::is_directory(deep));
  CHECK(pmt::io::detail::create_directories((root / "a" / "c2").string()));
  std::ofstream(root / "a" / "f.txt") << "12345";
  const fs::path outside = fs::temp_directory_path() / ("pmt_fs_target_" + std::to_string(::getpid()));
  fs::create_directories(outside);
  std::ofstream(outside / "keep.txt") << "x";
  fs::create_directory_symlink(outside, root / "a" / "link");
  std::uint64_t size = 0;
  CHECK((pmt::io::detail::file_size((root / "a" / "f.txt").string(), size) && size == 5));
  CHECK(pmt::io::detail::is_regular_file((root / "a" / "f.txt").string()));
  CHECK_FALSE(pmt::io::detail::is_regular_file((root / "a").string()));
  CHECK(pmt::io::detail::is_directory((root / "a").string()));
  auto names = pmt::io::detail::list_directory((root / "a").string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"b", "c2", "f.txt", "link"});
  CHECK(pmt::io::detail::remove_all(root.string()));
  CHECK_FALSE(fs::exists(root));
  CHECK(fs::exists(outside / "keep.txt"));            // the link went, its target stayed
  CHECK(pmt::io::detail::remove_all(root.string()));  // nothing there: nothing left
  fs::remove_all(outside);
}
