// SPDX-License-Identifier: Apache-2.0
// Data parallelism with less communication, against its references:
// - bf16 gradient compression with error feedback: what a rank sends over K steps adds up to the
//   K gradients exactly (the residual carries what rounding drops); a training run stays within a
//   stated tolerance of the uncompressed one on dp = np and dp 2 x tp 2 while sending half the
//   bytes; the residual survives a checkpoint bit for bit.
// - DiLoCo<H>: equals a serial simulation of its dp replicas on one rank (inner AdamW, then the
//   average and the Nesterov outer step), on dp = np and dp 2 x tp 2; with outer lr 1, no
//   momentum, H = 1 and plain SGD it is synchronous data parallelism; its outer state survives a
//   checkpoint bit for bit.
// - BoundedStaleness<S>: equals one rank whose gradients are applied S steps late (S = 0 and 2, on
//   dp = np and dp 2 x tp 2); the schedule applies nothing before step S and then sums exactly S
//   steps old; a checkpoint with sums in flight resumes bit for bit.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "../comm/comm_test.hpp"
#include "../nn/model_test.hpp"
#include "pmt/io/checkpoint.hpp"
#include "pmt/nn/gpt.hpp"
#include "pmt/nn/linear.hpp"
#include "pmt/optim/optimizers.hpp"
#include "pmt/parallel/grad_sync.hpp"
#include "pmt/train/trainer.hpp"
#include "train_test.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <deque>
#include <filesystem>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

using Host    = Kokkos::DefaultHostExecutionSpace;
using Backend = pmt::test::World::backend;

namespace {

constexpr std::size_t V = 96, Tn = 8, B_global = 8;
const pmt::nn::GptConfig cfg{V, /*context=*/8, /*layers=*/1, /*width=*/32, /*heads=*/4, /*seed=*/17};
const pmt::optim::AdamWOptions hyper{0.9, 0.95, 1e-8, 0.1};

template <class Ids>
pmt::train::Microbatch<Ids> batch(int step, std::size_t first_seq, std::size_t B) {
  return pmt::test::synthetic_batch<Ids>(step, first_seq, B, Tn, V, /*ignore=*/false);
}

/// The largest norm-wise error of a layout's parameter shards against whole parameters.
template <class P>
double worst_shard_error(const std::vector<P*>& shards, const std::vector<P*>& whole) {
  double largest = 0, worst = 0;
  for (auto* p : whole)
    for (std::size_t i = 0; i < p->size(); ++i) largest = std::max(largest, std::abs(double(p->value(i))));
  for (std::size_t i = 0; i < whole.size(); ++i)
    worst = std::max(worst, pmt::test::shard_norm_error(*shards[i], *whole[i], 1e-3 * largest));
  return worst;
}

/// The largest norm-wise relative difference of two models of the same layout (floored at 1e-3).
template <class P>
double worst_difference(const std::vector<P*>& a, const std::vector<P*>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    double d = 0, r = 0;
    for (std::size_t k = 0; k < a[i]->size(); ++k) {
      const double x = a[i]->value(k), y = b[i]->value(k);
      d += (x - y) * (x - y), r += y * y;
    }
    worst = std::max(worst, std::sqrt(d) / std::max(std::sqrt(r), 1e-3));
  }
  return worst;
}

/// The layouts of n ranks the tests run: dp = n, and dp n/2 x tp 2 from 4 ranks on.
std::vector<std::pair<int, int>> dp_tp_layouts(int n) {
  std::vector<std::pair<int, int>> out{{n, 1}};
  if (n >= 4 && n % 2 == 0) out.emplace_back(n / 2, 2);
  return out;
}

