// SPDX-License-Identifier: Apache-2.0
// Parallel equals serial (design invariant 4) for training: for every layout dp x tp = np
// (np = 1, 2, 4, 8), 10 AdamW steps (clipping on, two microbatches per step on each dp rank) of a
// small Gpt give the per-step global losses and final parameters of the one-rank run on the whole
// global batch, computed on every rank in the same job. Per-step losses: relative difference
// double <= 1e-10, float <= 1e-5. Final parameters: per parameter, the norm-wise relative
// difference ||p - p_1|| / ||p_1|| <= the same bounds; for double also every element (relative to
// its tensor's largest magnitude). Float elements are reported, not bounded: Adam divides by
// sqrt(v), so elements whose gradient is near zero carry float rounding (different summation
// orders across layouts) into ~1e-5 differences while the tensors agree to ~3e-6 in norm.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include "../comm/comm_test.hpp"
#include "../nn/model_test.hpp"
#include "pmt/nn/gpt.hpp"
#include "pmt/optim/optimizers.hpp"
#include "pmt/train/trainer.hpp"
#include "train_test.hpp"

#include <cmath>
#include <vector>

using Host    = Kokkos::DefaultHostExecutionSpace;
using Backend = pmt::test::World::backend;

namespace {

constexpr std::size_t V = 96, Tn = 12, B_global = 8;
const pmt::nn::GptConfig cfg{V, /*context=*/16, /*layers=*/2, /*width=*/32, /*heads=*/8, /*seed=*/5};  // tp up to 8

template <class Ids>
pmt::train::Microbatch<Ids> batch(int step, std::size_t first_seq, std::size_t B) {
  return pmt::test::synthetic_batch<Ids>(step, first_seq, B, Tn, V);
}

double valid_targets(int step) { return pmt::test::valid_targets(step, B_global, Tn, V); }

}  // namespace

TEMPLATE_TEST_CASE("every dp x tp layout trains like one rank on the global batch", "[train][dp][tp][mpi]", double,
                   float) {
  using T       = TestType;
  using Model   = pmt::nn::Gpt<T, Host, Backend>;
  using Ids     = typename Model::Ids;
  using Opt     = pmt::optim::AdamW<T, Host>;
  const auto& w = pmt::test::world();
  const int n = w.size(), r = w.rank();
  const double tol = std::is_same_v<T, double> ? 1e-10 : 1e-5;
  const pmt::optim::AdamWOptions hyper{0.9, 0.95, 1e-8, 0.1};
  for (int dp = 1; dp <= n; dp *= 2) {
    const int tp = n / dp;
    DYNAMIC_SECTION("dp " << dp << " x tp " << tp) {
      pmt::Mesh<Backend> one(w.split(r, 0), pmt::MeshShape{});
      pmt::Mesh<Backend> mesh(w, pmt::MeshShape{dp, tp, 1});
      Model ref(one, cfg), par(mesh, cfg);
      Opt ref_opt(ref.parameters(), hyper), par_opt(par.parameters(), hyper);
      pmt::train::Trainer<Model, Opt, Host, Backend> ref_tr(one, ref, ref_opt), par_tr(mesh, par, par_opt, Host(),
                                                                                       /*bucket_bytes=*/8 << 10);
      const std::size_t B_local = B_global / static_cast<std::size_t>(dp),
                        first   = B_local * static_cast<std::size_t>(mesh.coord(pmt::Axis::dp));
      bool ok                   = true;
      double worst_loss         = 0;
      for (int step = 0; step < 10; ++step) {
        const pmt::train::StepOptions o{valid_targets(step), pmt::optim::warmup_cosine(step, 3, 10, 3e-3, 3e-4), 1.0};
        const double l_ref = ref_tr.step({batch<Ids>(step, 0, B_global)}, o);
        const double l_par = par_tr.step(
            {batch<Ids>(step, first, B_local / 2), batch<Ids>(step, first + B_local / 2, B_local - B_local / 2)}, o);
        worst_loss = std::max(worst_loss, std::abs(l_par - l_ref) / std::abs(l_ref));
        ok         = ok && std::isfinite(l_ref);
      }
      auto pr = ref.parameters(), pp = par.parameters();
      // Relative to each parameter's magnitude, floored at 1e-3 of the model's largest value: the
      // key biases have an analytically zero gradient and stay at rounding-noise size.
      double largest = 0;
      for (auto* p : pr)
        for (std::size_t i = 0; i < p->size(); ++i) largest = std::max(largest, std::abs(double(p->value(i))));
      double worst_param = 0, worst_elem = 0;
      for (std::size_t i = 0; i < pr.size(); ++i) {
        worst_param = std::max(worst_param, pmt::test::shard_norm_error(*pp[i], *pr[i], 1e-3 * largest));
        worst_elem  = std::max(worst_elem, pmt::test::shard_error(*pp[i], *pr[i], false, 1e-3 * largest));
      }
      INFO("rank " << r << ": worst loss difference " << worst_loss << ", worst parameter difference " << worst_param
                   << " (norm-wise; elementwise " << worst_elem << ")"
                   << ", buckets started during backward " << par_tr.grad_sync().launched_early() << " of "
                   << par_tr.grad_sync().buckets());
      ok = ok && worst_loss <= tol && worst_param <= tol;
      if (std::is_same_v<T, double>) ok = ok && worst_elem <= tol;
      // dp all-reduces overlapped backward, except the last bucket's (summed blocking at the end)
      if (dp > 1)
        ok = ok && par_tr.grad_sync().launched_early() > 0 &&
             par_tr.grad_sync().launched_early() < par_tr.grad_sync().buckets();
      CHECK(pmt::test::all_ranks(ok));
    }
  }
}
