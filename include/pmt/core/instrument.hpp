// SPDX-License-Identifier: Apache-2.0
#pragma once
// Instrumentation that costs nothing when nobody listens:
//   - Kokkos Tools regions (Kokkos::Tools::pushRegion / popRegion, in Kokkos 3.4 and 4.x alike;
//     3.4 has no ScopedRegion), made only when a tool library is loaded, so a user's Kokkos
//     Tools (e.g. the space-time stack) shows pmt's structure: pmt::<area>::<what>;
//   - the trace recorder (off by default): complete events per rank on tracks (compute, p2p,
//     collectives, optimizer) with begin and end times, and flow ids linking a send to its recv.
//     obs/trace.hpp gathers the ranks' events and writes one Chrome-trace / Perfetto JSON.
//   { pmt::Instrument in("pmt::nn::Linear::forward"); ... }                      // region only
//   { pmt::Instrument in("pmt::parallel::forward", pmt::Track::Compute, "forward 3"); ... }  // + event
// When neither is on, an Instrument is two branches.

#include <Kokkos_Core.hpp>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace pmt {

/// \brief Where an event sits in the timeline of its rank.
enum class Track : int { Compute = 0, P2P = 1, Collective = 2, Optimizer = 3, Checkpoint = 4 };

/// \brief How many tracks there are.
inline constexpr int track_count = 5;

/// \brief "compute", "p2p", "collectives", "optimizer" or "checkpoint".
inline const char* track_name(Track t) {
  switch (t) {
    case Track::Compute:
      return "compute";
    case Track::P2P:
      return "p2p";
    case Track::Collective:
      return "collectives";
    case Track::Optimizer:
      return "optimizer";
    case Track::Checkpoint:
      return "checkpoint";
  }
  return "?";
}

/// \brief One complete event: seconds on this rank's steady clock. A send carries flow_out, its
/// recv flow_in (the same id on both ranks); -1 when none.
struct TraceEvent {
  std::string name;
  Track track  = Track::Compute;
  double begin = 0, end = 0;
  std::int64_t flow_out = -1, flow_in = -1;
};

/// \brief This process's trace recorder (off by default).
class TraceRecorder {
 public:
  static TraceRecorder& instance() {
    static TraceRecorder r;
    return r;
  }
  bool enabled() const noexcept { return m_enabled; }
  void enable(bool on = true) noexcept { m_enabled = on; }
  static double now() noexcept {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  void record(TraceEvent e) {
    if (!m_enabled) return;
    const std::lock_guard<std::mutex> lock(m_mu);
    m_events.push_back(std::move(e));
  }
  /// The events so far, a copy (another thread, e.g. a watchdog's, may read while the run records).
  std::vector<TraceEvent> events() const {
    const std::lock_guard<std::mutex> lock(m_mu);
    return m_events;
  }
  void clear() {
    const std::lock_guard<std::mutex> lock(m_mu);
    m_events.clear();
  }

 private:
  bool m_enabled = false;
  mutable std::mutex m_mu;
  std::vector<TraceEvent> m_events;
};

#if defined(PMT_DISABLE_INSTRUMENTATION)
/// \brief Compiled out (PMT_DISABLE_INSTRUMENTATION): the baseline of bench/trace_overhead.py.
class Instrument {
 public:
  explicit Instrument(const char*) noexcept {}
  template <class Name>
  Instrument(const char*, Track, Name&&, std::int64_t = -1, std::int64_t = -1) noexcept {}
  Instrument(const Instrument&)            = delete;
  Instrument& operator=(const Instrument&) = delete;
};
#else
/// \brief RAII: a Kokkos Tools region named `region` (when a tool is loaded) and, when the trace
/// recorder is on and `event` is given, a complete event on `track`.
class Instrument {
 public:
  /// \brief A region only.
  explicit Instrument(const char* region) : m_region(Kokkos::Tools::profileLibraryLoaded()) {
    if (m_region) Kokkos::Tools::pushRegion(region);
  }
  /// \brief A region and, with the recorder on, the event `event` on `track`.
  Instrument(const char* region, Track track, const char* event, std::int64_t flow_out = -1, std::int64_t flow_in = -1)
      : Instrument(region) {
    if (TraceRecorder::instance().enabled())
      start(std::string(event != nullptr ? event : "?"), track, flow_out, flow_in);
  }
  /// \brief With a computed event name (built only when the recorder is on).
  template <class NameFn, class = decltype(std::string(std::declval<NameFn>()()))>
  Instrument(const char* region, Track track, NameFn&& name, std::int64_t flow_out = -1, std::int64_t flow_in = -1)
      : Instrument(region) {
    if (TraceRecorder::instance().enabled()) start(std::string(name()), track, flow_out, flow_in);
  }
  ~Instrument() {
    if (m_trace) {
      m_event.end = TraceRecorder::now();
      TraceRecorder::instance().record(std::move(m_event));
    }
    if (m_region) Kokkos::Tools::popRegion();
  }
  Instrument(const Instrument&)            = delete;
  Instrument& operator=(const Instrument&) = delete;

 private:
  void start(std::string name, Track track, std::int64_t flow_out, std::int64_t flow_in) {
    m_trace          = true;
    m_event.name     = std::move(name);
    m_event.track    = track;
    m_event.flow_out = flow_out;
    m_event.flow_in  = flow_in;
    m_event.begin    = TraceRecorder::now();
  }
  bool m_region, m_trace = false;
  TraceEvent m_event;
};

#endif  // PMT_DISABLE_INSTRUMENTATION

}  // namespace pmt