/// Trains 7 steps of a Trainer with data-parallel mode Mode on dp = np, saving with its state()
/// after each step in `save_after`; resumes each checkpoint into a model of other values and
/// checks that the losses and the parameters continue bit for bit (and `same_state(trainer, model,
/// resumed trainer, resumed model)` where one is given).
template <class T, class Mode, class Check = std::nullptr_t>
bool resumes_bit_for_bit(const std::string& name, const std::vector<int>& save_after, double max_norm,
                         const pmt::train::TrainerOptions& options = {}, Check same_state = nullptr) {
  using Model   = pmt::nn::Gpt<T, Host, Backend>;
  using Ids     = typename Model::Ids;
  using Opt     = pmt::optim::AdamW<T, Host>;
  using Tr      = pmt::train::Trainer<Model, Opt, Host, Backend, Mode>;
  const auto& w = pmt::test::world();
  const int dp  = w.size();
  pmt::Mesh<Backend> mesh(w, pmt::MeshShape{dp, 1, 1});
  const std::size_t B = B_global / static_cast<std::size_t>(dp), first = B * static_cast<std::size_t>(w.rank());
  const std::string dir = pmt::test::shared_temp_path(w, "pmt-test-" + name + "-checkpoint");
  pmt::io::CheckpointInfo info;
  info.model = "test gpt";
  const pmt::train::StepOptions o{double(B_global * Tn), 3e-3, max_norm};
  Model straight(mesh, cfg);
  Opt opt(straight.parameters(), hyper);
  Tr tr(mesh, straight, opt, Host(), options);
  std::vector<double> losses;
  for (int step = 0; step < 7; ++step) {
    losses.push_back(tr.step({batch<Ids>(step, first, B)}, o));
    info.step = step + 1;
    if (std::find(save_after.begin(), save_after.end(), step) != save_after.end())
      pmt::io::save_checkpoint(dir, mesh, opt, info, tr.state());
  }
  bool same = true;
  for (int saved : save_after) {
    pmt::nn::GptConfig other = cfg;
    other.seed               = cfg.seed + 1;  // the checkpoint must overwrite every value
    Model resumed(mesh, other);
    Opt resumed_opt(resumed.parameters(), hyper);
    Tr resumed_tr(mesh, resumed, resumed_opt, Host(), options);
    const auto got = pmt::io::load_checkpoint(pmt::io::checkpoint_step_dir(dir, saved + 1), mesh, resumed_opt,
                                              info.model, resumed_tr.state());
    same           = same && got.step == saved + 1;
    for (int step = saved + 1; step < 7; ++step) {
      pmt::train::StepOptions at = o;
      at.step                    = step;  // the global step keeps a period's phase
      same = resumed_tr.step({batch<Ids>(step, first, B)}, at) == losses[std::size_t(step)] && same;
    }
    const auto ps = straight.parameters(), qs = resumed.parameters();
    for (std::size_t i = 0; i < ps.size(); ++i)
      for (std::size_t k = 0; k < ps[i]->size(); ++k) same = same && ps[i]->value(k) == qs[i]->value(k);
    if constexpr (!std::is_same_v<Check, std::nullptr_t>) same = same && same_state(tr, straight, resumed_tr, resumed);
  }
  pmt::comm::barrier(w);
  if (w.rank() == 0) std::filesystem::remove_all(dir);
  return pmt::test::all_ranks(same);
}

}  // namespace

