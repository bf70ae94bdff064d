// SPDX-License-Identifier: Apache-2.0
#pragma once
// Measurement of candidate layouts, interleaved: the step time of each Layout, measured by
// training pmt's Gpt with it (train::Trainer, AdamW or ZeRO-1 AdamW, the layout's schedule) on the
// ranks that will train. Every layout is built once, side by side in the same job; then rounds
// visit them in turn (each round starting one layout further on), and each visit runs
// `warmup_steps` untimed steps and `timed_steps` timed ones. A layout's time is the median of its
// timed steps over all rounds.
//
// Why interleaved: on a shared or virtual machine the speed drifts in phases of seconds
// (another tenant, frequency, the scheduler's placement of oversubscribed ranks). Timing layouts one
// after the other hands each a different phase, and the differences the planner must rank are
// smaller than the drift. Visiting them in rounds gives every layout a share of every phase.
// The first step of a visit finds caches holding the previous layout's data; it is not timed.
//
// Collective: every rank calls it with the same problem and layouts (in the same order); every
// rank returns the same times. Each timed step is fenced by barriers on the world: its time is
// from the last rank entering to the last rank leaving, as rank 0 sees it.
//   auto plan  = pmt::plan::search(problem, machine);
//   std::vector<pmt::plan::Layout> top;  // e.g. the 5 best predicted
//   auto times = pmt::plan::measure(world, problem, top);   // seconds per step, same order
// Memory: every layout holds its parameters, gradients and optimizer state for the whole
// measurement (activations only during its own steps), so measure a shortlist of a large model.

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "pmt/comm/collectives.hpp"
#include "pmt/comm/communicator.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/core/error.hpp"
#include "pmt/nn/gpt.hpp"
#include "pmt/optim/optimizers.hpp"
#include "pmt/optim/zero.hpp"
#include "pmt/optim/zero2.hpp"
#include "pmt/optim/zero3.hpp"
#include "pmt/plan/model.hpp"
#include "pmt/policy/hybrid.hpp"
#include "pmt/policy/policies.hpp"
#include "pmt/train/trainer.hpp"

namespace pmt::plan {

/// \brief How measure() trains the shortlisted layouts side by side.
struct MeasureOptions {
  int rounds       = 10;  ///< visits of every layout
  int warmup_steps = 1;   ///< untimed steps at the start of each visit
  int timed_steps  = 2;   ///< timed steps of each visit
};

/// \brief A layout's measured step: the median and the quartiles over its timed steps, and those
/// steps in the order they ran (`timed_steps` per round; seconds).
struct Measured {
  double median = 0, low = 0, high = 0;
  std::vector<double> steps;
};

/// \brief The nn::Gpt options that run layout `l` on a rank of pipeline stage `stage`: its
/// chunks, sequence parallelism, and recomputation where the layout has this stage recompute
/// (Layout::recompute_stages).
inline nn::GptOptions gpt_options(const Layout& l, int stage) {
  const bool here = l.recomputes_on(stage);
  return nn::GptOptions{{}, l.chunks, l.recompute && here, l.sequence_parallel, l.recompute_attention && here};
}

static_assert(detail::zero2_in_flight ==
                  optim::Zero2AdamW<float, Kokkos::DefaultHostExecutionSpace, comm::Self>::max_in_flight,
              "the planner's ZeRO-2 memory counts the optimizer's reduce-scatters in flight");
static_assert(detail::zero3_in_flight ==
                  optim::Zero3AdamW<float, Kokkos::DefaultHostExecutionSpace, comm::Self>::max_in_flight,
              "the planner's ZeRO-3 memory counts the optimizer's reduce-scatters in flight");

namespace detail {

/// One layout, built: its mesh, model, optimizer, trainer and synthetic microbatches.
template <class Backend, class Opt>
struct Run {
  using Exec   = Kokkos::DefaultHostExecutionSpace;
  using Model  = nn::Gpt<float, Exec, Backend>;
  using Policy = Hybrid<DataParallel<>, TensorSplit<>, Pipeline<>>;
  using Ids    = typename Model::Ids;
  Mesh<Backend> mesh;
  Model model;
  Opt opt;
  train::Trainer<Model, Opt, Exec, Backend, Policy> trainer;
  std::vector<train::Microbatch<Ids>> microbatches;
  double tokens;

