// SPDX-License-Identifier: Apache-2.0
// A user's own model with dropout, written the way docs/tutorial.md teaches: each dp rank builds
// its microbatches as Batch{x, t, n} and calls Trainer::step with a learning rate, nothing else
// (no row index, no step number). The library keys the dropout masks itself, so:
//   - every layout of the world (dp, tp, pp and their mixes) gives the one-rank losses and
//     parameters over 20 steps (double, relative 1e-12);
//   - Trainer::evaluate runs in evaluation mode on every layout (Dropout the identity, a
//     forward-only pipeline): the one-rank value, the dropout-free loss, the same twice;
//   - StagedModel::predict gives the one-rank output on every rank of every layout, pipelines
//     with one and two chunks per stage included;
//   - a run stopped after 4 steps, saved (save_checkpoint of the optimizer, as the tutorial
//     does) and resumed in fresh objects, with the process's measured choices forgotten as in a
//     new process, continues with the uninterrupted run's losses bit for bit, double and float.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include "../comm/comm_test.hpp"
#include "../nn/model_test.hpp"
#include "pmt/core/measured_choice.hpp"
#include "pmt/io/checkpoint.hpp"
#include "pmt/nn/activation.hpp"
#include "pmt/nn/chain.hpp"
#include "pmt/nn/dropout.hpp"
#include "pmt/nn/linear.hpp"
#include "pmt/nn/loss.hpp"
#include "pmt/nn/staged_model.hpp"
#include "pmt/optim/optimizers.hpp"
#include "pmt/train/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <typeinfo>
#include <vector>

using Host    = Kokkos::DefaultHostExecutionSpace;
using Backend = pmt::test::World::backend;

namespace {

constexpr std::size_t d = 8, hidden = 16, N = 32;  // N: the global batch
constexpr std::uint64_t seed = 2027;

template <class T>
struct Own {
  template <class P>
  using Linear = pmt::nn::Linear<T, P, Host, Backend>;
  using Gelu   = pmt::nn::Gelu<T, Host>;
  using Net = pmt::nn::Chain<Linear<pmt::TensorSplit<pmt::Col>>, Gelu, pmt::nn::Dropout<T, Host, pmt::Sharded, Backend>,
                             Linear<pmt::TensorSplit<pmt::Row>>, Gelu,
                             pmt::nn::Dropout<T, Host, pmt::Replicated, Backend>, Linear<pmt::Replicate>>;
  using Model  = pmt::nn::StagedModel<Net, pmt::nn::MseLoss<T, Host>>;
  using Batch  = typename Model::Batch;
  using Act    = pmt::Tensor<T, 2, Host>;
  using Opt    = pmt::optim::AdamW<T, Host>;
  using Policy = pmt::Hybrid<pmt::DataParallel<>, pmt::TensorSplit<>, pmt::Pipeline<>>;

  pmt::Mesh<Backend> mesh;
  Model model;
  Opt opt;
  pmt::train::Trainer<Model, Opt, Host, Backend, Policy> trainer;

  static Net net(const pmt::Mesh<Backend>& m) {
    const pmt::nn::LinearOptions init{true, 0.3};
    const auto key = [](std::uint32_t s) { return pmt::RngKey{seed, s}; };
    return Net(Linear<pmt::TensorSplit<pmt::Col>>(m, d, hidden, key(1), init), Gelu(),
               pmt::nn::Dropout<T, Host, pmt::Sharded, Backend>(m, 0.25, key(11)),
               Linear<pmt::TensorSplit<pmt::Row>>(m, hidden, d, key(2), init), Gelu(),
               pmt::nn::Dropout<T, Host, pmt::Replicated, Backend>(m, 0.125, key(12)),
               Linear<pmt::Replicate>(m, d, 1, key(3), init));
  }
  explicit Own(const pmt::Mesh<Backend>& m, int chunks = 1)
      : mesh(m),
        model(mesh, net(mesh), {}, pmt::nn::StagedOptions{{}, chunks, "own"}),
        opt(model.parameters(), pmt::optim::AdamWOptions{0.9, 0.95, 1e-8, 0.1}),
        trainer(mesh, model, opt) {}

