// SPDX-License-Identifier: Apache-2.0
// Including the library installs nothing and starts nothing: a program that includes
// <pmt/pmt.hpp> (and links what pmt::pmt links) has, before its main does anything, the default
// handlers for the stop signals and one thread. The run harness (pmt/run.hpp) is what installs
// handlers and starts the watchdog thread, and only when a program asks.
// Its own main: the test main would start MPI and Kokkos.

#include <pmt/pmt.hpp>

#include <csignal>
#include <cstdio>
#include <filesystem>

int main() {
  int bad = 0;
  for (int sig : {SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGHUP}) {
    struct sigaction sa {};
    sigaction(sig, nullptr, &sa);
    if (sa.sa_handler != SIG_DFL) {
      std::fprintf(stderr, "signal %d has a handler before main did anything\n", sig);
      ++bad;
    }
  }
  std::size_t threads = 0;
  for ([[maybe_unused]] const auto& task : std::filesystem::directory_iterator("/proc/self/task")) ++threads;
  if (threads != 1) {
    std::fprintf(stderr, "%zu threads run before main did anything; expected 1\n", threads);
    ++bad;
  }
  if (bad == 0) std::printf("umbrella: default signal handlers, 1 thread\n");
  return bad == 0 ? 0 : 1;
}