TEST_CASE("bf16 error feedback: what a rank sends over K steps adds up to its K gradients",
          "[train][compress][dp][mpi]") {
  const auto& w = pmt::test::world();
  const int dp  = w.size();
  pmt::Mesh<Backend> mesh(w, pmt::MeshShape{dp, 1, 1});
  pmt::nn::Linear<float, pmt::Replicate, Host, Backend> layer(mesh, 4, 3, {5, 1});
  const auto ps = layer.parameters();
  using pmt::parallel::GradCompression;
  pmt::parallel::GradSync<float, Host, Backend> with(mesh.comm(pmt::Axis::dp), ps,
                                                     {/*bucket_bytes=*/32, GradCompression::bf16});
  pmt::parallel::GradSync<float, Host, Backend> plain(mesh.comm(pmt::Axis::dp), ps,
                                                      {/*bucket_bytes=*/32, GradCompression::none});
  // 1 + 2^-9 lies halfway between two bf16 values: rounded alone it is 1 every time. With error
  // feedback the residual grows until a step sends 1 + 2^-7, and four steps send 4 (1 + 2^-9)
  // exactly; the sums over dp (a power of two) add no rounding of their own.
  const float g = 1.0f + 1.0f / 512;
  double total = 0, total_plain = 0;
  for (int k = 0; k < 4; ++k) {
    for (auto* sync : {&with, &plain}) {
      for (auto* p : ps) Kokkos::deep_copy(p->grad, g);
      sync->arm(true);
      sync->ready(Host(), ps);
      sync->finish(Host());
      Host().fence();
      (sync == &with ? total : total_plain) += ps[0]->grad(0);
    }
  }
  bool ok = true;
  if (dp > 1) {
    ok = total == dp * 4.0 * double(g) && total_plain == dp * 4.0 * double(g);  // fp32 carries 1 + 2^-9 exactly
    ok = ok && with.residual(ps[0]).size() == ps[0]->size() && with.residual(ps[0])(0) == 0.0f;  // all sent
    ok = ok && with.bytes_sent() * 2 == plain.bytes_sent();                                      // half the bytes
    // without feedback, bf16 alone would have sent dp * 4 * 1
    ok = ok && double(static_cast<float>(pmt::bf16(g))) == 1.0;
  } else {
    ok = total == 4.0 * double(g) && with.bytes_sent() == 0 && with.residual(ps[0]).size() == 0;  // nothing to sum
  }
  INFO("sent over 4 steps: " << total << " (uncompressed " << total_plain << "), bytes " << with.bytes_sent() << " vs "
                             << plain.bytes_sent());
  CHECK(pmt::test::all_ranks(ok));
}

TEST_CASE("bf16-compressed gradients train within 0.1 % of uncompressed ones, with half the bytes",
          "[train][compress][dp][mpi]") {
  using Model   = pmt::nn::Gpt<float, Host, Backend>;
  using Ids     = typename Model::Ids;
  using Opt     = pmt::optim::AdamW<float, Host>;
  const auto& w = pmt::test::world();
  const int n   = w.size();
  for (const auto& [dp, tp] : dp_tp_layouts(n)) {
    DYNAMIC_SECTION("dp " << dp << " x tp " << tp) {
      pmt::Mesh<Backend> mesh(w, pmt::MeshShape{dp, tp, 1});
      Model plain(mesh, cfg), packed(mesh, cfg);
      Opt plain_opt(plain.parameters(), hyper), packed_opt(packed.parameters(), hyper);
      pmt::train::Trainer<Model, Opt, Host, Backend> plain_tr(mesh, plain, plain_opt, Host(), std::size_t(8) << 10);
      pmt::train::Trainer<Model, Opt, Host, Backend> packed_tr(
          mesh, packed, packed_opt, Host(),
          pmt::parallel::GradSyncOptions{std::size_t(8) << 10, pmt::parallel::GradCompression::bf16});
      const std::size_t B     = B_global / static_cast<std::size_t>(dp),
                        first = B * static_cast<std::size_t>(mesh.coord(pmt::Axis::dp));
      double worst = 0, first_loss = 0, last_loss = 0;
      for (int step = 0; step < 20; ++step) {
        const pmt::train::StepOptions o{double(B_global * Tn), 3e-3, 1.0};
        const double lp = plain_tr.step({batch<Ids>(step, first, B)}, o);
        const double lc = packed_tr.step({batch<Ids>(step, first, B)}, o);
        worst           = std::max(worst, std::abs(lp - lc) / std::abs(lp));
        if (step == 0) first_loss = lp;
        last_loss = lc;
      }
      const auto sent = packed_tr.grad_sync().bytes_sent(), full = plain_tr.grad_sync().bytes_sent();
      INFO("worst relative loss difference over 20 steps " << worst << "; loss " << first_loss << " -> " << last_loss
                                                           << "; bytes " << sent << " vs " << full);
      bool ok = worst <= 1e-3 && last_loss < 0.9 * first_loss;
      if (dp > 1) ok = ok && 2 * sent == full && full > 0;
      CHECK(pmt::test::all_ranks(ok));
    }
  }
}

