// SPDX-License-Identifier: Apache-2.0
// The data-parallel strategy concept (train/strategy.hpp):
// - a mode written by a user against the concept alone (the example of docs/design.md: the
//   gradients summed by one blocking all-reduce per parameter after backward) trains as
//   Synchronous does, on dp = np and on dp x pp;
// - each strategy's charge says what it shards and sends, and the planner costs each layout by
//   the charge of the strategy the Trainer runs for it;
// - every built-in strategy (all-reduce, all-reduce with bf16 compression, ZeRO-1, ZeRO-2,
//   LocalSgd, DiLoCo, bounded staleness) and the user's resumes from a checkpoint of its
//   state() bit for bit: the losses after the resume and the parameters at the end equal the
//   uninterrupted run's, on dp = np and, for compression and ZeRO-2, on dp x pp 2 (the tied LM
//   head's copy on the last stage keeps its own error-feedback residual).
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "../comm/comm_test.hpp"
#include "pmt/comm/collectives.hpp"
#include "pmt/io/checkpoint.hpp"
#include "pmt/nn/gpt.hpp"
#include "pmt/optim/optimizers.hpp"
#include "pmt/optim/zero.hpp"
#include "pmt/optim/zero2.hpp"
#include "pmt/plan/model.hpp"
#include "pmt/policy/hybrid.hpp"
#include "pmt/train/strategy.hpp"
#include "pmt/train/trainer.hpp"
#include "train_test.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

using Host    = Kokkos::DefaultHostExecutionSpace;
using Backend = pmt::test::World::backend;

// A user's data-parallel mode: a type with a nested strategy template. StrategyBase gives every
// hook its default (no dp communication, the tied and sequence-parallel sums after backward,
// clip and the optimizer's step); this mode adds one blocking all-reduce of each gradient.
struct BlockingAllReduce {
  template <class Model, class Optimizer, class Exec, class Backend>
  struct strategy : pmt::train::StrategyBase<Model, Optimizer, Exec, Backend> {
    using Base = pmt::train::StrategyBase<Model, Optimizer, Exec, Backend>;
    using Base::Base;
    static constexpr pmt::train::DpCharge charge{false, false, false, pmt::train::DpCharge::Gradients::all_reduce};
    void finish_grads() {
      for (auto* p : this->model().parameters())
        pmt::comm::all_reduce(this->mesh().comm(pmt::Axis::dp), this->exec(), p->grad);
      Base::finish_grads();  // the tied and sequence-parallel sums
    }
  };
};

namespace {

constexpr std::size_t V = 96, Tn = 8, B_global = 8;
const pmt::nn::GptConfig cfg{V, /*context=*/8, /*layers=*/2, /*width=*/32, /*heads=*/4, /*seed=*/23};
const pmt::optim::AdamWOptions hyper{0.9, 0.95, 1e-8, 0.1};

template <class Ids>
pmt::train::Microbatch<Ids> batch(int step, std::size_t first_seq, std::size_t B) {
  return pmt::test::synthetic_batch<Ids>(step, first_seq, B, Tn, V, /*ignore=*/false);
}

template <class Model>
using AdamW = pmt::optim::AdamW<typename Model::value_type, Host>;
template <class Model>
using Zero1 = pmt::optim::ZeroAdamW<typename Model::value_type, Host, Backend>;
template <class Model>
using Zero2 = pmt::optim::Zero2AdamW<typename Model::value_type, Host, Backend>;

/// The optimizer of type Opt over `model`'s parameters on `mesh`.
template <class Opt, class Model>
Opt make_optimizer(const pmt::Mesh<Backend>& mesh, Model& model) {
  const auto pp = mesh.degree(pmt::Axis::pp) > 1
                      ? std::optional<pmt::comm::Communicator<Backend>>(mesh.comm(pmt::Axis::pp))
                      : std::nullopt;
  if constexpr (std::is_same_v<Opt, Zero1<Model>>)
    return Opt(model.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp), pp);
  else if constexpr (std::is_same_v<Opt, Zero2<Model>>)
    return Opt(model.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp), pp,
               model.tied_parameters());
  else
    return Opt(model.parameters(), hyper);
}

