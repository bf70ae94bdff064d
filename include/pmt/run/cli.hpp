// SPDX-License-Identifier: Apache-2.0
#pragma once
// Part of the run harness: programs include it; the library never does. Needs CLI11 (Debian:
// libcli11-dev) and is included on its own (pmt/run.hpp does not include it).
// A program's flags through CLI11, each declared once with its type, its check and its help:
//   CLI::App app("what it does", "prog");
//   pmt::run::option(app, "Model", "--width", width, "model width", pmt::run::integer("--width", 1));
//   const std::string error = pmt::run::parse_flags(app, args);   // "" or the message to report
// Messages say the flag and the value: "--width 0: expected an integer >= 1", "unknown flag --x",
// "--steps needs a value"; a later flag overrides an earlier one; --help returns the help text.

#include "pmt/core/error.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace pmt::run {

/// A check of one flag's value: empty when it is good, else the whole message ("--width 0: ...").
using Check = std::function<std::string(const std::string& value)>;

/// An integer in [min, max] (max: 2^30 unless given).
inline Check integer(const std::string& flag, long min, long max = 1L << 30) {
  return [=](const std::string& v) {
    char* end    = nullptr;
    errno        = 0;
    const long x = std::strtol(v.c_str(), &end, 10);
    if (!v.empty() && *end == '\0' && errno == 0 && x >= min && x <= max) return std::string();
    return flag + " " + v + ": expected an integer " +
           (max == 1L << 30 ? ">= " + std::to_string(min)
                            : "from " + std::to_string(min) + " to " + std::to_string(max));
  };
}

/// A finite number for which `ok` holds; `expected` says which ("expected a positive number").
inline Check number(const std::string& flag, std::function<bool(double)> ok, const std::string& expected) {
  return [=](const std::string& v) {
    char* end      = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    return !v.empty() && *end == '\0' && std::isfinite(x) && ok(x) ? std::string() : flag + " " + v + ": " + expected;
  };
}

/// One of `words`.
inline Check one_of(const std::string& flag, std::vector<std::string> words) {
  return [=](const std::string& v) {
    if (std::find(words.begin(), words.end(), v) != words.end()) return std::string();
    std::string list;
    for (std::size_t i = 0; i < words.size(); ++i)
      list += (i ? (i + 1 == words.size() ? " or " : ", ") : "") + words[i];
    return flag + " " + v + ": expected " + list;
  };
}

/// A check by a function that throws pmt::Error for a bad value (the library's own parsers).
inline Check parsed_by(std::function<void(const std::string&)> parse) {
  return [=](const std::string& v) {
    try {
      parse(v);
      return std::string();
    } catch (const pmt::Error& e) {
      return std::string(e.what());
    }
  };
}

/// Declares `flag` for `value` in help group `group`, checked by `check` (when given).
template <class T>
CLI::Option* option(CLI::App& app, const std::string& group, const std::string& flag, T& value, const std::string& help,
                    Check check = {}) {
  CLI::Option* opt = app.add_option(flag, value, help)->group(group);
  if (check) opt->check(CLI::Validator([check](std::string& v) { return check(v); }, "", ""));
  return opt;
}

/// Declares the boolean flag `flag` in help group `group`.
inline CLI::Option* flag(CLI::App& app, const std::string& group, const std::string& name, bool& value,
                         const std::string& help) {
  return app.add_flag(name, value, help)->group(group);
}

/// CLI11's message as a program says it: a check's own message without CLI11's "--flag: ".
inline std::string message_of(const CLI::ParseError& e) {
  const std::string what = e.what();
  const auto colon       = what.find(": ");
  if (colon == std::string::npos) return what;
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e)) return what.substr(0, colon) + " needs a value (see --help)";
  if (dynamic_cast<const CLI::ValidationError*>(&e)) return what.substr(colon + 2);
  return what;
}

/// The result of parse_flags.
struct Flags {
  std::string error;  ///< empty when the flags are good
  std::string help;   ///< --help (or -h): the help text, and nothing else to do
};

/// Parses `args` (the words after the program's name) into the options declared on `app`: a later
/// flag overrides an earlier one; a word no option takes is an error. Declare the options first;
/// this sets every option's policy.
inline Flags parse_flags(CLI::App& app, std::vector<std::string> args) {
  Flags f;
  app.allow_extras();
  for (CLI::Option* opt : app.get_options()) opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  std::reverse(args.begin(), args.end());  // CLI11 takes the words last first
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    f.help = app.help();
    return f;
  } catch (const CLI::ParseError& e) {
    f.error = message_of(e);
    return f;
  }
  for (const auto& extra : app.remaining()) {
    f.error = (extra.rfind("-", 0) == 0 ? "unknown flag " : "unexpected word ") + extra + " (see --help)";
    break;
  }
  return f;
}

}  // namespace pmt::run
