// SPDX-License-Identifier: Apache-2.0
#pragma once
// The planner: every (dp, tp, pp, microbatches, schedule, ZeRO-1) that runs a Problem on the
// Machine's ranks, each predicted by plan/model.hpp, ranked by step time; layouts that do not
// divide the problem or do not fit in memory are rejected, each with its reason.
//   pmt::plan::Plan p = pmt::plan::search(problem, machine);
//   std::puts(p.table(10).c_str());   // the top 10, their time and memory, and the rejections
//   p.best().layout                   // what train_gpt --auto runs
// Candidates: every factorisation dp x tp x pp of the ranks; microbatches: every divisor of the
// sequences per dp rank (pp = 1: gradient accumulation, which lowers activation memory); the
// schedule: GPipe and 1F1B with pp > 1, and interleaved 1F1B with 2 model chunks per stage where
// the layers (2 pp) and the microbatches (a multiple of pp) allow it; ZeRO-1 on and off with
// dp > 1. Ties in predicted time (within 1 %) go to less memory, then fewer microbatches, then
// fewer chunks.

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "pmt/core/error.hpp"
#include "pmt/plan/model.hpp"

namespace pmt::plan {

namespace detail {
/// x with `digits` decimals.
inline std::string fixed(double x, int digits = 1) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}
}  // namespace detail

/// \brief A layout that cannot run, and why.
struct Rejection {
  Layout layout;
  std::string reason;
};

/// \brief What to search.
struct SearchOptions {
  bool allow_zero = true;
  /// ZeRO-2 (the gradients sharded too) is tried beside ZeRO-1 when dp > 1 (allow_zero): with
  /// one microbatch, where it communicates what ZeRO-1 does, and with several where ZeRO-1 does
  /// not fit even with sequence parallelism and recomputation (it reduce-scatters every microbatch).
  bool allow_zero2 = true;
  /// ZeRO-3 (the parameters sharded too, gathered block by block with prefetch) is tried when dp
  /// > 1 (allow_zero) where neither ZeRO-1 nor ZeRO-2 fits: it gathers the values twice per
  /// microbatch, so it is the layout of a model whose replicated weights do not fit.
  bool allow_zero3 = true;
  bool allow_gpipe = true;
  /// A layout that does not fit in memory is tried again with activation recomputation: of the
  /// attention (Layout::recompute_attention, a Gpt's) or of whole blocks (Layout::recompute).
  bool allow_recompute = true;
  /// A Gpt layout with tp > 1 that does not fit in memory is also tried with sequence parallelism
  /// (Layout::sequence_parallel), alone and with recomputation.
  bool allow_sequence_parallel = true;
  /// microbatch counts tried up to this many (a cluster's runs take microbatches of 1 sequence:
  /// a trillion parameters on 3,072 ranks fit only with 512 of them)
  int max_microbatches = 512;
  int max_chunks       = 2;  ///< model chunks per stage tried with 1F1B (1: no interleaving)
  /// The data-parallel modes tried with dp > 1 (ZeRO-1 only with Sync). Sync alone by default: the
  /// others change how the model trains, which is the user's choice to offer.
  std::vector<DpChoice> dp_modes = {DpChoice{}};
};

/// \brief The ranked candidates and the rejections.
struct Plan {
  Problem problem;
  Machine machine;
  std::vector<Estimate> ranked;  ///< fastest first
  std::vector<Rejection> rejected;

  /// \throws pmt::ConfigError when no layout can run (the rejections say why).
  const Estimate& best() const {
    pmt::detail::require<ConfigError>(!ranked.empty(), "pmt::plan::Plan::best", [&] {
      std::string why;
      for (std::size_t i = 0; i < rejected.size() && i < 8; ++i)
        why += "\n  " + rejected[i].layout.describe() + ": " + rejected[i].reason;
      return pmt::detail::str("no layout of ", machine.ranks, " ranks runs this problem; ", rejected.size(),
                              " rejected:", why);
    });
    return ranked.front();
  }