/// Losses of `steps` steps of mode Mode (as a Hybrid's DataParallel<Mode>) on dp = np / pp x pp,
/// two microbatches per step.
template <class Mode>
std::vector<double> train(int pp, int steps) {
  using Model   = pmt::nn::Gpt<double, Host, Backend>;
  using Ids     = typename Model::Ids;
  using Policy  = pmt::Hybrid<pmt::DataParallel<Mode>, pmt::TensorSplit<>, pmt::Pipeline<>>;
  const auto& w = pmt::test::world();
  const int dp  = w.size() / pp;
  pmt::Mesh<Backend> mesh(w, pmt::MeshShape{dp, 1, pp});
  const std::size_t B     = B_global / static_cast<std::size_t>(dp);
  const std::size_t first = B * static_cast<std::size_t>(mesh.coord(pmt::Axis::dp));
  Model model(mesh, cfg);
  auto opt = make_optimizer<AdamW<Model>>(mesh, model);
  pmt::train::Trainer<Model, AdamW<Model>, Host, Backend, Policy> tr(mesh, model, opt);
  const pmt::train::StepOptions o{double(B_global * Tn), 3e-3, 1.0};
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step)
    losses.push_back(tr.step({batch<Ids>(step, first, B / 2), batch<Ids>(step, first + B / 2, B / 2)}, o));
  return losses;
}

/// Trains 6 steps of mode Mode with optimizer OptOf<Model> on dp = np / pp x pp (T = float or
/// double), saving with the Trainer's state() after step 2; resumes that checkpoint into a model
/// of other values and checks that the losses and the parameters continue bit for bit.
template <class T, class Mode, template <class> class OptOf>
bool resumes_bit_for_bit(const std::string& name, const pmt::train::TrainerOptions& options = {}, int pp = 1) {
  using Model   = pmt::nn::Gpt<T, Host, Backend>;
  using Ids     = typename Model::Ids;
  using Opt     = OptOf<Model>;
  using Tr      = pmt::train::Trainer<Model, Opt, Host, Backend, Mode>;
  const auto& w = pmt::test::world();
  const int dp  = w.size() / pp;
  pmt::Mesh<Backend> mesh(w, pmt::MeshShape{dp, 1, pp});
  const std::size_t B     = B_global / static_cast<std::size_t>(dp);
  const std::size_t first = B * static_cast<std::size_t>(mesh.coord(pmt::Axis::dp));
  const std::string dir   = pmt::test::shared_temp_path(w, "pmt-test-strategy-" + name);
  pmt::io::CheckpointInfo info;
  info.model = "test gpt";
  const pmt::train::StepOptions o{double(B_global * Tn), 3e-3, 0.5};
  constexpr int steps = 6, saved = 2;
  Model straight(mesh, cfg);
  Opt opt = make_optimizer<Opt>(mesh, straight);
  Tr tr(mesh, straight, opt, Host(), options);
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    losses.push_back(tr.step({batch<Ids>(step, first, B)}, o));
    info.step = step + 1;
    if (step == saved) pmt::io::save_checkpoint(dir, mesh, opt, info, tr.state());
  }
  pmt::nn::GptConfig other = cfg;
  other.seed               = cfg.seed + 1;  // the checkpoint must overwrite every value
  Model resumed(mesh, other);
  Opt resumed_opt = make_optimizer<Opt>(mesh, resumed);
  Tr resumed_tr(mesh, resumed, resumed_opt, Host(), options);
  const auto got = pmt::io::load_checkpoint(pmt::io::checkpoint_step_dir(dir, saved + 1), mesh, resumed_opt, info.model,
                                            resumed_tr.state());
  bool same      = got.step == saved + 1;
  for (int step = saved + 1; step < steps; ++step) {
    pmt::train::StepOptions at = o;
    at.step                    = step;  // the global step keeps a period's phase and Dropout's keys
    const double loss          = resumed_tr.step({batch<Ids>(step, first, B)}, at);
    same                       = same && loss == losses[std::size_t(step)];
  }
  const auto ps = straight.parameters(), qs = resumed.parameters();
  for (std::size_t i = 0; i < ps.size(); ++i)
    for (std::size_t k = 0; k < ps[i]->size(); ++k) same = same && ps[i]->value(k) == qs[i]->value(k);
  pmt::comm::barrier(w);
  if (w.rank() == 0) std::filesystem::remove_all(dir);
  return same;
}

}  // namespace