TEST_CASE("compression needs synchronous gradients", "[train][compress]") {
  using Model                           = pmt::nn::Gpt<float, Host, Backend>;
  using Opt                             = pmt::optim::AdamW<float, Host>;
  pmt::comm::Communicator<Backend> self = pmt::test::world().split(pmt::test::world().rank(), 0);
  pmt::Mesh<Backend> one(self, pmt::MeshShape{});
  Model m(one, cfg);
  Opt opt(m.parameters(), hyper);
  using Catch::Matchers::ContainsSubstring;
  const pmt::parallel::GradSyncOptions packed{std::size_t(1) << 20, pmt::parallel::GradCompression::bf16};
  CHECK_THROWS_WITH((pmt::train::Trainer<Model, Opt, Host, Backend, pmt::LocalSgd<2>>(one, m, opt, Host(), packed)),
                    ContainsSubstring("gradient compression bf16 needs synchronous data parallelism"));
  pmt::train::TrainerOptions bad;
  bad.outer.momentum = 1.0;
  CHECK_THROWS_WITH((pmt::train::Trainer<Model, Opt, Host, Backend, pmt::DiLoCo<2>>(one, m, opt, Host(), bad)),
                    ContainsSubstring("DiLoCo's outer lr is 0.7 and momentum 1"));
}

TEST_CASE("DiLoCo equals a serial simulation of its replicas", "[train][diloco][dp][mpi]") {
  using Model     = pmt::nn::Gpt<double, Host, Backend>;
  using Ids       = typename Model::Ids;
  using Opt       = pmt::optim::AdamW<double, Host>;
  constexpr int H = 3;
  const auto& w   = pmt::test::world();
  const int n = w.size(), r = w.rank();
  const pmt::train::OuterOptions outer{0.7, 0.9, true};
  for (const auto& [dp, tp] : dp_tp_layouts(n)) {
    DYNAMIC_SECTION("dp " << dp << " x tp " << tp) {
      pmt::Mesh<Backend> mesh(w, pmt::MeshShape{dp, tp, 1});
      pmt::Mesh<Backend> one(w.split(r, 0), pmt::MeshShape{});
      Model par(mesh, cfg);
      Opt par_opt(par.parameters(), hyper);
      pmt::train::TrainerOptions options;
      options.outer = outer;
      pmt::train::Trainer<Model, Opt, Host, Backend, pmt::DiLoCo<H>> par_tr(mesh, par, par_opt, Host(), options);
      // the replicas, one after the other on this rank, each with its own AdamW
      std::vector<std::unique_ptr<Model>> reps;
      std::vector<std::unique_ptr<Opt>> opts;
      std::vector<std::unique_ptr<pmt::train::Trainer<Model, Opt, Host, Backend>>> trs;
      for (int j = 0; j < dp; ++j) {
        reps.push_back(std::make_unique<Model>(one, cfg));
        opts.push_back(std::make_unique<Opt>(reps.back()->parameters(), hyper));
        trs.push_back(
            std::make_unique<pmt::train::Trainer<Model, Opt, Host, Backend>>(one, *reps.back(), *opts.back()));
      }
      const auto ref0 = reps[0]->parameters();
      std::vector<std::vector<double>> anchor(ref0.size()), mom(ref0.size());
      for (std::size_t i = 0; i < ref0.size(); ++i) {
        anchor[i].assign(ref0[i]->value.data(), ref0[i]->value.data() + ref0[i]->size());
        mom[i].assign(ref0[i]->size(), 0.0);
      }
      const std::size_t B     = B_global / static_cast<std::size_t>(dp),
                        first = B * static_cast<std::size_t>(mesh.coord(pmt::Axis::dp));
      for (int step = 0; step < 2 * H + 1; ++step) {
        const pmt::train::StepOptions o{double(B_global * Tn), 3e-3, 0.0};  // no clipping: replicas' norms differ
        par_tr.step({batch<Ids>(step, first, B)}, o);
        pmt::train::StepOptions local = o;
        local.normaliser              = o.normaliser / dp;  // each replica normalises by its share of the tokens
        for (int j = 0; j < dp; ++j) trs[std::size_t(j)]->step({batch<Ids>(step, B * std::size_t(j), B)}, local);
        if ((step + 1) % H != 0) continue;
        for (std::size_t i = 0; i < ref0.size(); ++i)
          for (std::size_t k = 0; k < ref0[i]->size(); ++k) {
            double x = 0;
            for (int j = 0; j < dp; ++j) x += reps[std::size_t(j)]->parameters()[i]->value(k);
            x *= 1.0 / dp;
            const double delta = anchor[i][k] - x;
            mom[i][k]          = outer.momentum * mom[i][k] + delta;
            anchor[i][k] -= outer.lr * (delta + outer.momentum * mom[i][k]);
            for (int j = 0; j < dp; ++j) reps[std::size_t(j)]->parameters()[i]->value(k) = anchor[i][k];
          }
      }
      // after 2H + 1 steps the replicas have drifted apart again: compare this rank's replica
      const double err =
          worst_shard_error(par.parameters(), reps[std::size_t(mesh.coord(pmt::Axis::dp))]->parameters());
      INFO("rank " << r << ": worst parameter difference against the serial replicas " << err);
      CHECK(pmt::test::all_ranks(err <= 1e-10));
    }
  }
}

