// SPDX-License-Identifier: Apache-2.0
#pragma once
// Deterministic token batches for the training tests: any rank can build any slice of a step's
// global batch, so a layout's ranks and the one-rank reference see the same data. And the count
// of Kokkos allocations a piece of code makes (steady-state steps make none).
#include "pmt/obs/memory.hpp"
#include "pmt/train/trainer.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace pmt::test {

/// Sequences [first_seq, first_seq + B) of step `step`'s global batch, Tn tokens each, ids below V.
/// With `ignore`, the target of every (sequence s, position t) with (s + t + step) % 11 == 0 is
/// the ignore index -100.
template <class Ids>
train::Microbatch<Ids> synthetic_batch(int step, std::size_t first_seq, std::size_t B, std::size_t Tn, std::size_t V,
                                       bool ignore = true) {
  train::Microbatch<Ids> mb{Ids("ids", B * Tn), Ids("targets", B * Tn), B, Tn};
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < Tn; ++t) {
      const std::size_t s = first_seq + b, n = b * Tn + t;
      mb.ids(n)     = static_cast<std::int32_t>((step * 131 + s * 31 + t * 7 + 3) % V);
      mb.targets(n) = ignore && (s + t + step) % 11 == 0
                          ? -100
                          : static_cast<std::int32_t>((step * 131 + s * 31 + (t + 1) * 7 + 3) % V);
    }
  return mb;
}

/// The number of counted (not ignored) targets of step `step`'s global batch of B sequences.
inline double valid_targets(int step, std::size_t B, std::size_t Tn, std::size_t V) {
  auto all = synthetic_batch<Kokkos::View<std::int32_t*, Kokkos::LayoutRight, Kokkos::HostSpace>>(step, 0, B, Tn, V);
  double n = 0;
  for (std::size_t i = 0; i < all.targets.size(); ++i) n += all.targets(i) != -100;
  return n;
}

/// What `run` allocates (Kokkos Tools hook), and whether the steady state holds: nothing at all
/// or, with pp > 1, at most two pipeline send buffers (the runner keeps one per send in flight,
/// and how many are in flight at once depends on when the next stage takes them).
struct Allocations {
  std::uint64_t count = 0;
  std::vector<std::string> labels;  // the first 64
  bool steady(int pp) const {
    bool only_sends = pp > 1;
    for (const auto& l : labels) only_sends = only_sends && l == "pmt::parallel::pipeline::send";
    return count == 0 || (only_sends && count <= 2);
  }
  std::string names() const {
    std::string out;
    for (const auto& l : labels) out += " " + l;
    return out;
  }
};
inline Allocations allocations_of(const std::function<void()>& run) {
  auto& mem = obs::MemoryTracker::instance();
  mem.enable();
  mem.reset_allocations();
  run();
  Allocations a{mem.allocations(), mem.allocation_labels()};
  mem.enable(false);
  return a;
}

}  // namespace pmt::test
