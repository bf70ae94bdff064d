// SPDX-License-Identifier: Apache-2.0
#pragma once
// Measured choices: where pmt picks between two implementations of an op by timing them (the
// matmul path: vendor BLAS or the portable kernel, ops/matmul.hpp), the choices live in one
// process-wide table keyed by the op and a shape class.
//
// - A process that is the whole job (process_context().size == 1): a key's choice is made on its
//   first use, from the measurement, and kept for the life of the process.
// - A job of several ranks: a key measured on one rank stays *pending* (the op runs its default
//   path 0, the same on every rank) until every rank calls comm::agree_choices on the job's world
//   communicator (comm/agree.hpp). That decides every key that any rank measured, from the mean
//   of all ranks' timings, identically on every rank. The Trainer does it after its first step
//   and its first evaluation.
// - Decided entries can be exported and loaded (a checkpoint keeps them, so that a resumed run
//   takes the same paths as the run it continues).
// A choice never changes once made: results stay bit-for-bit repeatable within the process.

#include "pmt/core/error.hpp"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace pmt {

/// \brief The key of a measured choice: the op (a small id) and two words of its shape class.
struct ChoiceKey {
  std::int64_t op = 0, a = 0, b = 0;
  friend bool operator<(const ChoiceKey& x, const ChoiceKey& y) {
    return std::tie(x.op, x.a, x.b) < std::tie(y.op, y.a, y.b);
  }
  friend bool operator==(const ChoiceKey& x, const ChoiceKey& y) { return x.op == y.op && x.a == y.a && x.b == y.b; }
};

/// \brief One entry of the table: the seconds each path took (best of its runs; the mean over
/// the ranks that measured it once agreed), the work of the measured call, and the path.
struct Choice {
  enum class State { Pending, Measured, Agreed, Loaded };
  int path          = 0;       ///< 0: the op's default path, 1: its alternative
  double seconds[2] = {0, 0};  ///< per path
  double flops      = 0;       ///< of the measured call (for GFLOP/s in reports)
  State state       = State::Pending;
  std::string shape;  ///< the measured call's shape, for reports ("1024x768x256 NN")
  bool decided() const noexcept { return state != State::Pending; }
};

namespace detail {

/// The table and its settings; one per process.
struct ChoiceTable {
  std::recursive_mutex mu;
  std::map<ChoiceKey, Choice> entries;
  /// Seconds of measurement after which no further round starts (past the first three).
  double budget_s = 0.02;
  /// Test hook: maps (key, path, measured seconds) to the seconds recorded (forces disagreement).
  std::function<double(const ChoiceKey&, int, double)> timing_hook;
};

inline ChoiceTable& choice_table() {
  static ChoiceTable t;
  return t;
}

/// Times run(0) and run(1) alternately (each run is fenced by the caller's lambda): at least three
/// rounds (the first one warms caches and the BLAS' buffers), more while the budget lasts, at most
/// five; a key whose first round took over ten budgets gets that round only. Best run per path.
template <class Run>
void measure_paths(const ChoiceKey& key, Run&& run, double seconds[2]) {
  using clock         = std::chrono::steady_clock;
  const double budget = choice_table().budget_s;
  seconds[0] = seconds[1] = 1e300;
  double spent            = 0;
  for (int round = 0; round < 5; ++round) {
    for (int p = 0; p < 2; ++p) {
      const auto t0 = clock::now();
      run(p);
      const double s = std::chrono::duration<double>(clock::now() - t0).count();
      spent += s;
      const double recorded = choice_table().timing_hook ? choice_table().timing_hook(key, p, s) : s;
      seconds[p]            = recorded < seconds[p] ? recorded : seconds[p];
    }
    if (round == 0 && spent > 10 * budget) break;
    if (round >= 2 && spent > budget) break;
  }
}

}  // namespace detail

/// \brief The path to take for `key`: the decided one, else (first use) measures both paths with
/// `run(path)` and decides at once in a job of one rank; in a job of several ranks the key stays
/// pending and path 0 runs until comm::agree_choices decides it. `shape()` (a string, built only
/// when the key is measured) and `flops` describe the call for reports.
template <class Shape, class Run>
int measured_choice(const ChoiceKey& key, Shape&& shape, double flops, Run&& run) {
  auto& t = detail::choice_table();
  std::lock_guard<std::recursive_mutex> lock(t.mu);
  const auto it = t.entries.find(key);
  if (it != t.entries.end()) return it->second.decided() ? it->second.path : 0;
  Choice c;
  c.shape = shape();
  c.flops = flops;
  detail::measure_paths(key, run, c.seconds);
  c.path         = c.seconds[1] < c.seconds[0] ? 1 : 0;
  c.state        = detail::process_context().size <= 1 ? Choice::State::Measured : Choice::State::Pending;
  const int path = c.decided() ? c.path : 0;
  t.entries.emplace(key, std::move(c));
  return path;
}

