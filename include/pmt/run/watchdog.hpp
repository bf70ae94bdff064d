// SPDX-License-Identifier: Apache-2.0
#pragma once
// Part of the run harness (pmt/run.hpp): programs include it; the library never does.
// A watchdog for hung jobs. Every blocking communication call of the main thread records what it
// waits for (comm::wait_state(), set by pmt::detail::CommTimer: the operation and since when). A Watchdog
// thread per rank writes a heartbeat file into a directory all ranks share, once per beat:
//   DIR/rank-00003: "<wall clock ns> <pid> <step> <operation or -> <seconds waited>"
// When this rank has waited longer than the timeout in one call, the watchdog reads every
// rank's heartbeat and reports, naming the waiting ranks, the operation and the ranks that never
// arrived (in another operation, computing, or with no heartbeat: stopped or dead), then calls
// the fire callback (train_gpt prints the report and ends the job). Of the ranks that wait past
// the timeout, the lowest one reports; the others stay silent a few beats longer, so that the
// report is out before the launcher tears the job down.
// Files on a shared file system (a checkpoint directory) let ranks on several nodes see each
// other; in a node-local directory a rank sees only its node's ranks and says so.

#include "pmt/comm/stats.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>

namespace pmt::run {

/// \brief The watchdog's settings.
struct WatchdogOptions {
  double timeout_s = 600;  ///< one communication call may wait this long
  std::string dir;         ///< the heartbeat directory, the same on every rank
  int rank = 0, size = 1;  ///< this rank and the job's ranks
  double beat_s = 0;       ///< seconds between heartbeats (0: timeout / 10, at most 1 s)
};

namespace detail {

/// One rank's heartbeat as read back.
struct Beat {
  bool found    = false;
  double age_s  = 0;  ///< since it was written
  long long pid = 0, step = -1;
  std::string op;  ///< "-" when not in a communication call
  double waited_s = 0;
};

inline std::string beat_path(const std::string& dir, int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "/rank-%05d", rank);
  return dir + name;
}

inline std::int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline Beat read_beat(const std::string& dir, int rank) {
  Beat b;
  std::ifstream in(beat_path(dir, rank));
  long long when = 0;
  if (!(in >> when >> b.pid >> b.step >> b.op >> b.waited_s)) return b;
  b.found = true;
  b.age_s = double(wall_ns() - when) * 1e-9;
  return b;
}

inline std::string list(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace detail

/// \brief Runs while alive: heartbeats and the timeout check (see the file comment).
class Watchdog {
 public:
  /// `fire(report, reporter)` is called once, on the watchdog thread, when this rank has waited
  /// past the timeout; `reporter` is true on the rank that should print the report.
  using Fire = std::function<void(const std::string& report, bool reporter)>;

  Watchdog(WatchdogOptions o, Fire fire) : m_o(std::move(o)), m_fire(std::move(fire)) {
    if (m_o.beat_s <= 0) m_o.beat_s = std::min(1.0, m_o.timeout_s / 10);
    beat();
    m_thread = std::thread([this] { loop(); });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(m_mu);
      m_stop = true;
    }
    m_cv.notify_all();
    m_thread.join();
    std::error_code ec;
    std::filesystem::remove(detail::beat_path(m_o.dir, m_o.rank), ec);
  }
  Watchdog(const Watchdog&)            = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  /// \brief The step the main thread is at (reported in heartbeats).
  void set_step(std::int64_t step) noexcept { m_step.store(step); }

  /// \brief The report a rank waiting in `op` for `waited` seconds gives now, from the heartbeats.
  std::string report(const char* op, double waited) const {
    using detail::Beat;
    std::vector<int> waiting, missing_file;
    std::vector<std::pair<int, Beat>> elsewhere;
    const double stale = 3 * m_o.beat_s + 1;
    for (int q = 0; q < m_o.size; ++q) {
      const Beat b = q == m_o.rank ? own_beat(op, waited) : detail::read_beat(m_o.dir, q);
      if (!b.found)
        missing_file.push_back(q);
      else if (b.age_s <= stale && b.op == op)
        waiting.push_back(q);
      else
        elsewhere.emplace_back(q, b);
    }
    std::ostringstream s;
    s.setf(std::ios::fixed);
    s.precision(1);
    s << "watchdog: rank " << m_o.rank << " waited " << waited << " s (limit " << m_o.timeout_s << " s) in " << op
      << " at step " << m_step.load() << "; waiting in " << op << ": rank" << (waiting.size() == 1 ? " " : "s ")
      << detail::list(waiting);
    if (!elsewhere.empty() || !missing_file.empty()) s << "; never arrived:";
    const char* sep = " ";
    for (const auto& [q, b] : elsewhere) {
      s << sep << "rank " << q;
      if (b.age_s > stale)
        s << " (no heartbeat for " << b.age_s << " s: stopped or dead; last at step " << b.step << ", "
          << (b.op == "-" ? std::string("computing") : "in " + b.op) << ")";
      else
        s << " (step " << b.step << ", " << (b.op == "-" ? std::string("computing") : "waiting in " + b.op) << ")";
      sep = ", ";
    }
    if (!missing_file.empty())
      s << sep << "rank" << (missing_file.size() == 1 ? " " : "s ") << detail::list(missing_file)
        << " (no heartbeat in " << m_o.dir << ": another node, or never started)";
    return s.str();
  }

 private:
  detail::Beat own_beat(const char* op, double waited) const {
    detail::Beat b;
    b.found = true, b.pid = static_cast<long long>(::getpid()), b.step = m_step.load(), b.op = op ? op : "-";
    b.waited_s = waited;
    return b;
  }

  /// What the main thread waits in now and for how long (nullptr when it is not waiting).
  std::pair<const char*, double> waiting() const {
    const auto& w  = comm::wait_state();
    const char* op = w.op.load();
    if (op == nullptr) return {nullptr, 0.0};
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    return {op, double(now - w.since_ns.load()) * 1e-9};
  }

  void beat() const {
    const auto [op, waited] = waiting();
    const std::string path = detail::beat_path(m_o.dir, m_o.rank), tmp = path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << detail::wall_ns() << " " << ::getpid() << " " << m_step.load() << " " << (op ? op : "-") << " " << waited
          << "\n";
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);  // a reader sees the old heartbeat or the new one
  }

