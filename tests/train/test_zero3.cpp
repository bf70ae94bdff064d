// SPDX-License-Identifier: Apache-2.0
// ZeRO-3 (optim::Zero3AdamW: parameters sharded over dp, gathered block by block) against one rank:
// - dp = np, and with np = 4 dp 2 x tp 2, dp 2 x pp 2 and hybrid sharding (shards of 2, replicated
//   twice), each with prefetch off, 1 and 2 units ahead: the losses and gradient norms of 4 steps
//   of two microbatches equal plain AdamW's on one rank with the whole batch (fp64: 1e-12; the
//   dp sums' order differs), and with dp only the gathered parameters do too.
// - Between steps a rank holds 1/dp of every parameter (values and gradients empty), its state is
//   4 P / S values, and with prefetch on the later steps' gathers are started ahead.
// - A ZeRO-3 checkpoint (each rank's row slices, nothing gathered) resumes bit for bit on the same
//   layout, and plain AdamW on one rank and (np = 4) ZeRO-3 on dp 2 x tp 2 resume it; a checkpoint
//   of plain AdamW on one rank resumes in ZeRO-3 on dp = np.
// - Traced, a prefetched gather overlaps the use of the block before it; without prefetch none does.
// - A shard size that does not divide dp is refused by name.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "../comm/comm_test.hpp"
#include "pmt/io/checkpoint.hpp"
#include "pmt/nn/gpt.hpp"
#include "pmt/optim/optimizers.hpp"
#include "pmt/optim/zero3.hpp"
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
const pmt::nn::GptConfig cfg{V, /*context=*/8, /*layers=*/4, /*width=*/32, /*heads=*/4, /*seed=*/23};
const pmt::optim::AdamWOptions hyper{0.9, 0.95, 1e-8, 0.1};

using Model = pmt::nn::Gpt<double, Host, Backend>;
using Ids   = typename Model::Ids;
using Zero3 = pmt::optim::Zero3AdamW<double, Host, Backend>;
using Plain = pmt::optim::AdamW<double, Host>;

/// Step `step`'s microbatches of dp rank `r` of `dp`: two halves of its sequences.
std::vector<pmt::train::Microbatch<Ids>> microbatches(int step, int r, int dp) {
  const std::size_t B = B_global / static_cast<std::size_t>(dp), first = B * static_cast<std::size_t>(r);
  return {pmt::test::synthetic_batch<Ids>(step, first, B / 2, Tn, V),
          pmt::test::synthetic_batch<Ids>(step, first + B / 2, B - B / 2, Tn, V)};
}

struct Run {
  std::vector<double> losses, norms;
};

Run one_rank(int steps) {
  const auto& w = pmt::test::world();
  pmt::Mesh<Backend> one(w.split(w.rank(), 0), pmt::MeshShape{});
  Model model(one, cfg);
  Plain opt(model.parameters(), hyper);
  pmt::train::Trainer<Model, Plain, Host, Backend> tr(one, model, opt);
  Run run;
  for (int step = 0; step < steps; ++step) {
    std::vector<pmt::train::Microbatch<Ids>> all;
    for (int r = 0; r < 4; ++r)
      for (auto& mb : microbatches(step, r, 4)) all.push_back(mb);
    run.losses.push_back(tr.step(all, {pmt::test::valid_targets(step, B_global, Tn, V), 3e-3, 0.5}));
    run.norms.push_back(tr.last_grad_norm());
  }
  return run;
}

}  // namespace

