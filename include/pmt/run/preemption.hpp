// SPDX-License-Identifier: Apache-2.0
#pragma once
// Part of the run harness (pmt/run.hpp): programs include it; the library never does.
// Preemption: a scheduler's signal (SIGTERM, SIGINT, or SIGUSR1 as Slurm's --signal sends it
// ahead of the time limit) asks the job to stop at the next step boundary, with a checkpoint.
//   pmt::run::install_stop_handlers();                // once, at start-up
//   for (...) { trainer.step(...);
//               if (int sig = pmt::run::agree_stop(world)) { save(...); return exit_preempted; } }
// The handler only records the signal; agree_stop (collective over `world`, one small
// all-reduce) makes every rank stop at the same step when any rank got one, so a signal sent to
// one rank (as Slurm sends it to every task) or forwarded by the launcher stops all alike. A
// second signal ends the process at once (exit code 128 + the signal).
// OpenMPI's mpirun forwards SIGUSR1 and SIGUSR2 to the ranks; SIGTERM or SIGINT makes it tear the
// job down (it stops reading the ranks' output and kills them): stop a job under mpirun with
// SIGUSR1 to mpirun, or with a signal to the ranks.

#include "pmt/comm/collectives.hpp"
#include "pmt/comm/communicator.hpp"

#include <Kokkos_Core.hpp>

#include <atomic>
#include <csignal>

#include <unistd.h>

namespace pmt::run {

namespace detail {

inline std::atomic<int>& signal_seen() noexcept {
  static std::atomic<int> s{0};
  return s;
}

inline void on_signal(int sig) {
  if (signal_seen().exchange(sig) != 0) {  // the second one: end now
    static const char msg[] = "pmt: a second signal: stopping at once, without a checkpoint\n";
    const ssize_t n         = ::write(2, msg, sizeof msg - 1);
    (void)n;
    ::_exit(128 + sig);
  }
}

}  // namespace detail

/// \brief Installs the stop handlers for SIGTERM, SIGINT and SIGUSR1 (see the file comment).
inline void install_stop_handlers() {
  detail::signal_seen().store(0);
  struct sigaction sa {};
  sa.sa_handler = detail::on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) sigaction(sig, &sa, nullptr);
}

/// \brief The signal this process received (0: none).
inline int stop_signal() noexcept { return detail::signal_seen().load(); }

/// \brief Collective over `world`: the largest signal number any rank received (0: none), the
/// same on every rank.
template <class Backend>
int agree_stop(const comm::Communicator<Backend>& world) {
  Kokkos::View<int, Kokkos::HostSpace> sig("pmt::run::stop");
  sig() = stop_signal();
  comm::all_reduce(world, Kokkos::DefaultHostExecutionSpace(), sig, comm::ReduceOp::Max);
  return sig();
}

/// \brief "SIGTERM", "SIGINT", "SIGUSR1" or "signal N".
inline const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "a signal";
  }
}

}  // namespace pmt::run

namespace pmt::train {
/// \brief Deprecated (0.2): pmt::run::install_stop_handlers.
[[deprecated("moved to pmt::run::install_stop_handlers (pmt/run/preemption.hpp)")]] inline void
install_stop_handlers() {
  run::install_stop_handlers();
}
/// \brief Deprecated (0.2): pmt::run::stop_signal.
[[deprecated("moved to pmt::run::stop_signal (pmt/run/preemption.hpp)")]] inline int stop_signal() noexcept {
  return run::stop_signal();
}
/// \brief Deprecated (0.2): pmt::run::agree_stop.
template <class Backend>
[[deprecated("moved to pmt::run::agree_stop (pmt/run/preemption.hpp)")]] int agree_stop(
    const comm::Communicator<Backend>& world) {
  return run::agree_stop(world);
}
/// \brief Deprecated (0.2): pmt::run::signal_name.
[[deprecated("moved to pmt::run::signal_name (pmt/run/preemption.hpp)")]] inline const char* signal_name(int sig) {
  return run::signal_name(sig);
}
}  // namespace pmt::train
