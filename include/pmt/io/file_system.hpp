// SPDX-License-Identifier: Apache-2.0
#pragma once
// The few file-system calls the checkpoint code makes, on POSIX (stat, opendir, mkdir, unlink,
// rmdir), without <filesystem>: every program that includes pmt/pmt.hpp compiles the checkpoint
// headers, and <filesystem> alone costs a tenth of the umbrella's compile time. Each reports
// failure by its result, never by an exception, as the std::filesystem overloads taking an
// std::error_code do.

#include <cerrno>
#include <cstdint>
#include <string>
#include <vector>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

namespace pmt::io::detail {

/// Whether `path` exists (following links).
inline bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}
inline bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
inline bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
/// The size of the regular file `path`; false (and `size` unchanged) when it cannot be read.
inline bool file_size(const std::string& path, std::uint64_t& size) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  size = static_cast<std::uint64_t>(st.st_size);
  return true;
}

/// The names in directory `dir` (without "." and ".."), in no particular order; empty when it
/// cannot be read.
inline std::vector<std::string> list_directory(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return names;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  return names;
}

/// Removes `path` and, for a directory, everything under it (links themselves, not their
/// targets). True when nothing is left.
inline bool remove_all(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT;
  if (S_ISDIR(st.st_mode)) {
    for (const auto& name : list_directory(path)) remove_all(path + "/" + name);
    return ::rmdir(path.c_str()) == 0;
  }
  return ::unlink(path.c_str()) == 0;
}

/// Creates directory `dir` and its missing parents (mode 0777 less the umask). True when `dir` is
/// a directory afterwards; `created` says whether this call made it.
inline bool create_directories(const std::string& dir, bool* created = nullptr) {
  if (created) *created = false;
  if (dir.empty()) return false;
  if (is_directory(dir)) return true;
  const auto slash = dir.find_last_of('/');
  if (slash != std::string::npos && slash > 0) create_directories(dir.substr(0, slash));
  const bool made  = ::mkdir(dir.c_str(), 0777) == 0;
  const int reason = errno;  // mkdir's, for the caller's message
  if (created) *created = made;
  const bool ok = is_directory(dir);
  errno         = reason;
  return ok;
}

}  // namespace pmt::io::detail
