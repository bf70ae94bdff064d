// SPDX-License-Identifier: Apache-2.0
#pragma once
// Progress points: places between units of a long computation (a model between its layers or
// blocks) where whoever owns pending non-blocking communication may poll it. MPI moves a large
// message (rendezvous protocol) only while both ranks are inside MPI, so a send posted before a
// long compute would otherwise wait for the compute to end. A model calls pmt::progress() and
// knows nothing about communication; the parallel layer (the pipeline runner, through
// comm::ProgressScope) installs what it polls, a field of the step context. Without a scope progress() costs one
// branch.
//   for (auto& block : blocks) { x = block.forward(exec, x); pmt::progress(); }

#include "pmt/core/step_context.hpp"  // pmt::progress() and the poll it runs (StepContext::progress)