TEST_CASE("a user-written data-parallel mode trains as Synchronous does", "[train][strategy][mpi]") {
  const int np = pmt::test::world().size();
  for (int pp : {1, 2}) {
    if (np % pp != 0 || B_global % static_cast<std::size_t>(2 * (np / pp)) != 0) continue;
    const auto mine = train<BlockingAllReduce>(pp, 4), sync = train<pmt::Synchronous>(pp, 4);
    double worst = 0;
    for (std::size_t i = 0; i < mine.size(); ++i) worst = std::max(worst, std::abs(mine[i] - sync[i]) / sync[i]);
    INFO("pp " << pp << ": worst relative loss difference " << worst);
    CHECK(pmt::test::all_ranks(worst <= 1e-12));
  }
}

TEST_CASE("the strategy's charge says what it shards and what it sends", "[train][strategy]") {
  using Model = pmt::nn::Gpt<float, Host, Backend>;
  using G     = pmt::train::DpCharge::Gradients;
  using pmt::train::Trainer;
  STATIC_REQUIRE(Trainer<Model, AdamW<Model>, Host, Backend>::Strategy::charge.gradients == G::all_reduce);
  STATIC_REQUIRE(Trainer<Model, Zero1<Model>, Host, Backend>::Strategy::charge.shards_optimizer_state);
  STATIC_REQUIRE(!Trainer<Model, Zero1<Model>, Host, Backend>::Strategy::charge.shards_gradients);
  STATIC_REQUIRE(Trainer<Model, Zero2<Model>, Host, Backend>::Strategy::charge.shards_gradients);
  STATIC_REQUIRE(Trainer<Model, AdamW<Model>, Host, Backend, pmt::LocalSgd<4>>::Strategy::charge.averages_parameters);
  STATIC_REQUIRE(Trainer<Model, AdamW<Model>, Host, Backend, pmt::BoundedStaleness<1>>::Strategy::charge.delayed);
  STATIC_REQUIRE(Trainer<Model, AdamW<Model>, Host, Backend, BlockingAllReduce>::Strategy::charge.gradients ==
                 G::all_reduce);
  // the planner costs a layout by the charge of the strategy the Trainer runs for it
  const auto same = [](const pmt::train::DpCharge& a, const pmt::train::DpCharge& b) {
    return a.shards_optimizer_state == b.shards_optimizer_state && a.shards_gradients == b.shards_gradients &&
           a.shards_parameters == b.shards_parameters && a.gradients == b.gradients &&
           a.averages_parameters == b.averages_parameters && a.delayed == b.delayed;
  };
  using M = pmt::plan::DpMode;
  pmt::plan::Layout l;
  l.dp = 2;
  CHECK(same(pmt::plan::charge_of(l), Trainer<Model, AdamW<Model>, Host, Backend>::Strategy::charge));
  l.sync = {M::Bf16, 1};  // compression rides on the all-reduce strategy
  CHECK(same(pmt::plan::charge_of(l), Trainer<Model, AdamW<Model>, Host, Backend>::Strategy::charge));
  l.sync = {M::LocalSgd, 4};
  CHECK(same(pmt::plan::charge_of(l), Trainer<Model, AdamW<Model>, Host, Backend, pmt::LocalSgd<4>>::Strategy::charge));
  l.sync = {M::DiLoCo, 4};
  CHECK(same(pmt::plan::charge_of(l), Trainer<Model, AdamW<Model>, Host, Backend, pmt::DiLoCo<4>>::Strategy::charge));
  l.sync = {M::Stale, 1};
  CHECK(same(pmt::plan::charge_of(l),
             Trainer<Model, AdamW<Model>, Host, Backend, pmt::BoundedStaleness<1>>::Strategy::charge));
  l.sync = {};
  l.zero = 1;
  CHECK(same(pmt::plan::charge_of(l), Trainer<Model, Zero1<Model>, Host, Backend>::Strategy::charge));
  l.zero = 2;
  CHECK(same(pmt::plan::charge_of(l), Trainer<Model, Zero2<Model>, Host, Backend>::Strategy::charge));
  l.dp = 1, l.zero = 0;  // one replica: nothing over dp
  CHECK(same(pmt::plan::charge_of(l), pmt::train::DpCharge{}));
}

