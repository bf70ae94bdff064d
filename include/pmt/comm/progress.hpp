// SPDX-License-Identifier: Apache-2.0
#pragma once
// Manual progress of non-blocking communication during long computations (core/progress.hpp):
// code that owns pending requests (the pipeline runner, ZeRO-3's gathers) installs a
// ProgressScope with a function that polls them; long computations call pmt::progress() at their
// progress points.
//   pmt::comm::ProgressScope scope([&] { for (auto& rq : pending) rq.test(); });

#include "pmt/core/progress.hpp"
#include "pmt/core/step_context.hpp"

#include <functional>
#include <utility>

namespace pmt::comm {

/// \brief pmt::progress(), for code that polls from the communication side.
using pmt::progress;

/// \brief Makes progress() call `poll` on this thread for the scope's lifetime. Scopes nest: an
/// inner scope's progress() runs its poll, then the outer scope's (the pipeline runner's inside
/// ZeRO-3's step both move).
class ProgressScope {
 public:
  explicit ProgressScope(std::function<void()> poll)
      : m_poll(chained(std::move(poll), step_context().progress)), m_installed(&m_poll) {}

 private:
  static std::function<void()> chained(std::function<void()> poll, const std::function<void()>* outer) {
    if (outer == nullptr) return poll;
    return [poll = std::move(poll), outer] {
      poll();
      (*outer)();
    };
  }
  std::function<void()> m_poll;  // declared first: constructed before, destroyed after the scope
  pmt::detail::FieldScope<const std::function<void()>*, &StepContext::progress> m_installed;
};

}  // namespace pmt::comm
