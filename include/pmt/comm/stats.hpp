// SPDX-License-Identifier: Apache-2.0
#pragma once
// Time spent in communication on this thread: every blocking collective, send and receive, and
// every Request::wait adds its wall time and one call (steady_clock, about 20 ns per call).
// Programs read it to report "time in comms": take comm_time() before and after a step.
//   const double c0 = pmt::comm::comm_time().seconds;  ...step...;  comm_s = comm_time().seconds - c0;

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

}  // namespace pmt::comm

namespace pmt::detail {

/// Adds the lifetime of the object to comm_time() (nested timers count once).
class CommTimer {
 public:
  CommTimer() noexcept : m_outer(depth()++ == 0), m_start(std::chrono::steady_clock::now()) {}
  ~CommTimer() {
    --depth();
    if (!m_outer) return;
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