/// \brief The path `key` takes now without measuring anything: the decided one, -1 when the key
/// was never measured, 0 while it is pending.
inline int current_choice(const ChoiceKey& key) {
  auto& t = detail::choice_table();
  std::lock_guard<std::recursive_mutex> lock(t.mu);
  const auto it = t.entries.find(key);
  return it == t.entries.end() ? -1 : (it->second.decided() ? it->second.path : 0);
}

/// \brief A copy of the table (key order).
inline std::vector<std::pair<ChoiceKey, Choice>> measured_choices() {
  auto& t = detail::choice_table();
  std::lock_guard<std::recursive_mutex> lock(t.mu);
  return {t.entries.begin(), t.entries.end()};
}

/// \brief Forgets every entry (tests; a later use measures again).
inline void clear_measured_choices() {
  auto& t = detail::choice_table();
  std::lock_guard<std::recursive_mutex> lock(t.mu);
  t.entries.clear();
}

/// \brief Sets decided entries (agreement, or a checkpoint's table); an entry already decided in
/// this process is kept as it is, so that a choice never changes once made.
inline void set_measured_choices(const std::vector<std::pair<ChoiceKey, Choice>>& decided) {
  auto& t = detail::choice_table();
  std::lock_guard<std::recursive_mutex> lock(t.mu);
  for (const auto& [k, c] : decided) {
    auto it = t.entries.find(k);
    if (it == t.entries.end())
      t.entries.emplace(k, c);
    else if (!it->second.decided())
      it->second = c;
  }
}

/// \brief The decided entries as one word, "op.a.b.path,..." (for a checkpoint's manifest).
inline std::string encode_measured_choices() {
  std::string out;
  for (const auto& [k, c] : measured_choices())
    if (c.decided()) out += detail::str(out.empty() ? "" : ",", k.op, ".", k.a, ".", k.b, ".", c.path);
  return out.empty() ? std::string("-") : out;
}

/// \brief Parses encode_measured_choices' word into Loaded entries.
/// \throws pmt::IoError naming the word when it is malformed.
inline std::vector<std::pair<ChoiceKey, Choice>> decode_measured_choices(const std::string& word) {
  std::vector<std::pair<ChoiceKey, Choice>> out;
  if (word == "-" || word.empty()) return out;
  std::size_t at = 0;
  while (at <= word.size()) {
    const std::size_t end  = word.find(',', at) == std::string::npos ? word.size() : word.find(',', at);
    const std::string item = word.substr(at, end - at);
    long long f[4]         = {0, 0, 0, 0};
    int used               = 0;
    const int n            = std::sscanf(item.c_str(), "%lld.%lld.%lld.%lld%n", &f[0], &f[1], &f[2], &f[3], &used);
    if (n != 4 || used != static_cast<int>(item.size()) || (f[3] != 0 && f[3] != 1))
      throw IoError("pmt::decode_measured_choices",
                    detail::str("'", item, "' in '", word, "'; expected op.a.b.path items with path 0 or 1"));
    Choice c;
    c.path  = static_cast<int>(f[3]);
    c.state = Choice::State::Loaded;
    out.emplace_back(ChoiceKey{f[0], f[1], f[2]}, c);
    at = end + 1;
  }
  return out;
}

/// \brief One line for a log: how many decided keys of op `op` took each path, with the share of
/// `peak_gflops` (when > 0) the chosen paths reached, e.g.
/// "portable for 9 shape classes (52-61 % of peak), vendor for 3 (40-44 %), 0 pending".
inline std::string measured_choice_summary(std::int64_t op, const char* path0, const char* path1,
                                           double peak_gflops = 0) {
  int n[2] = {0, 0}, pending = 0;
  double lo[2] = {1e300, 1e300}, hi[2] = {0, 0};
  for (const auto& [k, c] : measured_choices()) {
    if (k.op != op) continue;
    if (!c.decided()) {
      ++pending;
      continue;
    }
    ++n[c.path];
    const double s = c.seconds[c.path];
    if (s > 0 && peak_gflops > 0) {
      const double share = 100.0 * c.flops / s / 1e9 / peak_gflops;
      lo[c.path]         = share < lo[c.path] ? share : lo[c.path];
      hi[c.path]         = share > hi[c.path] ? share : hi[c.path];
    }
  }
  auto part = [&](int p, const char* name) {
    std::string s = detail::str(name, " for ", n[p], " shape class", n[p] == 1 ? "" : "es");
    if (n[p] > 0 && peak_gflops > 0 && hi[p] > 0) {
      char buf[64];
      std::snprintf(buf, sizeof buf, " (%.0f-%.0f %% of peak)", lo[p], hi[p]);
      s += buf;
    }
    return s;
  };
  return part(1, path1) + ", " + part(0, path0) + detail::str(", ", pending, " pending");
}

}  // namespace pmt