TEST_CASE("ZeRO-3 equals one rank on dp, dp x tp, dp x pp and hybrid sharding, with and without prefetch",
          "[train][zero][zero3][mpi]") {
  const auto& w       = pmt::test::world();
  const int n         = w.size();
  constexpr int steps = 4;
  const Run ref       = one_rank(steps);
  struct Layout {
    int dp, tp, pp, shard;
  };
  std::vector<Layout> layouts{{n, 1, 1, 0}};
  if (n == 4) layouts.insert(layouts.end(), {{2, 2, 1, 0}, {2, 1, 2, 0}, {4, 1, 1, 2}});
  for (const Layout l : layouts)
    for (std::size_t prefetch : {0, 1, 2}) {
      DYNAMIC_SECTION("dp " << l.dp << " x tp " << l.tp << " x pp " << l.pp << ", shard size " << l.shard
                            << ", prefetch " << prefetch) {
        pmt::Mesh<Backend> mesh(w, pmt::MeshShape{l.dp, l.tp, l.pp});
        Model model(mesh, cfg);
        std::size_t P = 0;
        for (auto* p : model.parameters()) P += p->size();
        std::optional<pmt::comm::Communicator<Backend>> pp;
        if (l.pp > 1) pp = mesh.comm(pmt::Axis::pp);
        Zero3 opt(model.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp), pp,
                  model.tied_parameters(), pmt::optim::Zero3Options{prefetch, l.shard});
        pmt::train::Trainer<Model, Zero3, Host, Backend> tr(mesh, model, opt);
        const int r  = mesh.coord(pmt::Axis::dp);
        double worst = 0, worst_norm = 0;
        for (int step = 0; step < steps; ++step) {
          const double loss =
              tr.step(microbatches(step, r, l.dp), {pmt::test::valid_targets(step, B_global, Tn, V), 3e-3, 0.5});
          worst      = std::max(worst, std::abs(loss - ref.losses[std::size_t(step)]) / ref.losses[std::size_t(step)]);
          worst_norm = std::max(
              worst_norm, std::abs(tr.last_grad_norm() - ref.norms[std::size_t(step)]) / ref.norms[std::size_t(step)]);
        }
        // between steps: nothing gathered, every size still known, 1/S of the state
        bool sharded        = true;
        std::size_t P_after = 0;
        for (auto* p : model.parameters()) {
          sharded = sharded && p->dp_sharded && p->value.data() == nullptr && p->grad.data() == nullptr;
          P_after += p->size();
        }
        const std::size_t S = static_cast<std::size_t>(l.shard > 0 ? l.shard : l.dp);
        const bool small    = opt.state_bytes() * S <= 4 * (P + model.parameters().size() * S) * sizeof(double);
        const bool ahead    = prefetch == 0 ? opt.prefetched() == 0 : opt.prefetched() > 0;
        INFO("losses " << worst << ", norms " << worst_norm << "; state " << opt.state_bytes() << " B for P = " << P
                       << ", prefetched " << opt.prefetched() << " of " << opt.gathers() << " gathers, units "
                       << opt.units() << ", peak gathered " << opt.peak_gathered_bytes() << " B");
        CHECK(pmt::test::all_ranks(worst <= 1e-12 && worst_norm <= 1e-11));
        CHECK(pmt::test::all_ranks(sharded && P_after == P && small && ahead));
        // a block at a time: the gathered values and gradients stay well below the model's
        if (l.tp == 1 && l.pp == 1) CHECK(pmt::test::all_ranks(opt.peak_gathered_bytes() < 2 * P * sizeof(double)));
      }
    }
}

TEST_CASE("ZeRO-3's gathered parameters equal one rank's after the same steps", "[train][zero][zero3][mpi]") {
  const auto& w = pmt::test::world();
  const int dp  = w.size();
  pmt::Mesh<Backend> mesh(w, pmt::MeshShape{dp, 1, 1});
  pmt::Mesh<Backend> one(w.split(w.rank(), 0), pmt::MeshShape{});
  Model model(mesh, cfg), whole(one, cfg);
  Zero3 opt(model.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp));
  Plain whole_opt(whole.parameters(), hyper);
  pmt::train::Trainer<Model, Zero3, Host, Backend> tr(mesh, model, opt);
  pmt::train::Trainer<Model, Plain, Host, Backend> whole_tr(one, whole, whole_opt);
  for (int step = 0; step < 3; ++step) {
    const pmt::train::StepOptions o{pmt::test::valid_targets(step, B_global, Tn, V), 3e-3, 0.5};
    std::vector<pmt::train::Microbatch<Ids>> all;
    for (int r = 0; r < 4; ++r)
      for (auto& mb : microbatches(step, r, 4)) all.push_back(mb);
    whole_tr.step(all, o);
    tr.step(microbatches(step, w.rank(), dp), o);
  }
  opt.gather_all();
  auto pa = model.parameters(), pb = whole.parameters();
  double worst = 0;
  for (std::size_t i = 0; i < pa.size(); ++i)
    for (std::size_t k = 0; k < pa[i]->size(); ++k)
      worst = std::max(worst, std::abs(pa[i]->value(k) - pb[i]->value(k)) / std::max(std::abs(pb[i]->value(k)), 1e-3));
  opt.release_all();
  INFO("largest relative parameter difference " << worst);
  CHECK(pmt::test::all_ranks(worst <= 1e-10 && pa[0]->value.data() == nullptr));
}

