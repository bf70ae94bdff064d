// SPDX-License-Identifier: Apache-2.0
#pragma once
// Asynchronous checkpoints: the files, manifest and LATEST of io::save_checkpoint, written while
// training goes on.
//
//   pmt::io::AsyncCheckpointer saver(mesh);
//   for (int step = 0; step < steps; ++step) {
//     trainer.step(...);
//     saver.poll();                                               // collective: finishes a written save
//     if (step % 100 == 99) saver.save(dir, opt, info, trainer.state());  // collective; returns at once
//   }
//   saver.wait();                                                 // collective: the last save, whole
//
// save() is the step boundary's part: it waits for a save still in flight, then (as the
// blocking save does) makes DIR/step-N.partial and serializes this rank's parameters and
// optimizer state into host memory (one copy of the state, over the host's threads; ZeRO's
// moments gathered over dp first; the buffer is kept for the next save). A background thread
// then refuses a shard holding nan or inf, or writes it (CRC-32, temporary file, fsync, rename),
// touching nothing but its bytes and the file system: no collective, no Kokkos. poll() (every rank at the same step)
// finishes the save once every rank's shard is written: rank 0 writes MANIFEST, renames step-N.partial to step-N and
// replaces LATEST, as the blocking save does; wait() blocks until then. The files are the blocking save's, byte for
// byte. At most one save is in flight. A writer's error (nan or inf in the state, a full disk, a file that cannot be
// made) raises pmt::IoError on every rank at the poll() or wait() that finishes that save; LATEST keeps naming the
// previous checkpoint. The destructor waits for this rank's writer but finishes nothing (a destructor may run on one
// rank only, while unwinding): a save not finished by poll() or wait() stays a .partial directory, never named by
// LATEST and never loaded (remove_stale_partials removes it). A crash or kill at any moment leaves LATEST naming a
// whole checkpoint. A CUDA build copies device state to host memory in save(); the copy is not pinned.
// Test hook (besides the blocking save's PMT_CHECKPOINT_TEST_ABORT): PMT_CHECKPOINT_TEST_SLOW=r:s
// makes world rank r's writer wait 3 s before its shard of step s.

#include "pmt/comm/collectives.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/instrument.hpp"
#include "pmt/io/checkpoint.hpp"

#include <Kokkos_Core.hpp>

#include <atomic>
#include <chrono>
#include <exception>
#include <string>
#include <thread>
#include <utility>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace pmt::io {

/// \brief Saves checkpoints in the background (see the file comment). Every method but
/// in_flight() and the timings is collective over the mesh's world; the saver must not outlive
/// the mesh.
template <class Backend>
class AsyncCheckpointer {
 public:
  /// `writer_nice`: the writer thread's nice value on Linux (0: the training's own priority;
  /// 10, the default, about a tenth of a core while the training keeps every core busy).
  explicit AsyncCheckpointer(const Mesh<Backend>& mesh, int writer_nice = 10) : m_mesh(mesh), m_nice(writer_nice) {}
  AsyncCheckpointer(const AsyncCheckpointer&)            = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;
  /// Waits for this rank's writer; an unfinished save stays DIR/step-N.partial.
  ~AsyncCheckpointer() { join(); }

  /// \brief Starts saving `opt`'s parameters and state (and a Trainer's `extra` states) as step
  /// `info.step` under `dir`: waits for a save in flight first, snapshots at once, writes in the
  /// background. Accepts the optimizers save_checkpoint does (AdamW, Sgd, ZeroAdamW, Zero2AdamW).
  /// \throws pmt::IoError on every rank when the snapshot fails on any (a directory that cannot
  /// be made, two parameters of one name) or when the previous save failed.
  template <class Opt, class States>
  void save(const std::string& dir, const Opt& opt, const CheckpointInfo& info, const States& extra) {
    wait();
    const double t0 = TraceRecorder::now();
    {
      const Instrument span("pmt::io::checkpoint", Track::Checkpoint,
                            [&] { return "snapshot step " + std::to_string(info.step); });
      detail::with_saved_state(opt, extra, [&](const auto& state) {
        detail::snapshot(m_job, dir, m_mesh, state, info);
        return 0;
      });
    }
    m_blocking = TraceRecorder::now() - t0;
    m_error    = nullptr;
    m_done.store(false, std::memory_order_release);
    m_in_flight = true;
    m_writer    = std::thread([this, rank = m_mesh.world().rank(), trace = TraceRecorder::instance().enabled()] {
#if defined(__linux__)
      // the writer yields the cores to the training: about a tenth of a core where they are busy
      setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), m_nice);
#endif
      const double begin = TraceRecorder::now();
      try {
        detail::write_shard(m_job, rank);
      } catch (...) {
        m_error = std::current_exception();
      }
      const double end = TraceRecorder::now();
      m_write_s        = end - begin;
      if (trace)
        TraceRecorder::instance().record(
            {"write shard of step " + std::to_string(m_job.step), Track::Checkpoint, begin, end, -1, -1});
      m_done.store(true, std::memory_order_release);
    });
  }
  /// \brief Without per-parameter states beside the optimizer's.
  template <class Opt>
  void save(const std::string& dir, const Opt& opt, const CheckpointInfo& info) {
    save(dir, opt, info, ParameterStates<typename Opt::value_type, typename Opt::execution_space>{});
  }

  /// \brief Finishes the save in flight when every rank's shard is written (one all-reduce of an
  /// int while one is in flight, nothing otherwise). Returns the step directory it finished, or
  /// an empty string.
  /// \throws pmt::IoError on every rank when a shard could not be written.
  std::string poll() {
    if (!m_in_flight) return {};
    Kokkos::View<int*, Kokkos::HostSpace> done("pmt::io::AsyncCheckpointer::done", 1);
    done(0) = m_done.load(std::memory_order_acquire) ? 1 : 0;
    comm::all_reduce(m_mesh.world(), Kokkos::DefaultHostExecutionSpace(), done, comm::ReduceOp::Min);
    if (done(0) == 0) return {};
    return finish();
  }

  /// \brief Blocks until the save in flight is finished (LATEST names it). Returns its step
  /// directory, or an empty string when none was in flight.
  /// \throws pmt::IoError on every rank when a shard could not be written.
  std::string wait() {
    if (!m_in_flight) return {};
    return finish();
  }

  /// \brief Whether a save was started and not yet finished (alike on every rank).
  bool in_flight() const noexcept { return m_in_flight; }
  /// \brief Seconds the last save() held its caller (the snapshot: waiting for the previous save
  /// not counted).
  double blocking_seconds() const noexcept { return m_blocking; }
  /// \brief Seconds the last finished save's writer took on this rank (CRC-32, write, fsync).
  double writing_seconds() const noexcept { return m_writing; }

 private:
  void join() {
    if (m_writer.joinable()) m_writer.join();
  }
  std::string finish() {
    join();
    m_in_flight = false;
    m_writing   = m_write_s;
    const Instrument span("pmt::io::checkpoint", Track::Checkpoint,
                          [&] { return "finish step " + std::to_string(m_job.step); });
    return detail::finish(m_job, m_mesh, std::exchange(m_error, nullptr));
  }

  const Mesh<Backend>& m_mesh;
  int m_nice;
  detail::SaveJob m_job;  // the save in flight; its buffer is reused
  std::thread m_writer;
  std::atomic<bool> m_done{false};
  std::exception_ptr m_error;  // the writer's, read after join
  bool m_in_flight  = false;
  double m_blocking = 0, m_writing = 0;
  double m_write_s = 0;  // the writer's, read after join
};

}  // namespace pmt::io