TEST_CASE("every data-parallel strategy resumes from its checkpoint bit for bit",
          "[train][strategy][checkpoint][mpi]") {
  if (B_global % static_cast<std::size_t>(pmt::test::world().size()) != 0) SKIP("the batch does not split");
  const pmt::parallel::GradSyncOptions packed{std::size_t(8) << 10, pmt::parallel::GradCompression::bf16};
  pmt::train::TrainerOptions period;
  period.period = 2;
  CHECK(resumes_bit_for_bit<float, pmt::Synchronous, AdamW>("all-reduce"));
  CHECK(resumes_bit_for_bit<float, pmt::Synchronous, AdamW>("bf16", packed));
  CHECK(resumes_bit_for_bit<float, pmt::Synchronous, Zero1>("zero1"));
  CHECK(resumes_bit_for_bit<float, pmt::Synchronous, Zero2>("zero2"));
  CHECK(resumes_bit_for_bit<double, pmt::LocalSgd<>, AdamW>("local", period));
  CHECK(resumes_bit_for_bit<double, pmt::DiLoCo<3>, AdamW>("diloco"));
  CHECK(resumes_bit_for_bit<double, pmt::BoundedStaleness<2>, AdamW>("stale"));
  CHECK(resumes_bit_for_bit<double, BlockingAllReduce, AdamW>("user"));
  if (pmt::test::world().size() % 2 == 0) {  // the tied LM head's copy on the last stage keeps its own residual
    CHECK(resumes_bit_for_bit<float, pmt::Synchronous, AdamW>("bf16-pp", packed, 2));
    CHECK(resumes_bit_for_bit<float, pmt::Synchronous, Zero2>("zero2-pp", {}, 2));
  }
}

TEST_CASE("a policy that does not fit the launch is refused with both numbers and the fix", "[train][strategy]") {
  using Catch::Matchers::ContainsSubstring;
  using Model   = pmt::nn::Gpt<double, Host, Backend>;
  const auto& w = pmt::test::world();
  const int n   = w.size();
  const pmt::nn::GptConfig four{V, 8, /*layers=*/4, 32, 4, 23};
  {  // every rank a pipeline stage, the policy fixed at 3 stages (np is 1, 2 or 4)
    pmt::Mesh<Backend> mesh(w, pmt::MeshShape{1, 1, n});
    Model model(mesh, four);
    AdamW<Model> opt(model.parameters(), hyper);
    using Policy = pmt::Hybrid<pmt::DataParallel<>, pmt::TensorSplit<>, pmt::Pipeline<3>>;
    using Tr     = pmt::train::Trainer<Model, AdamW<Model>, Host, Backend, Policy>;
    CHECK_THROWS_WITH(Tr(mesh, model, opt),
                      ContainsSubstring("Pipeline<3> needs pp 3 but the mesh has pp " + std::to_string(n)) &&
                          ContainsSubstring("launch 3 rank(s) (dp 1 x tp 1 x pp 3)"));
  }
  if (n > 1) {  // dp ranks, and no DataParallel in the policy
    pmt::Mesh<Backend> mesh(w, pmt::MeshShape{n, 1, 1});
    Model model(mesh, four);
    AdamW<Model> opt(model.parameters(), hyper);
    using Tr =
        pmt::train::Trainer<Model, AdamW<Model>, Host, Backend, pmt::Hybrid<pmt::TensorSplit<>, pmt::Pipeline<>>>;
    CHECK_THROWS_WITH(Tr(mesh, model, opt), ContainsSubstring("the mesh has dp " + std::to_string(n) +
                                                              " but the policy has no DataParallel<>") &&
                                                ContainsSubstring("launch 1 rank(s) so that dp is 1"));
  }
}
