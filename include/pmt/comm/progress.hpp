// SPDX-License-Identifier: Apache-2.0
#pragma once
// Manual progress of non-blocking communication during long computations (core/progress.hpp):
// code that owns pending requests (the pipeline runner) installs a ProgressScope with a function
// that polls them; long computations call pmt::progress() at their progress points.
//   pmt::comm::ProgressScope scope([&] { for (auto& rq : pending) rq.test(); });

#include "pmt/core/progress.hpp"
#include "pmt/core/step_context.hpp"

#include <functional>
#include <utility>

namespace pmt::comm {

/// \brief pmt::progress(), for code that polls from the communication side.
using pmt::progress;

/// \brief Makes progress() call `poll` on this thread for the scope's lifetime (scopes nest).
class ProgressScope {
 public:
  explicit ProgressScope(std::function<void()> poll) : m_poll(std::move(poll)), m_installed(&m_poll) {}

 private:
  std::function<void()> m_poll;  // declared first: constructed before, destroyed after the scope
  pmt::detail::FieldScope<const std::function<void()>*, &StepContext::progress> m_installed;
};

}  // namespace pmt::comm
