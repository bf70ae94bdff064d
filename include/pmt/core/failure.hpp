// SPDX-License-Identifier: Apache-2.0
#pragma once
// A rank that failed. When an exception leaves a training step (Trainer::step, Trainer::evaluate)
// on one rank, the other ranks may be waiting, or about to wait, for a message or a collective
// that this rank will never enter: the job cannot finish. The step records the failure here
// (which rank, where: the pipeline stage, microbatch and action, and the error's message) and
// rethrows, so the program's own `catch` still runs (to log, write its trace and metrics). From
// then on no pmt destructor waits for a pending operation (comm::Request abandons it and keeps its
// buffers alive), and pmt::ScopeGuard, when the program leaves main, ends the whole job
// (MPI_Abort) instead of finalising beside ranks that wait forever; a program that runs MPI
// itself calls pmt::ScopeGuard::end_job_if_failed() (comm/process.hpp) last. A failure that every rank raised
// alike (comm::agree_on_errors: checkpoints, the Trainer's checks) leaves no rank waiting and is
// not recorded.

#include <exception>
#include <mutex>
#include <string>

namespace pmt {

namespace detail {
struct FailureRecord {
  std::mutex mu;
  std::string why;       // empty: this rank has not failed
  bool primary = false;  // the record names the error itself (not only an abandoned operation)
};
inline FailureRecord& failure_record() {
  static FailureRecord r;
  return r;
}

/// The message of a caught exception: what() of a std::exception, else a sentence saying so.
inline std::string message_of(const std::exception_ptr& error) {
  try {
    if (error) std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
  }
  return "an exception that is not a std::exception";
}
}  // namespace detail

/// \brief Records that this rank cannot finish the job's communication, and why. The first
/// primary record wins (it names the original error); a secondary one (an operation abandoned
/// while the error unwound the stack, recorded before the step's own record) only stands until a
/// primary one comes.
inline void note_failure(const std::string& why, bool primary = true) {
  auto& r = detail::failure_record();
  const std::lock_guard<std::mutex> lock(r.mu);
  if (r.primary || (!primary && !r.why.empty())) return;
  r.why     = why.empty() ? std::string("an error") : why;
  r.primary = primary;
}

/// \brief Whether this rank has failed (note_failure was called).
inline bool rank_failed() {
  auto& r = detail::failure_record();
  const std::lock_guard<std::mutex> lock(r.mu);
  return !r.why.empty();
}

/// \brief Why this rank failed ("" when it has not).
inline std::string failure_reason() {
  auto& r = detail::failure_record();
  const std::lock_guard<std::mutex> lock(r.mu);
  return r.why;
}

/// \brief Forgets a recorded failure (tests that provoke one and go on in the same process).
inline void clear_failure() {
  auto& r = detail::failure_record();
  const std::lock_guard<std::mutex> lock(r.mu);
  r.why.clear();
  r.primary = false;
}

}  // namespace pmt
