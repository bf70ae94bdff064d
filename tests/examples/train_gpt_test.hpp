// SPDX-License-Identifier: Apache-2.0
#pragma once
// Helpers of the tests that run examples/train_gpt as a user would (test_train_gpt.cpp,
// test_train_gpt_safety.cpp): a scratch directory per test process and the losses of a metrics
// file.

#include <pmt/run/metrics.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <system_error>

#include <unistd.h>

namespace pmt::test {

/// `name` inside this process's scratch directory (`tag` + pid under the temporary directory,
/// created on first use, removed at exit).
inline std::string scratch(const std::string& tag, const std::string& name) {
  namespace fs = std::filesystem;
  struct Dir {
    fs::path path;
    explicit Dir(const std::string& t) : path(fs::temp_directory_path() / (t + std::to_string(getpid()))) {
      fs::create_directories(path);
    }
    ~Dir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static const Dir d(tag);
  return (d.path / name).string();
}

/// "loss" of every step line of a metrics file, as written (the shortest text that reads back
/// as the same double: equal texts are equal losses).
inline std::map<int, std::string> losses(const std::string& metrics) {
  std::map<int, std::string> out;
  for (const auto& line : pmt::run::MetricsLog::read(metrics))
    if (line.contains("step") && line.contains("loss")) out[line["step"].get<int>()] = line["loss"].dump();
  return out;
}

}  // namespace pmt::test
