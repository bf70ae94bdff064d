// SPDX-License-Identifier: Apache-2.0
#pragma once
// Progress points: places between units of a long computation (a model between its layers or
// blocks) where whoever owns pending non-blocking communication may poll it. MPI moves a large
// message (rendezvous protocol) only while both ranks are inside MPI, so a send posted before a
// long compute would otherwise wait for the compute to end. A model calls pmt::progress() and
// knows nothing about communication; the parallel layer (the pipeline runner, through
// comm::ProgressScope) installs what it polls. Without a scope progress() costs one branch.
//   for (auto& block : blocks) { x = block.forward(exec, x); pmt::progress(); }

#include <functional>

namespace pmt::detail {
inline thread_local const std::function<void()>* progress_hook = nullptr;
}  // namespace pmt::detail

namespace pmt {

/// \brief Runs the innermost progress hook of this thread, if any (see the file comment).
inline void progress() {
  if (pmt::detail::progress_hook != nullptr) (*pmt::detail::progress_hook)();
}

}  // namespace pmt
