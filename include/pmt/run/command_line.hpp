// SPDX-License-Identifier: Apache-2.0
#pragma once
// Part of the run harness (pmt/run.hpp): programs include it; the library never does.
// KokkosFlags: a program's command line holds Kokkos' own flags (--kokkos-*) beside the program's;
// Kokkos sees these and only these (it would take the program's --threads N for its own,
// deprecated, flag), and a misspelt one is refused instead of ignored.
// agree_command_line: every rank must run with the same flags (and PMT_MATMUL); ranks that differ
// are named in one error before any other communication could mismatch.
// without_program: an error's message as a program prints it after "program: error: ".

#include "pmt/comm/agree.hpp"
#include "pmt/core/error.hpp"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <string>
#include <vector>

namespace pmt::run {

/// Whether `arg` is one of Kokkos' own flags (3.4 to 5.x), as --name or --name=value.
inline bool is_kokkos_flag(const std::string& arg) {
  static const char* const names[] = {"--kokkos-help",
                                      "--kokkos-threads",
                                      "--kokkos-num-threads",
                                      "--kokkos-numa",
                                      "--kokkos-device-id",
                                      "--kokkos-device",
                                      "--kokkos-num-devices",
                                      "--kokkos-ndevices",
                                      "--kokkos-skip-device",
                                      "--kokkos-disable-warnings",
                                      "--kokkos-print-configuration",
                                      "--kokkos-tune-internals",
                                      "--kokkos-tools-library",
                                      "--kokkos-tools-libs",
                                      "--kokkos-tools-args",
                                      "--kokkos-tools-help",
                                      "--kokkos-map-device-id-by"};
  const std::string name           = arg.substr(0, arg.find('='));
  return std::find_if(std::begin(names), std::end(names), [&](const char* n) { return name == n; }) != std::end(names);
}

/// An error's message without the program's name in front ("program: error: what", once).
inline std::string without_program(const std::string& message, const char* program) {
  const std::string mine = std::string(program) + ": ";
  return message.rfind(mine, 0) == 0 ? message.substr(mine.size()) : message;
}

/// \brief The Kokkos flags of a command line, as the argc/argv Kokkos' initialisation takes
/// (the program's name first, then the flags taken).
class KokkosFlags {
 public:
  explicit KokkosFlags(const char* argv0) : m_words{argv0} {}
  KokkosFlags(const KokkosFlags&)            = delete;
  KokkosFlags& operator=(const KokkosFlags&) = delete;

  /// Moves every word of `args` that starts with --kokkos here, keeping the others in order.
  /// \throws pmt::ConfigError (naming `program`) for a --kokkos word Kokkos does not know; then
  /// nothing is taken.
  void take(std::vector<std::string>& args, const char* program) {
    std::vector<std::string> rest, mine;
    for (auto& a : args) {
      if (a.rfind("--kokkos", 0) != 0) {
        rest.push_back(a);
        continue;
      }
      if (!is_kokkos_flag(a))
        throw ConfigError(program, "unknown Kokkos flag " + a + " (Kokkos' flags: --kokkos-help lists them)");
      mine.push_back(a);
    }
    args.swap(rest);
    m_words.insert(m_words.end(), mine.begin(), mine.end());
  }

  /// argc and argv for Kokkos (valid while this object lives and takes nothing more).
  int& argc() {
    build();
    return m_argc;
  }
  char**& argv() {
    build();
    return m_argv_p;
  }

 private:
  void build() {
    if (m_argc == static_cast<int>(m_words.size())) return;
    m_argv.clear();
    for (auto& w : m_words) m_argv.push_back(&w[0]);
    m_argv.push_back(nullptr);
    m_argc   = static_cast<int>(m_words.size());
    m_argv_p = m_argv.data();
  }
  std::vector<std::string> m_words;
  std::vector<char*> m_argv;
  char** m_argv_p = nullptr;
  int m_argc      = -1;
};

/// Collective: every rank hashes its command line and PMT_MATMUL; ranks whose hash differs from
/// rank 0's are named in one pmt::ConfigError (naming `program`), raised on every rank.
template <class B>
void agree_command_line(const comm::Communicator<B>& world, int argc, char* argv[], const char* program) {
  std::string line;  // the arguments, each ended by a 0 byte, and PMT_MATMUL
  for (int i = 1; i < argc; ++i) line += std::string(argv[i]) + '\0';
  line += std::getenv("PMT_MATMUL") ? std::getenv("PMT_MATMUL") : "";
  comm::agree_on_text(world, line, program, "flags (command line and PMT_MATMUL)");
}

}  // namespace pmt::run