  void loop() {
    std::unique_lock<std::mutex> lock(m_mu);
    while (!m_cv.wait_for(lock, std::chrono::duration<double>(m_o.beat_s), [this] { return m_stop; })) {
      beat();
      const auto [op, waited] = waiting();
      if (op == nullptr || waited <= m_o.timeout_s) continue;
      // the lowest rank waiting past the timeout reports
      bool reporter = true;
      for (int q = 0; q < m_o.rank && reporter; ++q) {
        const auto b = detail::read_beat(m_o.dir, q);
        reporter =
            !(b.found && b.age_s <= 3 * m_o.beat_s + 1 && b.op == op && b.waited_s > m_o.timeout_s - 2 * m_o.beat_s);
      }
      const std::string text = report(op, waited);
      lock.unlock();
      m_fire(text, reporter);
      return;
    }
  }

  WatchdogOptions m_o;
  Fire m_fire;
  std::atomic<std::int64_t> m_step{-1};
  mutable std::mutex m_mu;
  std::condition_variable m_cv;
  bool m_stop = false;
  std::thread m_thread;
};

}  // namespace pmt::run

namespace pmt::comm {
/// \brief Deprecated (0.2): pmt::run::WatchdogOptions.
using WatchdogOptions [[deprecated("moved to pmt::run::WatchdogOptions (pmt/run/watchdog.hpp)")]] =
    run::WatchdogOptions;
/// \brief Deprecated (0.2): pmt::run::Watchdog.
using Watchdog [[deprecated("moved to pmt::run::Watchdog (pmt/run/watchdog.hpp)")]] = run::Watchdog;
}  // namespace pmt::comm
