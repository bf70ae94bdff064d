// SPDX-License-Identifier: Apache-2.0
#pragma once
// Part of the run harness (pmt/run.hpp): programs include it; the library never does.
// How a training job fails and starts without losing work:
//   JobError       an error every rank raised: all ranks exit with its code; rank 0 reports it,
//                  and so does a rank whose own error it is.
//   agree_errors   collective: one rank's exception becomes a JobError on every rank.
//   preflight      collective, before anything long: the run directory's lock, no fresh run over
//                  old checkpoints (unless asked), leftovers of an interrupted save removed, every
//                  output file and every rank's shard directory checked writable; then the watchdog.
//   run_job        a program's main body: JobErrors become exit codes; an error only this rank
//                  raised ends the whole job (MPI_Abort) rather than leave the others waiting.

#include "pmt/comm/agree.hpp"
#include "pmt/comm/collectives.hpp"
#include "pmt/comm/mpi.hpp"
#include "pmt/core/environment.hpp"
#include "pmt/core/error.hpp"
#include "pmt/io/checkpoint_files.hpp"
#include "pmt/run/command_line.hpp"
#include "pmt/run/lock.hpp"
#include "pmt/run/watchdog.hpp"

#include <Kokkos_Core.hpp>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <stdlib.h>

namespace pmt::run {

/// \brief An error every rank of the job raised (bad input, a checkpoint that cannot be loaded or
/// saved, a non-finite loss): every rank exits with `code`. `alike` false: only some ranks hold
/// the cause; the others hold "... failed on other rank(s)".
struct JobError {
  std::string message;
  bool alike = true;
  int code   = 1;  ///< the exit code
};

/// Collective: raises a JobError on every rank when any rank holds `err` (its own message on that
/// rank, "`what` failed on N other rank(s)" elsewhere).
template <class B>
void agree_errors(const comm::Communicator<B>& world, const std::exception_ptr& err, const char* program,
                  const std::string& what) {
  try {
    comm::agree_on_errors(world, err, program, what);
  } catch (const std::exception& e) {
    throw JobError{e.what(), false};
  }
}

/// Whether `path` can be written, without changing it (a file that did not exist is removed).
/// \throws pmt::IoError naming `program` and `flag`.
inline void probe_writable(const char* program, const std::string& flag, const std::string& path) {
  std::error_code ec;
  const bool existed = std::filesystem::exists(path, ec);
  std::FILE* f       = std::fopen(path.c_str(), "a");
  if (!f) throw IoError(program, flag + " " + path + ": cannot be written (" + std::strerror(errno) + ")");
  std::fclose(f);
  if (!existed) std::filesystem::remove(path, ec);
}

/// What a job's preflight looks at.
struct PreflightOptions {
  const char* program = "pmt";
  std::string ckpt_dir;  ///< the run (checkpoint) directory; empty: none
  bool resume = false, overwrite = false;
  std::string ckpt_flag = "--ckpt-dir";                      ///< the flag that named ckpt_dir
  std::vector<std::pair<std::string, std::string>> outputs;  ///< (flag, file) the root writes
  double watchdog_s = 0;                                     ///< 0: no watchdog
  int watchdog_exit = 4;                                     ///< the watchdog's exit code
  /// Run on the watchdog's thread when it ends this rank, before the exit (what the rank can
  /// keep on its own, e.g. its trace: obs::write_rank_trace); what it throws is ignored.
  std::function<void()> on_watchdog;
};

/// \brief What keeps a run safe while it lasts: the run directory's lock (rank 0), the watchdog
/// and its heartbeat directory (removed by rank 0 at the end, after the watchdog stops).
struct Guards {
  std::unique_ptr<DirectoryLock> lock;
  struct RemoveBeats {
    std::string dir;
    ~RemoveBeats() {
      std::error_code ec;
      if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    }
  } remove_beats;
  std::unique_ptr<Watchdog> watchdog;
};

namespace detail {

/// Rank 0's part: the lock, old checkpoints (refused, or removed with `overwrite`), leftovers.
inline void claim_run_directory(const PreflightOptions& o, Guards& g) {
  namespace fs = std::filesystem;
  g.lock       = std::make_unique<DirectoryLock>(o.ckpt_dir);
  if (!g.lock->note().empty()) std::printf("checkpoints: %s: %s\n", o.ckpt_dir.c_str(), g.lock->note().c_str());
  const auto steps = io::checkpoint_steps(o.ckpt_dir);
  if (!o.resume && !steps.empty()) {
    if (!o.overwrite)
      throw IoError(o.program,
                    pmt::detail::str(o.ckpt_dir, " holds ", steps.size(), " checkpoint(s), the newest ", steps.back(),
                                     ": continue them with --resume, or replace them with --overwrite"));
    std::error_code ec;
    for (const auto& st : steps) fs::remove_all(o.ckpt_dir + "/" + st, ec);
    fs::remove(o.ckpt_dir + "/LATEST", ec);
    std::printf("checkpoints: --overwrite removed %zu checkpoint(s) from %s\n", steps.size(), o.ckpt_dir.c_str());
  }
  const auto gone = io::remove_stale_partials(o.ckpt_dir);
  if (!gone.empty())
    std::printf("checkpoints: removed %zu leftover(s) of an interrupted save from %s\n", gone.size(),
                o.ckpt_dir.c_str());
}

/// Collective: the heartbeat directory rank 0 names (in the run directory, shared by the nodes as
/// a rule, or a fresh temporary one); empty when none could be made.
template <class B>
std::string heartbeat_directory(const comm::Communicator<B>& world, const std::string& ckpt_dir) {
  Kokkos::View<std::int8_t*, Kokkos::HostSpace> name("pmt::run::beats", 4096);
  if (world.rank() == 0) {
    std::string dir = ckpt_dir.empty() ? std::string() : ckpt_dir + "/.heartbeat";
    if (dir.empty()) {
      std::string pattern = (std::filesystem::temp_directory_path() / "pmt-watchdog-XXXXXX").string();
      dir                 = ::mkdtemp(&pattern[0]) ? pattern : std::string();
    }
    std::error_code ec;
    if (!dir.empty()) std::filesystem::create_directories(dir, ec);
    for (std::size_t i = 0; i < dir.size() && i + 1 < name.size(); ++i) name(i) = static_cast<std::int8_t>(dir[i]);
  }
  comm::broadcast(world, Kokkos::DefaultHostExecutionSpace(), name, 0);
  std::string beats;
  for (std::size_t i = 0; i < name.size() && name(i) != 0; ++i) beats += static_cast<char>(name(i));
  return beats;
}

}  // namespace detail

/// Collective, before any training: rank 0 claims the run directory and checks the outputs; then
/// every rank checks that it can write its shards into the directory; then the watchdog starts.
/// \throws JobError on every rank when any check fails on any rank.
template <class B>
std::unique_ptr<Guards> preflight(const comm::Communicator<B>& world, const PreflightOptions& o) {
  auto g = std::make_unique<Guards>();
  std::exception_ptr err;
  if (world.rank() == 0) try {
      if (!o.ckpt_dir.empty()) detail::claim_run_directory(o, *g);
      for (const auto& [flag, file] : o.outputs)
        if (!file.empty()) probe_writable(o.program, flag, file);
    } catch (...) {
      err = std::current_exception();
    }
  agree_errors(world, err, o.program, "the preflight checks");
  if (!o.ckpt_dir.empty()) {
    try {
      probe_writable(o.program, o.ckpt_flag, o.ckpt_dir + "/.write-test-rank-" + std::to_string(world.rank()));
    } catch (...) {
      err = std::current_exception();
    }
    agree_errors(world, err, o.program, "writing into " + o.ckpt_flag);
  }
  if (o.watchdog_s <= 0) return g;
  const std::string beats = detail::heartbeat_directory(world, o.ckpt_dir);
  if (!beats.empty()) {
    const std::string program = o.program;
    const int code            = o.watchdog_exit;
    const auto keep           = o.on_watchdog;
    g->watchdog               = std::make_unique<Watchdog>(
        WatchdogOptions{o.watchdog_s, beats, world.rank(), world.size(), 0},
        [program, code, keep](const std::string& report, bool reporter) {
          if (reporter) {
            std::fprintf(stderr, "%s: error: %s\n", program.c_str(), report.c_str());
            std::fflush(stderr);
          }
          if (keep) try {
              keep();
            } catch (const std::exception& e) {
              std::fprintf(stderr, "%s: %s\n", program.c_str(), e.what());
            } catch (...) {
            }
          if (!reporter) std::this_thread::sleep_for(std::chrono::seconds(3));  // the reporter's message first
          std::fflush(stderr);
          std::_Exit(code);
        });
  }
  if (world.rank() == 0) g->remove_beats.dir = beats;
  return g;
}

/// Runs a program's body (after the ScopeGuard): returns its exit code; a JobError's code (rank 0
/// and the ranks holding its cause report it); for an error this rank alone raised, reports it,
/// runs `on_failure` (what this rank can still keep without the others, e.g. its own trace;
/// what it throws is reported, not raised) and ends the whole job rather than leave the other
/// ranks waiting in a collective.
template <class F, class G = void (*)()>
int run_job(const char* program, F&& body, G&& on_failure = nullptr) {
  const bool root = world_rank() == 0;
  try {
    return body();
  } catch (const JobError& e) {
    if (root || (!e.alike && e.message.find("other rank(s)") == std::string::npos))
      std::fprintf(stderr, "%s: error: %s\n", program, without_program(e.message, program).c_str());
    return e.code;
  } catch (const std::exception& e) {
    if (!root) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::fprintf(stderr, "%s: error: %s\n", program, without_program(e.what(), program).c_str());
    try {
      if constexpr (std::is_pointer_v<std::decay_t<G>>) {
        if (on_failure != nullptr) on_failure();
      } else {
        on_failure();
      }
    } catch (const std::exception& f) {
      std::fprintf(stderr, "%s: %s\n", program, f.what());
    }
#if PMT_ENABLE_MPI
    if (world_size() > 1) pmt::detail::mpi_abort_world();
#endif
    return 1;
  }
}

}  // namespace pmt::run
