// SPDX-License-Identifier: Apache-2.0
#pragma once
// Manual progress of non-blocking communication during long computations. MPI moves a large
// message (rendezvous protocol) only while the sending and the receiving rank are inside MPI, so
// a send posted before a long compute would otherwise wait for the compute to end. Code that
// owns pending requests (the pipeline runner) installs a ProgressScope with a function that polls
// them; long computations (a model between its blocks) call pmt::comm::progress(). Without a
// scope progress() does nothing and costs one branch.
//   pmt::comm::ProgressScope scope([&] { for (auto& rq : pending) rq.test(); });
//   for (auto& block : blocks) { x = block.forward(exec, x); pmt::comm::progress(); }

#include <functional>
#include <utility>

namespace pmt::detail {
inline thread_local const std::function<void()>* progress_hook = nullptr;
}  // namespace pmt::detail

namespace pmt::comm {

/// \brief Polls the pending operations of the innermost ProgressScope of this thread, if any.
inline void progress() {
  if (pmt::detail::progress_hook != nullptr) (*pmt::detail::progress_hook)();
}

/// \brief Makes progress() call `poll` on this thread for the scope's lifetime (scopes nest).
class ProgressScope {
 public:
  explicit ProgressScope(std::function<void()> poll)
      : m_poll(std::move(poll)), m_previous(pmt::detail::progress_hook) {
    pmt::detail::progress_hook = &m_poll;
  }
  ~ProgressScope() { pmt::detail::progress_hook = m_previous; }
  ProgressScope(const ProgressScope&)            = delete;
  ProgressScope& operator=(const ProgressScope&) = delete;

 private:
  std::function<void()> m_poll;
  const std::function<void()>* m_previous;
};

}  // namespace pmt::comm