TEST_CASE("ZeRO-3's trace: a prefetched gather overlaps the use of the block before; without prefetch none does",
          "[train][zero][zero3][trace][mpi]") {
  const auto& w = pmt::test::world();
  const int dp  = w.size();
  auto& rec     = pmt::TraceRecorder::instance();
  for (std::size_t prefetch : {0, 1}) {
    pmt::Mesh<Backend> mesh(w, pmt::MeshShape{dp, 1, 1});
    Model model(mesh, cfg);
    Zero3 opt(model.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp), std::nullopt, {},
              pmt::optim::Zero3Options{prefetch, 0});
    pmt::train::Trainer<Model, Zero3, Host, Backend> tr(mesh, model, opt);
    tr.step(microbatches(0, w.rank(), dp), {pmt::test::valid_targets(0, B_global, Tn, V), 3e-3, 0.5});
    rec.clear();
    rec.enable();
    tr.step(microbatches(1, w.rank(), dp), {pmt::test::valid_targets(1, B_global, Tn, V), 3e-3, 0.5});
    rec.enable(false);
    std::vector<pmt::TraceEvent> gathers, uses;
    for (const auto& e : rec.events()) {
      if (e.name.rfind("zero3 gather ", 0) == 0 && e.track == pmt::Track::Collective) gathers.push_back(e);
      if (e.name.rfind("zero3 uses ", 0) == 0 && e.track == pmt::Track::Compute) uses.push_back(e);
    }
    rec.clear();
    std::size_t overlapping = 0;  // a gather running while another unit is in use
    for (const auto& g : gathers)
      for (const auto& u : uses)
        if (g.name.substr(13) != u.name.substr(11) && g.begin < u.end && g.end > u.begin) {
          ++overlapping;
          break;
        }
    INFO("prefetch " << prefetch << ": " << gathers.size() << " gathers, " << uses.size() << " uses, " << overlapping
                     << " gathers overlap another unit's use");
    const bool ok = !gathers.empty() && uses.size() >= gathers.size() &&
                    (prefetch == 0 ? overlapping == 0 : overlapping > gathers.size() / 2);
    CHECK(pmt::test::all_ranks(ok));
  }
}

TEST_CASE("ZeRO-3 refuses a shard size that does not divide dp", "[train][zero][zero3][mpi]") {
  const auto& w = pmt::test::world();
  pmt::Mesh<Backend> mesh(w, pmt::MeshShape{w.size(), 1, 1});
  Model model(mesh, cfg);
  CHECK_THROWS_WITH(Zero3(model.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp), std::nullopt,
                          {}, pmt::optim::Zero3Options{1, w.size() + 1}),
                    Catch::Matchers::ContainsSubstring("shard_size " + std::to_string(w.size() + 1) +
                                                       " does not divide the dp size"));
}