  /// \brief The top candidates (time and memory by part) and a summary of the rejections.
  std::string table(std::size_t top = 10) const {
    const auto mib  = [](double b) { return b / (1024.0 * 1024.0); };
    std::string out = pmt::detail::str(
        "rank  layout                                  step ms  compute   tp comm   pp comm    "
        "bubble   dp comm  optim   "
        "peak MiB (stage)  params+grads+optim  activations   sent MiB tp/pp/dp\n");
    char line[512];
    for (std::size_t i = 0; i < ranked.size() && i < top; ++i) {
      const auto& e = ranked[i];
      const auto& t = e.time;
      const auto& m = e.memory[static_cast<std::size_t>(e.heaviest_stage())];
      std::snprintf(line, sizeof line,
                    "%4zu  %-38s %8.2f %8.2f %9.2f %9.2f %9.2f %9.2f %6.2f   %8.1f (%d)      %8.1f "
                    "           %8.1f (x%d)   %6.1f/%.1f/%.1f\n",
                    i + 1, e.layout.describe().c_str(), 1e3 * e.step_seconds(), 1e3 * t.compute, 1e3 * t.tp_comm,
                    1e3 * t.pp_comm, 1e3 * t.bubble, 1e3 * t.dp_comm, 1e3 * t.optimizer, mib(e.peak_bytes()),
                    e.heaviest_stage(), mib(m.parameters + m.gradients + m.optimizer + m.buckets), mib(m.activations),
                    m.live_microbatches, mib(e.bytes.tp), mib(e.bytes.pp), mib(e.bytes.dp));
      out += line;
    }
    if (ranked.size() > top) out += pmt::detail::str("... and ", ranked.size() - top, " more that run\n");
    if (!ranked.empty()) out += "why rank 1: " + explain() + "\n";
    // rejections: grouped by reason, each with an example
    std::map<std::string, std::vector<std::string>> by_reason;
    for (const auto& r : rejected) {
      std::string key = r.reason;
      if (key.rfind("needs ", 0) == 0) key = "does not fit in memory";
      by_reason[key].push_back(r.layout.describe() + (key == r.reason ? "" : ": " + r.reason));
    }
    if (!rejected.empty()) out += pmt::detail::str("rejected: ", rejected.size(), " layouts\n");
    for (const auto& [reason, which] : by_reason) {
      out += pmt::detail::str("  ", which.size(), " x ", reason, "\n");
      for (std::size_t i = 0; i < which.size() && i < 3; ++i) out += "      e.g. " + which[i] + "\n";
    }
    return out;
  }

  /// \brief One line on why the best beats the runner-up and the best of each other (dp, tp, pp).
  std::string explain() const {
    if (ranked.empty()) return "nothing runs";
    const auto& b = ranked.front();
    using detail::fixed;
    std::string out =
        pmt::detail::str(b.layout.describe(), " is predicted at ", fixed(1e3 * b.step_seconds(), 2), " ms");
    for (std::size_t i = 1; i < ranked.size(); ++i) {
      const auto& o = ranked[i];
      if (o.layout.dp == b.layout.dp && o.layout.tp == b.layout.tp && o.layout.pp == b.layout.pp) continue;
      const char* names[] = {"compute", "tp comm", "pp comm", "bubble", "dp comm", "optimizer"};
      const double d[]    = {o.time.compute - b.time.compute, o.time.tp_comm - b.time.tp_comm,
                             o.time.pp_comm - b.time.pp_comm, o.time.bubble - b.time.bubble,
                             o.time.dp_comm - b.time.dp_comm, o.time.optimizer - b.time.optimizer};
      int k               = 0;
      for (int j = 1; j < 6; ++j)
        if (d[j] > d[k]) k = j;
      out += pmt::detail::str("; the next other (dp, tp, pp), ", o.layout.describe(), ", takes ",
                              fixed(1e3 * o.step_seconds(), 2), " ms (mostly more ", names[k], ": +",
                              fixed(1e3 * d[k], 2), " ms)");
      break;
    }
    return out;
  }
};