  static Opt make_opt(Model& model, const Mesh<Backend>& mesh, const optim::AdamWOptions& hyper, const Layout& l) {
    if constexpr (std::is_same_v<Opt, optim::AdamW<float, Exec>>) {
      (void)mesh, (void)l;
      return Opt(model.parameters(), hyper);
    } else if constexpr (optim::shards_params_v<Opt>) {
      return Opt(
          model.parameters(), hyper, mesh.comm(Axis::dp), mesh.comm(Axis::tp),
          mesh.degree(Axis::pp) > 1 ? std::optional<comm::Communicator<Backend>>(mesh.comm(Axis::pp)) : std::nullopt,
          model.tied_parameters(), optim::Zero3Options{static_cast<std::size_t>(l.prefetch), l.shard_size});
    } else if constexpr (optim::shards_grads_v<Opt>) {
      (void)l;
      return Opt(
          model.parameters(), hyper, mesh.comm(Axis::dp), mesh.comm(Axis::tp),
          mesh.degree(Axis::pp) > 1 ? std::optional<comm::Communicator<Backend>>(mesh.comm(Axis::pp)) : std::nullopt,
          model.tied_parameters());
    } else {
      (void)l;
      return Opt(
          model.parameters(), hyper, mesh.comm(Axis::dp), mesh.comm(Axis::tp),
          mesh.degree(Axis::pp) > 1 ? std::optional<comm::Communicator<Backend>>(mesh.comm(Axis::pp)) : std::nullopt);
    }
  }

  static train::TrainerOptions trainer_options(const Problem& pr, const Layout& l) {
    train::TrainerOptions t(parallel::GradSyncOptions{pr.bucket_bytes, l.sync.mode == DpMode::Bf16
                                                                           ? parallel::GradCompression::bf16
                                                                           : parallel::GradCompression::none});
    t.precision = pr.precision;  // the products in the planned precision
    return t;
  }

  Run(const comm::Communicator<Backend>& world, const Problem& pr, const Layout& l)
      : mesh(world, MeshShape{l.dp, l.tp, l.pp}),
        model(mesh, pr.model, gpt_options(l, mesh.coord(Axis::pp))),
        opt(make_opt(model, mesh, optim::AdamWOptions{0.9, 0.95, 1e-8, 0.1}, l)),
        trainer(mesh, model, opt, Exec(), trainer_options(pr, l)),
        tokens(double(pr.batch) * double(pr.model.context)) {
    trainer.set_schedule(l.schedule);
    const std::size_t T = pr.model.context, local = pr.batch / std::size_t(l.dp),
                      per   = local / std::size_t(l.microbatches);
    const std::size_t first = local * std::size_t(mesh.coord(Axis::dp));
    for (int i = 0; i < l.microbatches; ++i) {
      train::Microbatch<Ids> mb{Ids("pmt::plan::measure::ids", per * T), Ids("pmt::plan::measure::targets", per * T),
                                per, T};
      auto hi = Kokkos::create_mirror_view(mb.ids);
      auto ht = Kokkos::create_mirror_view(mb.targets);
      for (std::size_t n = 0; n < per * T; ++n) {  // the same global batch for every layout
        const std::uint64_t g = (first + std::size_t(i) * per) * T + n;
        hi(n)                 = static_cast<std::int32_t>((g * 2654435761u >> 7) % pr.model.vocab);
        ht(n)                 = static_cast<std::int32_t>((g * 2654435761u >> 13) % pr.model.vocab);
      }
      Kokkos::deep_copy(mb.ids, hi);
      Kokkos::deep_copy(mb.targets, ht);
      microbatches.push_back(std::move(mb));
    }
  }
  void step() { trainer.step(microbatches, train::StepOptions{tokens, 1e-3, 1.0}); }
};

}  // namespace detail

/// \brief Spearman's rank correlation of a and b (ties get their average rank); 1 when either is
/// constant or shorter than 2.
inline double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  pmt::detail::require<ConfigError>(a.size() == b.size(), "pmt::plan::spearman", [&] {
    return pmt::detail::str("the two series have ", a.size(), " and ", b.size(), " values");
  });
  const auto ranks = [](const std::vector<double>& x) {
    std::vector<std::size_t> order(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t i, std::size_t j) { return x[i] < x[j]; });
    std::vector<double> r(x.size());
    for (std::size_t i = 0; i < order.size();) {
      std::size_t j = i;
      while (j + 1 < order.size() && x[order[j + 1]] == x[order[i]]) ++j;
      for (std::size_t k = i; k <= j; ++k) r[order[k]] = 0.5 * double(i + j);
      i = j + 1;
    }
    return r;
  };
  const auto ra = ranks(a), rb = ranks(b);
  const double n = double(a.size()), mean = 0.5 * (n - 1);
  double cov = 0, va = 0, vb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    cov += (ra[i] - mean) * (rb[i] - mean);
    va += (ra[i] - mean) * (ra[i] - mean);
    vb += (rb[i] - mean) * (rb[i] - mean);
  }
  return va > 0 && vb > 0 ? cov / std::sqrt(va * vb) : 1.0;
}

