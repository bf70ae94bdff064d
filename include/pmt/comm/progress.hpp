// SPDX-License-Identifier: Apache-2.0
#pragma once
// Manual progress of non-blocking communication during long computations (core/progress.hpp):
// code that owns pending requests (the pipeline runner) installs a ProgressScope with a function
// that polls them; long computations call pmt::progress() at their progress points.
//   pmt::comm::ProgressScope scope([&] { for (auto& rq : pending) rq.test(); });

#include "pmt/core/progress.hpp"

#include <functional>
#include <utility>

namespace pmt::comm {

/// \brief pmt::progress(), for code that polls from the communication side.
using pmt::progress;

/// \brief Makes progress() call `poll` on this thread for the scope's lifetime (scopes nest).
class ProgressScope {
 public:
  explicit ProgressScope(std::function<void()> poll) : m_poll(std::move(poll)), m_previous(pmt::detail::progress_hook) {
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