/// \brief Every layout of the machine's ranks for the problem, predicted and ranked.
inline Plan search(const Problem& pr, const Machine& mc, const SearchOptions& o = {}) {
  pmt::detail::require<ConfigError>(mc.ranks >= 1, "pmt::plan::search", [&] {
    return pmt::detail::str("the machine has ", mc.ranks, " ranks; expected >= 1");
  });
  Plan plan;
  plan.problem = pr;
  plan.machine = mc;
  const int R  = mc.ranks;
  detail::StagePlans stages(pr);
  for (int tp = 1; tp <= R; ++tp) {
    if (R % tp) continue;
    for (int pp = 1; pp <= R / tp; ++pp) {
      if ((R / tp) % pp) continue;
      const int dp = R / tp / pp;
      Layout base{dp, tp, pp, 1, parallel::ScheduleKind::OneFOneB, false};
      // divisibility of the model and batch first: one rejection per (dp, tp, pp)
      const std::string why = why_invalid(pr, base, R);
      if (!why.empty()) {
        plan.rejected.push_back({base, why});
        continue;
      }
      const int local = static_cast<int>(pr.batch) / dp;
      for (int m = 1; m <= std::min(local, o.max_microbatches); ++m) {
        if (local % m) continue;
        // schedules: 1F1B, GPipe, then interleaved 1F1B with 2 ... max_chunks chunks
        const int schedules = 1 + (pp > 1 && o.allow_gpipe ? 1 : 0) + (pp > 1 ? std::max(0, o.max_chunks - 1) : 0);
        for (int sched = 0; sched < schedules; ++sched) {
          const bool gpipe = sched == 1 && pp > 1 && o.allow_gpipe;
          const int chunks = sched == 0 || gpipe ? 1 : sched - (o.allow_gpipe ? 1 : 0) + 1;
          // the dp modes (one, sync, with dp 1), each with AdamW, and ZeRO-1, -2 and -3 with sync
          std::vector<std::pair<DpChoice, int>> modes;
          for (const auto& c : dp > 1 ? o.dp_modes : std::vector<DpChoice>{DpChoice{}}) modes.push_back({c, 0});
          if (dp > 1 && o.allow_zero) modes.push_back({DpChoice{}, 1});
          if (dp > 1 && o.allow_zero && o.allow_zero2) modes.push_back({DpChoice{}, 2});
          if (dp > 1 && o.allow_zero && o.allow_zero3) modes.push_back({DpChoice{}, 3});
          bool zero1_fits = false,
               zero2_fits = false;  // ranked: as it was, or with sequence parallelism or recomputation
          for (const auto& [choice, zero] : modes) {
            // ZeRO-2 reduce-scatters every microbatch: with several, only where ZeRO-1 does not fit
            // even with sequence parallelism and recomputation
            if (zero == 2 && m > 1 && zero1_fits) continue;
            if (zero == 3 && (zero1_fits || zero2_fits)) continue;  // ZeRO-3 where nothing else fits
            Layout l{dp,   tp,     pp,    m, gpipe ? parallel::ScheduleKind::GPipe : parallel::ScheduleKind::OneFOneB,
                     zero, chunks, choice};
            if (chunks > 1 && !why_invalid(pr, l, R).empty()) continue;  // too few layers, or m not a multiple of pp
            Estimate e = detail::estimate_on(pr, mc, l, stages(pp * chunks));
            if (mc.memory_bytes > 0 && e.peak_bytes() > mc.memory_bytes) {
              // when (and only when) memory requires it, the least that fits, in this order:
              // sequence parallelism where tp > 1 (it recomputes nothing, and stays on in what
              // follows), the attention's recomputation, whole blocks' recomputation; each on as
              // few of the first stages as fit
              const bool seq = o.allow_sequence_parallel && tp > 1 && pr.spec.empty();
              std::vector<std::array<bool, 3>> tries;  // sequence parallel, attention, blocks
              if (seq) tries.push_back({true, false, false});
              if (o.allow_recompute && pr.spec.empty()) tries.push_back({seq, true, false});
              if (o.allow_recompute) tries.push_back({seq, false, true});
              const auto with = [&](const std::array<bool, 3>& t) {
                Layout r            = l;
                r.sequence_parallel = t[0], r.recompute_attention = t[1], r.recompute = t[2];
                return r;
              };
              // sized by the memory model alone with this layout's live microbatches (the same
              // schedule), then the one that fits estimated in full
              std::vector<int> live;
              for (const auto& mem : e.memory) live.push_back(mem.live_microbatches);
              for (const auto& t : tries) {
                Layout r = with(t);
                if (!why_invalid(pr, r, R).empty() ||
                    detail::peak_bytes_on(pr, mc, r, stages(pp * chunks), live, nullptr) > mc.memory_bytes)
                  continue;
                // recomputation on the first stages only, as few as fit (1F1B: the first hold the
                // most live microbatches)
                if ((r.recompute || r.recompute_attention) && pp > 1)
                  for (int k = 1; k < pp; ++k) {
                    Layout fewer           = r;
                    fewer.recompute_stages = k;
                    if (detail::peak_bytes_on(pr, mc, fewer, stages(pp * chunks), live, nullptr) <= mc.memory_bytes) {
                      r = fewer;
                      break;
                    }
                  }
                e = detail::estimate_on(pr, mc, r, stages(pp * chunks)), l = r;
                break;
              }
            }
            if (mc.memory_bytes > 0 && e.peak_bytes() > mc.memory_bytes) {
              plan.rejected.push_back(
                  {l, pmt::detail::str("needs ", detail::fixed(e.peak_bytes() / 1048576.0), " MiB on stage ",
                                       e.heaviest_stage(), " > ", detail::fixed(mc.memory_bytes / 1048576.0),
                                       " MiB per rank")});
              continue;
            }
            if (zero == 1) zero1_fits = true;
            if (zero == 2) zero2_fits = true;
            plan.ranked.push_back(std::move(e));
          }
        }
      }
    }
  }
  std::stable_sort(plan.ranked.begin(), plan.ranked.end(), [](const Estimate& a, const Estimate& b) {
    const double ta = a.step_seconds(), tb = b.step_seconds();
    if (std::abs(ta - tb) > 0.01 * std::min(ta, tb)) return ta < tb;
    if (a.peak_bytes() != b.peak_bytes()) return a.peak_bytes() < b.peak_bytes();
    if (a.layout.microbatches != b.layout.microbatches) return a.layout.microbatches < b.layout.microbatches;
    return a.layout.chunks < b.layout.chunks;
  });
  return plan;
}

}  // namespace pmt::plan