TEST_CASE("DiLoCo with outer lr 1, no momentum, H = 1 and plain SGD is synchronous data parallelism",
          "[train][diloco][dp][mpi]") {
  using Model   = pmt::nn::Gpt<double, Host, Backend>;
  using Ids     = Model::Ids;
  using Opt     = pmt::optim::Sgd<double, Host>;
  const auto& w = pmt::test::world();
  const int n   = w.size();
  for (const auto& [dp, tp] : dp_tp_layouts(n)) {
    DYNAMIC_SECTION("dp " << dp << " x tp " << tp) {
      pmt::Mesh<Backend> mesh(w, pmt::MeshShape{dp, tp, 1});
      Model sync_m(mesh, cfg), outer_m(mesh, cfg);
      Opt sync_opt(sync_m.parameters(), {0.0, 0.0}), outer_opt(outer_m.parameters(), {0.0, 0.0});
      pmt::train::TrainerOptions options;
      options.outer = {1.0, 0.0, true};
      pmt::train::Trainer<Model, Opt, Host, Backend> sync_tr(mesh, sync_m, sync_opt);
      pmt::train::Trainer<Model, Opt, Host, Backend, pmt::DiLoCo<1>> outer_tr(mesh, outer_m, outer_opt, Host(),
                                                                              options);
      const std::size_t B     = B_global / static_cast<std::size_t>(dp),
                        first = B * static_cast<std::size_t>(mesh.coord(pmt::Axis::dp));
      double worst            = 0;
      for (int step = 0; step < 8; ++step) {
        const pmt::train::StepOptions o{double(B_global * Tn), 0.05, 0.0};
        const double ls = sync_tr.step({batch<Ids>(step, first, B)}, o);
        const double lo = outer_tr.step({batch<Ids>(step, first, B)}, o);
        worst           = std::max(worst, std::abs(ls - lo) / std::abs(ls));
      }
      const double pd = worst_difference(outer_m.parameters(), sync_m.parameters());
      INFO("loss " << worst << ", parameters " << pd);
      CHECK(pmt::test::all_ranks(worst <= 1e-10 && pd <= 1e-10));
    }
  }
}

