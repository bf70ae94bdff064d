// SPDX-License-Identifier: Apache-2.0
#pragma once
// Part of the run harness (pmt/run.hpp): programs include it; the library never does.
// DirectoryLock: one training run writes a run (checkpoint) directory at a time.

#include "pmt/core/error.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

namespace pmt::run {

namespace detail {

[[noreturn]] inline void lock_fail(const std::string& what) {
  throw IoError("pmt::run::DirectoryLock", what + (errno ? std::string(": ") + std::strerror(errno) : std::string()));
}

}  // namespace detail

/// \brief One writer per run (checkpoint) directory: DIR/LOCK, created exclusively, holds "pid host".
/// A lock whose process is gone (same host, no such pid; a live one on this host gets 5 s to
/// end, as a job torn down a moment ago does) is stale and taken over; a live one is refused.
/// Released (removed) by the destructor. Take it on one rank (rank 0).
class DirectoryLock {
 public:
  /// \throws pmt::IoError naming the holder when another live process holds `dir`, or when the
  /// directory cannot be created or written.
  explicit DirectoryLock(const std::string& dir) : m_path(dir + "/LOCK") {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::create_directories(dir, ec);
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    const std::string me = pmt::detail::str(::getpid(), " ", host, "\n");
    for (int attempt = 0; attempt < 2; ++attempt) {
      errno        = 0;
      const int fd = ::open(m_path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
      if (fd >= 0) {
        const bool ok = ::write(fd, me.data(), me.size()) == static_cast<ssize_t>(me.size());
        ::close(fd);
        if (!ok) detail::lock_fail("cannot write " + m_path);
        return;
      }
      if (errno != EEXIST) detail::lock_fail("cannot create " + m_path + " (is " + dir + " writable?)");
      long long pid = 0;
      std::string holder;
      std::ifstream(m_path) >> pid >> holder;
      const bool same_host = holder == host;
      // a holder on this host that is ending (a job torn down a moment ago) gets a few seconds
      const auto alive = [&] { return !(::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH); };
      for (int wait = 0; same_host && pid > 0 && wait < 50 && alive(); ++wait) ::usleep(100000);
      if (same_host && pid > 0 && !alive()) {
        m_stale = pmt::detail::str("removed a stale lock of pid ", pid, " (no longer running)");
        fs::remove(m_path, ec);
        continue;
      }
      throw IoError("pmt::run::DirectoryLock",
                    pmt::detail::str(dir, " is in use by pid ", pid, " on ",
                                     holder.empty() ? std::string("an unknown host") : holder, " (", m_path,
                                     "); one run writes a checkpoint directory at a time",
                                     same_host ? std::string() : ": if that run is gone, remove the lock by hand"));
    }
    detail::lock_fail("cannot take " + m_path);
  }
  ~DirectoryLock() {
    std::error_code ec;
    std::filesystem::remove(m_path, ec);
  }
  DirectoryLock(const DirectoryLock&)            = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  /// \brief What taking the lock did besides ("removed a stale lock of pid N ..."), or "".
  const std::string& note() const noexcept { return m_stale; }

 private:
  std::string m_path, m_stale;
};

}  // namespace pmt::run

namespace pmt::io {
/// \brief Deprecated (0.2): pmt::run::DirectoryLock.
using CheckpointLock [[deprecated("moved to pmt::run::DirectoryLock (pmt/run/lock.hpp)")]] = run::DirectoryLock;
}  // namespace pmt::io
