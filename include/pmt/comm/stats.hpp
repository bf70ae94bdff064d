// SPDX-License-Identifier: Apache-2.0
#pragma once
// Time spent in communication on this thread: every blocking collective, send and receive, and
// every Request::wait adds its wall time and one call (steady_clock, about 20 ns per call).
// Programs read it to report "time in comms": take comm_time() before and after a step.
//   const double c0 = pmt::comm::comm_time().seconds;  ...step...;  comm_s = comm_time().seconds - c0;

#include <atomic>
#include <chrono>
#include <cstdint>

namespace pmt::comm {

/// \brief Accumulated communication time and number of calls of this thread.
struct CommTime {
  double seconds      = 0;
  std::uint64_t calls = 0;
};

/// \brief This thread's accumulated communication time.
inline CommTime& comm_time() noexcept {
  static thread_local CommTime t;
  return t;
}

/// \brief What the process waits for now (comm/watchdog.hpp reads it from another thread): the
/// operation of the outermost blocking communication call in progress (nullptr: none) and the
/// steady_clock time (ns since its epoch) when it began.
struct WaitState {
  std::atomic<const char*> op{nullptr};
  std::atomic<std::int64_t> since_ns{0};
};

/// \brief The process's wait state.
inline WaitState& wait_state() noexcept {
  static WaitState w;
  return w;
}

}  // namespace pmt::comm

namespace pmt::detail {

/// Adds the lifetime of the object to comm_time() (nested timers count once) and, while the
/// outermost one lives, names its operation in wait_state().
class CommTimer {
 public:
  explicit CommTimer(const char* op = "communication") noexcept
      : m_outer(depth()++ == 0), m_start(std::chrono::steady_clock::now()) {
    if (!m_outer) return;
    auto& w = comm::wait_state();
    w.since_ns.store(m_start.time_since_epoch().count());
    w.op.store(op);
  }
  ~CommTimer() {
    --depth();
    if (!m_outer) return;
    comm::wait_state().op.store(nullptr);
    auto& t = comm::comm_time();
    t.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - m_start).count();
    ++t.calls;
  }
  CommTimer(const CommTimer&)            = delete;
  CommTimer& operator=(const CommTimer&) = delete;

 private:
  static int& depth() noexcept {
    static thread_local int d = 0;
    return d;
  }
  bool m_outer;
  std::chrono::steady_clock::time_point m_start;
};

}  // namespace pmt::detail
