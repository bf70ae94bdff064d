// SPDX-License-Identifier: Apache-2.0
#pragma once
// MemoryTracker: the bytes of Kokkos allocations this process holds, now and at its peak, per
// memory space ("Host", "Cuda", ...), from Kokkos Tools' allocate / deallocate callbacks (Kokkos
// 3.4 and 4.x). It counts exactly what pmt's planner predicts (parameters, gradients, optimizer
// state, activations, buffers), without the runtime's own memory (MPI, OpenBLAS, the allocator).
//   auto& mem = pmt::obs::MemoryTracker::instance();
//   mem.enable();             // after Kokkos::initialize; a user's loaded tool keeps its callbacks
//   ... build the model, train ...
//   mem.peak_bytes("Host");   // the high-water mark since enable() or reset_peak()
//   mem.allocations();        // how many allocations since enable() or reset_allocations()
//   mem.enable_breakdown();   // and what was held at the peak, by label:
//   mem.peak_breakdown("Host");  // {"pmt::ops::attention::att", 1048576}, ... largest first
// Only allocations made after enable() count (a deallocation of an older one is ignored). The
// callbacks chain to those installed before (a Kokkos Tools library keeps seeing every event);
// enable(false) puts the previous ones back. Not for concurrent allocation from several threads
// beyond what its mutex serialises; Kokkos allocates from the calling host thread.

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace pmt::obs {

/// \brief The bytes of Kokkos allocations held now and at the peak, per memory space, and the
/// number of allocations (see the file comment). One per process: instance().
class MemoryTracker {
 public:
  static MemoryTracker& instance() {
    static MemoryTracker t;
    return t;
  }

  /// \brief Starts (or stops) counting. Idempotent.
  void enable(bool on = true) {
    std::lock_guard<std::mutex> lock(m_mutex);
    if (on == m_on) return;
    if (on) {
      const auto cbs = Kokkos::Tools::Experimental::get_callbacks();
      m_prev_alloc   = cbs.allocate_data;
      m_prev_dealloc = cbs.deallocate_data;
      Kokkos::Tools::Experimental::set_allocate_data_callback(&MemoryTracker::on_allocate);
      Kokkos::Tools::Experimental::set_deallocate_data_callback(&MemoryTracker::on_deallocate);
    } else {
      Kokkos::Tools::Experimental::set_allocate_data_callback(m_prev_alloc);
      Kokkos::Tools::Experimental::set_deallocate_data_callback(m_prev_dealloc);
    }
    m_on = on;
  }
  bool enabled() const noexcept { return m_on; }

  /// \brief Bytes held now in memory space `space` ("Host", "Cuda", ...; empty: all spaces).
  std::uint64_t current_bytes(const std::string& space = "") const { return sum(space, &Counter::current); }
  /// \brief The most bytes held at once since enable() or reset_peak().
  std::uint64_t peak_bytes(const std::string& space = "") const { return sum(space, &Counter::peak); }
  /// \brief Kokkos allocations since enable() or reset_allocations(), and the labels of the
  /// first 64 of them (a training step after the first makes none: core/workspace.hpp).
  std::uint64_t allocations() const {
    std::lock_guard<std::mutex> lock(m_mutex);
    return m_allocations;
  }
  std::vector<std::string> allocation_labels() const {
    std::lock_guard<std::mutex> lock(m_mutex);
    return m_labels;
  }
  void reset_allocations() {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_allocations = 0;
    m_labels.clear();
  }
  /// \brief The peak restarts from what is held now (e.g. after setup, to see one step's peak).
  void reset_peak() {
    std::lock_guard<std::mutex> lock(m_mutex);
    for (auto& [name, c] : m_spaces) {
      c.peak = c.current, c.peak_pending = false;
      if (m_breakdown) c.at_peak = by_label(name);
    }
  }
  /// \brief Also keeps, per memory space, what was held at the peak by allocation label (off by
  /// default: each new high-water mark that is left again costs a pass over what is held).
  void enable_breakdown(bool on = true) {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_breakdown = on;
  }
  /// \brief What was held at the peak of memory space `space` since enable_breakdown() or
  /// reset_peak(), summed per allocation label, largest first. Allocations made before enable()
  /// are not in it (as they are not in peak_bytes()).
  std::vector<std::pair<std::string, std::uint64_t>> peak_breakdown(const std::string& space) const {
    std::lock_guard<std::mutex> lock(m_mutex);
    const auto it = m_spaces.find(space);
    if (it == m_spaces.end()) return {};
    auto held = it->second.peak_pending ? by_label(space) : it->second.at_peak;
    std::vector<std::pair<std::string, std::uint64_t>> out(held.begin(), held.end());
    std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    return out;
  }

 private:
  struct Counter {
    std::uint64_t current = 0, peak = 0;
    bool peak_pending = false;                     ///< the peak rose and has not been left yet
    std::map<std::string, std::uint64_t> at_peak;  ///< by label, when the peak was last left
  };
  struct Live {
    std::string space, label;
    std::uint64_t size;
  };
  MemoryTracker() = default;

  std::map<std::string, std::uint64_t> by_label(const std::string& space) const {
    std::map<std::string, std::uint64_t> held;
    for (const auto& [ptr, a] : m_live)
      if (a.space == space) held[a.label] += a.size;
    return held;
  }

  std::uint64_t sum(const std::string& space, std::uint64_t Counter::*field) const {
    std::lock_guard<std::mutex> lock(m_mutex);
    std::uint64_t total = 0;
    for (const auto& [name, c] : m_spaces)
      if (space.empty() || name == space) total += c.*field;
    return total;
  }
  static void on_allocate(Kokkos::Tools::SpaceHandle handle, const char* label, const void* ptr, std::uint64_t size) {
    auto& t = instance();
    {
      std::lock_guard<std::mutex> lock(t.m_mutex);
      Counter& c = t.m_spaces[handle.name];
      c.current += size;
      if (c.current > c.peak) c.peak = c.current, c.peak_pending = t.m_breakdown;
      t.m_live[ptr] = {handle.name, label != nullptr ? label : "", size};
      ++t.m_allocations;
      if (t.m_allocations <= 64) t.m_labels.emplace_back(label != nullptr ? label : "");
    }
    if (t.m_prev_alloc) t.m_prev_alloc(handle, label, ptr, size);
  }
  static void on_deallocate(Kokkos::Tools::SpaceHandle handle, const char* label, const void* ptr, std::uint64_t size) {
    auto& t = instance();
    {
      std::lock_guard<std::mutex> lock(t.m_mutex);
      const auto it = t.m_live.find(ptr);
      if (it != t.m_live.end()) {
        Counter& c = t.m_spaces[it->second.space];
        if (c.peak_pending) c.at_peak = t.by_label(it->second.space), c.peak_pending = false;
        c.current -= it->second.size;
        t.m_live.erase(it);
      }
    }
    if (t.m_prev_dealloc) t.m_prev_dealloc(handle, label, ptr, size);
  }

  mutable std::mutex m_mutex;
  bool m_on = false;
  std::map<std::string, Counter> m_spaces;
  std::unordered_map<const void*, Live> m_live;
  bool m_breakdown            = false;
  std::uint64_t m_allocations = 0;
  std::vector<std::string> m_labels;
  // the callback types, spelled the same way in Kokkos 3.4 and 4.x
  using AllocateFn            = decltype(Kokkos::Tools::Experimental::EventSet{}.allocate_data);
  using DeallocateFn          = decltype(Kokkos::Tools::Experimental::EventSet{}.deallocate_data);
  AllocateFn m_prev_alloc     = nullptr;
  DeallocateFn m_prev_dealloc = nullptr;
};

}  // namespace pmt::obs