  /// Rows [row0, row0 + n) of step `step`'s global batch, built as the tutorial builds them.
  static Batch batch(int step, std::size_t row0, std::size_t n) {
    Batch b{Act("x", n, d), Act("t", n, 1), n};
    pmt::GlobalSlice rows;
    rows.extent[0] = N, rows.extent[1] = d, rows.offset[0] = row0;
    pmt::fill_normal(Host(), b.input, pmt::RngKey{seed, 1000u + static_cast<std::uint32_t>(step)}, 0.0, 1.0, rows);
    Host().fence();
    for (std::size_t i = 0; i < n; ++i)
      b.target(i, 0) = static_cast<T>(std::sin(b.input(i, 0) + b.input(i, 1)) + 0.5 * b.input(i, 2) * b.input(i, 3));
    return b;
  }
  /// This dp rank's rows of step `step`, in two microbatches (one when it holds a single row).
  std::vector<Batch> rows_of_step(int step) const {
    const auto dp       = static_cast<std::size_t>(mesh.degree(pmt::Axis::dp));
    const std::size_t n = N / dp, first = n * static_cast<std::size_t>(mesh.coord(pmt::Axis::dp));
    const std::size_t m = std::min<std::size_t>(2, n), per = n / m;
    std::vector<Batch> mbs;
    for (std::size_t i = 0; i < m; ++i) mbs.push_back(batch(step, first + i * per, per));
    return mbs;
  }
  double step(int s) { return trainer.step(rows_of_step(s), {double(N), 3e-3, 1.0}); }
  double evaluate(int s) { return trainer.evaluate(rows_of_step(s), double(N)); }
};

pmt::Mesh<Backend> alone() {
  const auto& w = pmt::test::world();
  return pmt::Mesh<Backend>(w.split(w.rank(), 0), pmt::MeshShape{});
}

double relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-300); }

}  // namespace

TEST_CASE("a user's model with dropout, as the tutorial writes it, equals one rank on every layout",
          "[train][own_model][dropout][mpi]") {
  using O         = Own<double>;
  constexpr int S = 20;
  const int n     = pmt::test::world().size();
  O one(alone());  // the one-rank run on the whole batch, on every rank
  std::vector<double> ref;
  for (int s = 0; s < S; ++s) ref.push_back(one.step(s));
  std::map<std::string, pmt::Parameter<double, Host>*> params;
  for (auto* p : one.model.parameters()) params[p->name] = p;
  const double ref_eval = one.evaluate(S);
  // evaluation is the dropout-free loss: the one-rank model's prediction, scored by hand
  {
    const auto b = O::batch(S, 0, N);
    const auto y = one.model.predict(Host(), b.input);
    double sum   = 0;
    for (std::size_t i = 0; i < N; ++i) sum += (y(i, 0) - b.target(i, 0)) * (y(i, 0) - b.target(i, 0)) / double(N);
    CHECK(relative(ref_eval, sum) <= 1e-14);
    CHECK(relative(one.evaluate(S), ref_eval) == 0);
  }
  for (int pp = 1; pp <= std::min(n, 4); pp *= 2)
    for (int dp = 1; dp <= n / pp; dp *= 2) {
      const int tp = n / pp / dp;
      DYNAMIC_SECTION("dp " << dp << " x tp " << tp << " x pp " << pp) {
        O mine(pmt::Mesh<Backend>(pmt::test::world(), pmt::MeshShape{dp, tp, pp}));
        double worst_loss = 0, worst_param = 0;
        for (int s = 0; s < S; ++s) worst_loss = std::max(worst_loss, relative(mine.step(s), ref[std::size_t(s)]));
        bool named = true;
        for (auto* p : mine.model.parameters()) {
          const auto it = params.find(p->name);
          named         = named && it != params.end();
          if (it != params.end())
            worst_param = std::max(worst_param, pmt::test::shard_norm_error(*p, *it->second, 1e-6));
        }
        const double e1 = mine.evaluate(S), e2 = mine.evaluate(S);
        UNSCOPED_INFO("rank " << pmt::test::world().rank() << ": worst loss " << worst_loss << ", worst parameter "
                              << worst_param << ", evaluation " << e1 << " (one rank " << ref_eval << ")");
        CHECK(pmt::test::all_ranks(named && worst_loss <= 1e-12 && worst_param <= 1e-12));
        CHECK(pmt::test::all_ranks(relative(e1, ref_eval) <= 1e-12 && e1 == e2));
      }
    }
}