TEST_CASE("bounded staleness applies the dp sum of exactly S steps before, as one rank with delayed gradients",
          "[train][stale][dp][mpi]") {
  using Model   = pmt::nn::Gpt<double, Host, Backend>;
  using Ids     = typename Model::Ids;
  using Opt     = pmt::optim::AdamW<double, Host>;
  const auto& w = pmt::test::world();
  const int n = w.size(), r = w.rank();
  for (int S : {0, 2})
    for (const auto& [dp, tp] : dp_tp_layouts(n)) {
      DYNAMIC_SECTION("S " << S << ", dp " << dp << " x tp " << tp) {
        pmt::Mesh<Backend> mesh(w, pmt::MeshShape{dp, tp, 1});
        pmt::Mesh<Backend> one(w.split(r, 0), pmt::MeshShape{});
        Model par(mesh, cfg), ref(one, cfg);
        Opt par_opt(par.parameters(), hyper), ref_opt(ref.parameters(), hyper);
        pmt::train::TrainerOptions options;
        options.staleness = S;
        pmt::train::Trainer<Model, Opt, Host, Backend, pmt::BoundedStaleness<>> tr(mesh, par, par_opt, Host(), options);
        const auto rp = ref.parameters();
        std::deque<std::vector<std::vector<double>>> delayed;  // the reference's gradients, oldest first
        const std::size_t B     = B_global / static_cast<std::size_t>(dp),
                          first = B * static_cast<std::size_t>(mesh.coord(pmt::Axis::dp));
        bool ok                 = true;
        double worst_loss       = 0;
        for (int step = 0; step < 8; ++step) {
          const pmt::train::StepOptions o{double(B_global * Tn), 3e-3, 0.5};  // clipping on
          const double lp = tr.step({batch<Ids>(step, first, B)}, o);
          // the reference: this step's gradient on the global batch joins the queue; the one of S
          // steps before is applied
          ref_opt.zero_grad(Host());
          const auto all  = batch<Ids>(step, 0, B_global);
          const double lr = ref.forward_backward(Host(), all.ids, all.targets, all.B, all.T, o.normaliser);
          Host().fence();
          auto& g = delayed.emplace_back();
          for (auto* p : rp) g.emplace_back(p->grad.data(), p->grad.data() + p->size());
          if (delayed.size() > std::size_t(S)) {
            for (std::size_t i = 0; i < rp.size(); ++i)
              std::copy(delayed.front()[i].begin(), delayed.front()[i].end(), rp[i]->grad.data());
            delayed.pop_front();
            pmt::optim::clip_grad_norm(Host(), rp, one.comm(pmt::Axis::tp), o.max_norm);
            ref_opt.step(Host(), o.lr);
          }
          worst_loss = std::max(worst_loss, std::abs(lp - lr) / std::abs(lr));
          // the schedule: nothing applied before step S, then sums exactly S steps old
          ok = ok && tr.last_step_applied() == (step >= S) &&
               tr.stale_sync()->last_staleness() == (step >= S ? S : -1) &&
               tr.stale_sync()->pending() == std::size_t(std::min(step + 1, S));
        }
        const double err = worst_shard_error(par.parameters(), rp);
        INFO("rank " << r << ": loss " << worst_loss << ", parameters " << err);
        CHECK(pmt::test::all_ranks(ok && worst_loss <= 1e-10 && err <= 1e-10));
      }
    }
}

TEST_CASE("the Trainer's state resumes bit for bit: residuals, DiLoCo's outer state, stale sums in flight",
          "[train][checkpoint][compress][diloco][stale][mpi]") {
  SECTION("bf16 residuals") {
    const pmt::parallel::GradSyncOptions packed{std::size_t(8) << 10, pmt::parallel::GradCompression::bf16};
    double norm = 0;
    // and the residuals themselves, after the same steps
    const auto residuals = [&norm](const auto& x, auto& mx, const auto& y, auto& my) {
      const auto ps = mx.parameters(), qs = my.parameters();
      bool same = ps.size() == qs.size();
      for (std::size_t i = 0; same && i < ps.size(); ++i) {
        const auto r = x.grad_sync().residual(ps[i]), q = y.grad_sync().residual(qs[i]);
        same = r.size() == q.size();
        for (std::size_t k = 0; same && k < r.size(); ++k) same = r(k) == q(k), norm += double(r(k)) * double(r(k));
      }
      return same;
    };
    CHECK(resumes_bit_for_bit<float, pmt::Synchronous>("residual", {2}, 1.0, packed, residuals));
    CHECK(pmt::test::all_ranks(pmt::test::world().size() == 1 || norm > 0));  // there was a residual to keep
  }
  SECTION("DiLoCo, mid-period (the replicas differ)") {
    CHECK(resumes_bit_for_bit<double, pmt::DiLoCo<2>>("diloco", {2}, 0.0));
  }
  SECTION("bounded staleness with 1 and 2 sums pending") {
    CHECK(resumes_bit_for_bit<double, pmt::BoundedStaleness<2>>("stale", {0, 3}, 0.5));
  }
}
