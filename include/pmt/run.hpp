// SPDX-License-Identifier: Apache-2.0
#pragma once
// The run harness: what a training program needs beyond the library, included by programs
// explicitly (train_gpt does): stop signals and preemption (run/preemption.hpp: installs signal
// handlers when asked), the hung-job watchdog (run/watchdog.hpp: starts a thread when
// constructed), the run directory lock (run/lock.hpp) and the layout-free parameter fingerprint
// (run/fingerprint.hpp), a job's preflight, agreed errors and exit codes (run/job.hpp), Kokkos'
// flags and the ranks' agreement on the command line (run/command_line.hpp), the threads per
// rank (run/threads.hpp), the per-rank report (run/report.hpp) and where ranks compute and how
// they talk (run/placement.hpp: --device, --comm). No header of pmt.hpp includes
// any of them. run/metrics.hpp (JSON lines) needs nlohmann-json and is included on its own.

#include "pmt/pmt.hpp"

#include "pmt/run/command_line.hpp"
#include "pmt/run/fingerprint.hpp"
#include "pmt/run/job.hpp"
#include "pmt/run/lock.hpp"
#include "pmt/run/placement.hpp"
#include "pmt/run/preemption.hpp"
#include "pmt/run/report.hpp"
#include "pmt/run/threads.hpp"
#include "pmt/run/watchdog.hpp"
