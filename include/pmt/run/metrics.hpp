// SPDX-License-Identifier: Apache-2.0
#pragma once
// Part of the run harness (pmt/run.hpp): programs include it; the library never does. Needs
// nlohmann-json (Debian: nlohmann-json3-dev).
// MetricsLog: a run's figures as JSON lines, one object per line, written and read through
// nlohmann-json. A resumed run continues the file: the lines of the saved run up to its checkpoint
// stay, the ones it wrote past the checkpoint go, so no step appears twice.
//   pmt::run::MetricsLog log("run.jsonl", /*resumed_at=*/0);
//   log.write({{"step", 3}, {"loss", 2.5}});

#include "pmt/core/error.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace pmt::run {

/// One line of a metrics file: its keys in the order they were set.
using MetricsLine = nlohmann::ordered_json;

/// \brief A JSON-lines metrics file, flushed after every line. A default-constructed log writes
/// nothing (a rank other than the root, or no file asked for).
class MetricsLog {
 public:
  MetricsLog() = default;

  /// Opens `path`: afresh when `resumed_at` is 0; else (a run resumed at step `resumed_at`) it
  /// keeps the lines of steps before it and the validation at it, and appends. `note`, when
  /// given, says how many lines a resume dropped (empty when none).
  /// \throws pmt::IoError when the file cannot be written.
  MetricsLog(const std::string& path, std::int64_t resumed_at, std::string* note = nullptr) : m_path(path) {
    if (resumed_at > 0) keep_until(resumed_at, note);
    m_file = std::fopen(path.c_str(), resumed_at > 0 ? "a" : "w");
    if (!m_file) throw IoError("pmt::run::MetricsLog", path + ": cannot be written");
  }
  MetricsLog(MetricsLog&& o) noexcept : m_path(std::move(o.m_path)), m_file(o.m_file) { o.m_file = nullptr; }
  MetricsLog& operator=(MetricsLog&& o) noexcept {
    std::swap(m_path, o.m_path);
    std::swap(m_file, o.m_file);
    return *this;
  }
  MetricsLog(const MetricsLog&)            = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  ~MetricsLog() {
    if (m_file) std::fclose(m_file);
  }

  explicit operator bool() const { return m_file != nullptr; }

  /// Appends `line` as one line of JSON (nothing for a log that writes nothing).
  void write(const MetricsLine& line) {
    if (!m_file) return;
    const std::string text = line.dump() + "\n";
    std::fwrite(text.data(), 1, text.size(), m_file);
    std::fflush(m_file);
  }

  /// The lines of a metrics file, each parsed (a line that is not JSON is skipped).
  static std::vector<MetricsLine> read(const std::string& path) {
    std::vector<MetricsLine> lines;
    std::ifstream in(path);
    for (std::string text; std::getline(in, text);) {
      auto line = MetricsLine::parse(text, nullptr, /*allow_exceptions=*/false);
      if (!line.is_discarded()) lines.push_back(std::move(line));
    }
    return lines;
  }

 private:
  /// Rewrites the file with the lines a run resumed at `step` keeps (through a renamed copy).
  void keep_until(std::int64_t step, std::string* note) {
    std::string kept;
    std::size_t n_kept = 0, n_dropped = 0;
    for (const auto& line : read(m_path)) {
      const auto at = line.find("step");
      const bool keep =
          at != line.end() && at->is_number_integer() &&
          (at->get<std::int64_t>() < step || (at->get<std::int64_t>() == step && line.contains("val_loss")));
      (keep ? n_kept : n_dropped) += 1;
      if (keep) kept += line.dump() + "\n";
    }
    const std::string tmp = m_path + ".tmp";
    std::ofstream(tmp, std::ios::trunc) << kept;
    std::error_code ec;
    std::filesystem::rename(tmp, m_path, ec);
    if (note && n_dropped > 0)
      *note = m_path + " keeps " + std::to_string(n_kept) + " lines up to step " + std::to_string(step) + ", dropped " +
              std::to_string(n_dropped) + " after it";
  }

  std::string m_path;
  std::FILE* m_file = nullptr;
};

}  // namespace pmt::run