/// \brief Measures the step time of each layout (see the file comment). Collective.
/// \throws pmt::ConfigError when a layout cannot run the problem on these ranks (why_invalid), or
/// when the problem is not in float.
template <class Backend>
std::vector<Measured> measure(const comm::Communicator<Backend>& world, const Problem& pr,
                              const std::vector<Layout>& layouts, const MeasureOptions& o = {}) {
  using Exec = Kokkos::DefaultHostExecutionSpace;
  pmt::detail::require<ConfigError>(pr.value_bytes == 4, "pmt::plan::measure", [&] {
    return pmt::detail::str("measures float models; the problem has ", pr.value_bytes, "-byte values");
  });
  pmt::detail::require<ConfigError>(
      o.rounds >= 1 && o.timed_steps >= 1 && o.warmup_steps >= 0, "pmt::plan::measure", [&] {
        return pmt::detail::str("rounds ", o.rounds, ", timed steps ", o.timed_steps, ", warm-up steps ",
                                o.warmup_steps, ": need rounds, timed steps >= 1");
      });
  for (const auto& l : layouts) {
    const std::string why = why_invalid(pr, l, world.size());
    pmt::detail::require<ConfigError>(why.empty(), "pmt::plan::measure", [&] { return l.describe() + ": " + why; });
    pmt::detail::require<ConfigError>(
        l.sync.mode == DpMode::Sync || l.sync.mode == DpMode::Bf16, "pmt::plan::measure", [&] {
          return l.describe() + ": measures the synchronous dp modes (sync, bf16) only; a step of " +
                 l.sync.describe() + " takes another time at each phase of its period";
        });
  }
  std::vector<std::function<void()>> steps;
  std::vector<std::shared_ptr<void>> keep;  // the runs, alive until the end
  for (const auto& l : layouts) {
    if (l.zero == 3) {
      auto r = std::make_shared<detail::Run<Backend, optim::Zero3AdamW<float, Exec, Backend>>>(world, pr, l);
      steps.push_back([r] { r->step(); });
      keep.push_back(r);
    } else if (l.zero == 2) {
      auto r = std::make_shared<detail::Run<Backend, optim::Zero2AdamW<float, Exec, Backend>>>(world, pr, l);
      steps.push_back([r] { r->step(); });
      keep.push_back(r);
    } else if (l.zero) {
      auto r = std::make_shared<detail::Run<Backend, optim::ZeroAdamW<float, Exec, Backend>>>(world, pr, l);
      steps.push_back([r] { r->step(); });
      keep.push_back(r);
    } else {
      auto r = std::make_shared<detail::Run<Backend, optim::AdamW<float, Exec>>>(world, pr, l);
      steps.push_back([r] { r->step(); });
      keep.push_back(r);
    }
    steps.back()();  // first touch of everything the step allocates
  }
  const std::size_t n = layouts.size();
  std::vector<std::vector<double>> times(n);
  for (int round = 0; round < o.rounds; ++round) {
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = (k + std::size_t(round)) % n;
      for (int s = 0; s < o.warmup_steps; ++s) steps[i]();
      for (int s = 0; s < o.timed_steps; ++s) {
        comm::barrier(world);
        Kokkos::Timer timer;
        steps[i]();
        comm::barrier(world);
        times[i].push_back(timer.seconds());
      }
    }
  }
  // rank 0's times, on every rank
  const std::size_t per = std::size_t(o.rounds) * std::size_t(o.timed_steps);
  Kokkos::View<double*, Kokkos::HostSpace> all("pmt::plan::measure::times", n * per);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < per; ++j) all(i * per + j) = times[i][j];
  comm::broadcast(world, Exec(), all, 0);
  std::vector<Measured> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<double> t(per);
    for (std::size_t j = 0; j < per; ++j) t[j] = all(i * per + j);
    out[i].steps = t;
    std::sort(t.begin(), t.end());
    out[i].median = t[per / 2];
    out[i].low    = t[per / 4];
    out[i].high   = t[(3 * per) / 4];
  }
  return out;
}

}  // namespace pmt::plan
