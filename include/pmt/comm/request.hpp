// SPDX-License-Identifier: Apache-2.0
#pragma once
// Request: the handle of a non-blocking operation (iall_reduce, isend, irecv). It owns copies of
// the Views the operation reads or writes, so they stay alive until the operation completes,
// whatever the caller does with its own handles. wait() blocks; test() polls. A request destroyed
// while pending waits first (MPI and NCCL forbid freeing buffers under a pending operation),
// except when its rank has failed (core/failure.hpp) or an exception is unwinding the stack: the
// peer it waits on may never come, so it abandons the operation instead, keeps its buffers alive
// for the rest of the process and records the failure; the job then ends (pmt::ScopeGuard).

#include "pmt/comm/stats.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/failure.hpp"

#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace pmt::comm {

/// \brief A non-blocking operation in flight (see the file comment): wait() blocks until it is
/// complete, test() polls once; it keeps the operation's Views alive and waits when destroyed
/// pending. \throws pmt::CommError from wait() / test() when the backend fails.
class Request {
 public:
  /// `progress(block)` completes the operation when `block`, or polls it once; it returns true
  /// once complete. `on_complete` runs once after completion (e.g. Avg's scaling). `keep` holds
  /// the Views.
  Request(std::function<bool(bool)> progress, std::shared_ptr<void> keep, std::function<void()> on_complete = {})
      : m_progress(std::move(progress)), m_on_complete(std::move(on_complete)), m_keep(std::move(keep)) {}

  /// \brief An already completed request.
  Request() = default;

  Request(Request&& o) noexcept { swap(o); }
  Request& operator=(Request&& o) noexcept {
    if (this != &o) {
      finish_quietly();
      Request tmp;
      swap(tmp);
      swap(o);
    }
    return *this;
  }
  Request(const Request&)            = delete;
  Request& operator=(const Request&) = delete;
  ~Request() { finish_quietly(); }

  /// \brief Blocks until the operation is complete. \throws pmt::CommError from the backend.
  void wait() {
    if (done()) return;
    const detail::CommTimer timer("wait_nonblocking");  // one word: heartbeat files split on spaces
    m_progress(true);
    complete();
  }

  /// \brief Polls once; true when the operation is complete (then wait() returns at once).
  /// \throws pmt::CommError from the backend.
  bool test() {
    if (done()) return true;
    if (!m_progress(false)) return false;
    complete();
    return true;
  }

  /// \brief True when complete (or default-constructed).
  bool done() const noexcept { return !m_progress; }

 private:
  void complete() {
    m_progress = nullptr;
    if (m_on_complete) std::exchange(m_on_complete, nullptr)();
    m_keep.reset();
  }
  void finish_quietly() noexcept {
    if (!done() && (std::uncaught_exceptions() > 0 || rank_failed())) {
      abandon();
      return;
    }
    try {
      wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "pmt::comm::Request: a pending request failed while being destroyed: %s\n", e.what());
      std::terminate();  // the buffers may still be in use: do not carry on
    }
  }
  /// Leaves the operation pending: its buffers stay alive until the process ends (a late message
  /// may still land in them), and this rank is marked failed.
  /// (Out of memory here, std::terminate ends the process, and with it the job.)
  void abandon() noexcept {
    note_failure("a pending non-blocking operation was abandoned while an error unwound the stack", false);
    static std::mutex mu;
    static auto* kept = new std::vector<std::shared_ptr<void>>();  // never freed: see above
    {
      const std::lock_guard<std::mutex> lock(mu);
      kept->push_back(std::move(m_keep));
    }
    m_progress    = nullptr;
    m_on_complete = nullptr;
  }
  void swap(Request& o) noexcept {
    std::swap(m_progress, o.m_progress);
    std::swap(m_on_complete, o.m_on_complete);
    std::swap(m_keep, o.m_keep);
  }

  std::function<bool(bool)> m_progress;
  std::function<void()> m_on_complete;
  std::shared_ptr<void> m_keep;
};

}  // namespace pmt::comm
