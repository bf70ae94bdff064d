// SPDX-License-Identifier: Apache-2.0
#pragma once
// The umbrella header: the library's public API (layers, ops, communication, parallel layouts,
// training, checkpoints, observability). The tools built on it (the planner and its
// calibration, the token dataset reader, the FMA peak probe) are in pmt/tools.hpp, which the
// library itself never includes. Area headers may be included directly to save compile time,
// but only these two headers carry the stability promise. What a training program needs beyond
// the library (stop signals, the watchdog thread, the run directory lock, fingerprints) is the
// run harness, pmt/run.hpp: including pmt.hpp installs no handler and starts no thread.

#include "pmt/config.hpp"
#include "pmt/version.hpp"

#include "pmt/core/environment.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/instrument.hpp"
#include "pmt/core/measured_choice.hpp"
#include "pmt/core/workspace.hpp"
#include "pmt/policy/axis.hpp"
#include "pmt/policy/hybrid.hpp"
#include "pmt/policy/placement.hpp"
#include "pmt/policy/policies.hpp"
#include "pmt/policy/policy_traits.hpp"

#include "pmt/comm/agree.hpp"
#include "pmt/comm/backend.hpp"
#include "pmt/comm/collectives.hpp"
#include "pmt/comm/communicator.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/comm/process.hpp"
#include "pmt/comm/progress.hpp"
#include "pmt/comm/request.hpp"
#if PMT_ENABLE_MPI
#include "pmt/comm/mpi.hpp"
#endif
#if PMT_ENABLE_NCCL && PMT_ENABLE_MPI
#include "pmt/comm/nccl.hpp"
#endif

#include "pmt/core/random.hpp"
#include "pmt/core/step_context.hpp"
#include "pmt/core/tensor.hpp"

#include "pmt/ops/argmax.hpp"
#include "pmt/ops/attention.hpp"
#include "pmt/ops/cross_entropy.hpp"
#include "pmt/ops/elementwise.hpp"
#include "pmt/ops/embedding.hpp"
#include "pmt/ops/layernorm.hpp"
#include "pmt/ops/matmul.hpp"
#include "pmt/ops/multi_tensor.hpp"
#include "pmt/ops/reduction.hpp"
#include "pmt/ops/softmax.hpp"
#include "pmt/ops/update.hpp"

#include "pmt/core/activation_slot.hpp"
#include "pmt/core/parameter.hpp"
#include "pmt/nn/activation.hpp"
#include "pmt/nn/attention.hpp"
#include "pmt/nn/chain.hpp"
#include "pmt/nn/dropout.hpp"
#include "pmt/nn/embedding.hpp"
#include "pmt/nn/gpt.hpp"
#include "pmt/nn/layernorm.hpp"
#include "pmt/nn/linear.hpp"
#include "pmt/nn/loss.hpp"
#include "pmt/nn/mlp.hpp"
#include "pmt/nn/module.hpp"
#include "pmt/nn/staged_model.hpp"

#include "pmt/comm/stats.hpp"
#include "pmt/io/checkpoint.hpp"
#include "pmt/io/checkpoint_async.hpp"
#include "pmt/nn/gpt_config.hpp"
#include "pmt/obs/memory.hpp"
#include "pmt/obs/trace.hpp"
#include "pmt/optim/clip.hpp"
#include "pmt/optim/optimizers.hpp"
#include "pmt/optim/zero.hpp"
#include "pmt/optim/zero2.hpp"
#include "pmt/optim/zero3.hpp"
#include "pmt/parallel/grad_sync.hpp"
#include "pmt/parallel/pipeline.hpp"
#include "pmt/parallel/schedule.hpp"
#include "pmt/parallel/stage_module.hpp"
#include "pmt/parallel/stages.hpp"
#include "pmt/train/trainer.hpp"