TEST_CASE("a ZeRO-3 checkpoint saves each rank's slices and resumes on one rank, on dp x tp and back",
          "[train][zero][zero3][checkpoint][mpi]") {
  const auto& w          = pmt::test::world();
  const int dp           = w.size();
  const std::string dir  = pmt::test::shared_temp_path(w, "pmt-test-zero3-checkpoint");
  const std::string back = dir + "-back";
  pmt::Mesh<Backend> mesh(w, pmt::MeshShape{dp, 1, 1});
  pmt::Mesh<Backend> one(w.split(w.rank(), 0), pmt::MeshShape{});
  const auto options = [](int step) {
    return pmt::train::StepOptions{pmt::test::valid_targets(step, B_global, Tn, V), 3e-3, 0.5};
  };
  const auto whole_batch = [](int step) {
    std::vector<pmt::train::Microbatch<Ids>> all;
    for (int r = 0; r < 4; ++r)
      for (auto& mb : microbatches(step, r, 4)) all.push_back(mb);
    return all;
  };
  pmt::io::CheckpointInfo info;
  info.step                = 3;
  info.model               = "test gpt";
  pmt::nn::GptConfig other = cfg;
  other.seed               = cfg.seed + 1;  // a checkpoint must overwrite every value

  // 6 steps straight, saved after the third
  Model straight(mesh, cfg);
  Zero3 opt(straight.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp));
  pmt::train::Trainer<Model, Zero3, Host, Backend> tr(mesh, straight, opt);
  std::vector<double> losses;
  for (int step = 0; step < 6; ++step) {
    losses.push_back(tr.step(microbatches(step, w.rank(), dp), options(step)));
    if (step == 2) pmt::io::save_checkpoint(dir, mesh, opt, info);
  }

  // the same layout: bit for bit
  {
    Model resumed(mesh, other);
    Zero3 resumed_opt(resumed.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp));
    const auto got = pmt::io::load_checkpoint(pmt::io::latest_checkpoint(dir), mesh, resumed_opt, info.model);
    pmt::train::Trainer<Model, Zero3, Host, Backend> resumed_tr(mesh, resumed, resumed_opt);
    bool same = got.step == 3 && resumed_opt.steps() == 3;
    for (int step = 3; step < 6; ++step)
      same = resumed_tr.step(microbatches(step, w.rank(), dp), options(step)) == losses[std::size_t(step)] && same;
    CHECK(pmt::test::all_ranks(same));
  }

  // plain AdamW on one rank: the same numbers within 1e-10; it saves after its fourth step
  std::vector<double> whole_losses(6, 0.0);
  double worst = 0;
  {
    Model whole(one, other);
    Plain whole_opt(whole.parameters(), hyper);
    pmt::io::load_checkpoint(pmt::io::latest_checkpoint(dir), one, whole_opt, info.model);
    pmt::train::Trainer<Model, Plain, Host, Backend> whole_tr(one, whole, whole_opt);
    for (int step = 3; step < 6; ++step) {
      whole_losses[std::size_t(step)] = whole_tr.step(whole_batch(step), options(step));
      worst                           = std::max(
                                    worst, std::abs(whole_losses[std::size_t(step)] - losses[std::size_t(step)]) / losses[std::size_t(step)]);
      if (step == 3 && w.rank() == 0) {  // one rank's own checkpoint, read back by all
        pmt::io::CheckpointInfo at4 = info;
        at4.step                    = 4;
        pmt::io::save_checkpoint(back, one, whole_opt, at4);
      }
    }
  }
  INFO("plain AdamW on one rank after the ZeRO-3 checkpoint: " << worst);
  CHECK(pmt::test::all_ranks(worst <= 1e-10));
  pmt::comm::barrier(w);

  // ZeRO-3 on dp = np from the one-rank checkpoint
  {
    Model resumed(mesh, other);
    Zero3 resumed_opt(resumed.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp));
    pmt::io::load_checkpoint(pmt::io::latest_checkpoint(back), mesh, resumed_opt, info.model);
    pmt::train::Trainer<Model, Zero3, Host, Backend> resumed_tr(mesh, resumed, resumed_opt);
    double d = 0;
    for (int step = 4; step < 6; ++step)
      d = std::max(d, std::abs(resumed_tr.step(microbatches(step, w.rank(), dp), options(step)) -
                               whole_losses[std::size_t(step)]) /
                          whole_losses[std::size_t(step)]);
    INFO("ZeRO-3 on dp " << dp << " after the one-rank checkpoint: " << d);
    CHECK(pmt::test::all_ranks(d <= 1e-10 && resumed_opt.steps() == 6));
  }

  // ZeRO-3 on dp 2 x tp 2 (np = 4): another cut of every parameter
  if (dp == 4) {
    pmt::Mesh<Backend> mixed(w, pmt::MeshShape{2, 2, 1});
    Model resumed(mixed, other);
    Zero3 resumed_opt(resumed.parameters(), hyper, mixed.comm(pmt::Axis::dp), mixed.comm(pmt::Axis::tp));
    pmt::io::load_checkpoint(pmt::io::latest_checkpoint(dir), mixed, resumed_opt, info.model);
    pmt::train::Trainer<Model, Zero3, Host, Backend> resumed_tr(mixed, resumed, resumed_opt);
    double d = 0;
    for (int step = 3; step < 6; ++step)
      d = std::max(d, std::abs(resumed_tr.step(microbatches(step, mixed.coord(pmt::Axis::dp), 2), options(step)) -
                               losses[std::size_t(step)]) /
                          losses[std::size_t(step)]);
    INFO("ZeRO-3 on dp 2 x tp 2 after the ZeRO-3 checkpoint of dp 4: " << d);
    CHECK(pmt::test::all_ranks(d <= 1e-10));
  }

  pmt::comm::barrier(w);
  if (w.rank() == 0) std::filesystem::remove_all(dir), std::filesystem::remove_all(back);
}