TEST_CASE("predict gives the one-rank output on every rank of every layout", "[train][own_model][predict][mpi]") {
  using O     = Own<double>;
  const int n = pmt::test::world().size();
  O one(alone());
  const auto b   = O::batch(0, 0, N);
  const auto ref = one.model.predict(Host(), b.input);
  REQUIRE(ref.extent(0) == N);
  for (int pp = 1; pp <= std::min(n, 4); pp *= 2)
    for (int chunks = 1; chunks <= 2 && pp * chunks <= 7; ++chunks) {
      const int tp = n / pp;
      DYNAMIC_SECTION("tp " << tp << " x pp " << pp << ", " << chunks << " chunk(s) per stage") {
        O mine(pmt::Mesh<Backend>(pmt::test::world(), pmt::MeshShape{1, tp, pp}), chunks);
        const auto y = mine.model.predict(Host(), b.input), again = mine.model.predict(Host(), b.input);
        double worst = y.extent(0) == N && y.extent(1) == 1 ? 0.0 : 1.0;
        for (std::size_t i = 0; i < N && worst < 1; ++i) {
          worst = std::max(worst, relative(y(i, 0), ref(i, 0)));
          if (again(i, 0) != y(i, 0)) worst = 1;
        }
        UNSCOPED_INFO("rank " << pmt::test::world().rank() << ": worst relative difference " << worst);
        CHECK(pmt::test::all_ranks(worst <= 1e-13));
      }
    }
}

TEMPLATE_TEST_CASE("a run with dropout resumed from a checkpoint continues bit for bit",
                   "[train][own_model][resume][mpi]", double, float) {
  using O              = Own<TestType>;
  const auto& w        = pmt::test::world();
  const std::string ck = pmt::test::shared_temp_path(w, std::string("pmt-own-resume-") + typeid(TestType).name());
  constexpr int S = 8, stop = 4;
  const pmt::MeshShape layout{w.size(), 1, 1};  // data parallel over the world
  std::vector<double> straight;
  {
    O run(pmt::Mesh<Backend>(w, layout));
    for (int s = 0; s < S; ++s) straight.push_back(run.step(s));
  }
  pmt::io::CheckpointInfo info;
  info.step  = stop;
  info.model = "own";
  std::string saved;
  {
    O first(pmt::Mesh<Backend>(w, layout));
    for (int s = 0; s < stop; ++s) CHECK(first.step(s) == straight[std::size_t(s)]);
    saved = pmt::io::save_checkpoint(ck, first.mesh, first.opt, info);
  }
  pmt::clear_measured_choices();  // as in a new process: only the checkpoint knows the paths taken
  O resumed(pmt::Mesh<Backend>(w, layout));
  pmt::io::load_checkpoint(saved, resumed.mesh, resumed.opt, info.model);
  CHECK(resumed.trainer.steps() == stop);
  bool same = true;
  for (int s = stop; s < S; ++s) {
    const double l = resumed.step(s);
    UNSCOPED_INFO("step " << s << ": resumed " << l << ", straight " << straight[std::size_t(s)]);
    same = same && l == straight[std::size_t(s)];
  }
  CHECK(pmt::test::all_ranks(same));
  if (w.rank() == 0) std::filesystem::remove_all(ck);
}
