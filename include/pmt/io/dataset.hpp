// SPDX-License-Identifier: Apache-2.0
#pragma once
// TokenDataset: a byte-level token stream (each byte is a token, vocabulary 256) read from a file
// or from a directory (its regular files with the given extensions, in name order, concatenated),
// split into a training part (the first 90 %) and a validation part (the rest, at least one
// context). Batches are a function of (seed, step, sequence index) only: sequence j of the global
// batch of step s starts at an offset drawn from Philox keyed by (seed, s, j), so every layout
// sees the same global batches and each dp rank reads just its own sequences [first, first + B).
// The data position of a run is its step number (what a checkpoint records). Validation windows
// are fixed: window k starts at k * stride over the validation part.

#include "pmt/core/error.hpp"
#include "pmt/core/random.hpp"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

namespace pmt::io {

/// \brief A byte-level text corpus split into training and validation bytes (see the file
/// comment), read once into memory; batches are drawn from (seed, step) so every layout sees the
/// same global batch. \throws pmt::IoError for a missing, unreadable or too short file.
class TokenDataset {
 public:
  /// \brief The vocabulary: one token per byte value.
  static constexpr std::size_t vocab_size = 256;
  /// \brief The most bytes a dataset reads by default (it is held in memory): 4 GiB.
  static constexpr std::uint64_t default_max_bytes = std::uint64_t(4) << 30;

  /// \brief Reads `path`: a file, or a directory whose files ending in one of `extensions`
  /// (e.g. ".md") are concatenated in name order. Only regular files are read, and at most
  /// `max_bytes` in all (a device or a pipe, which have no size, is refused).
  /// \throws pmt::IoError naming the path when it is missing, unreadable, not a regular file or
  /// larger than max_bytes, or holds fewer than 2 (context + 1) bytes (one context for training,
  /// one for validation).
  TokenDataset(const std::string& path, std::size_t context, const std::vector<std::string>& extensions = {".md"},
               std::uint64_t max_bytes = default_max_bytes)
      : m_path(path), m_context(context) {
    namespace fs   = std::filesystem;
    const char* op = "pmt::io::TokenDataset";
    std::error_code ec;
    std::vector<fs::path> files;
    if (fs::is_directory(path, ec)) {
      for (const auto& e : fs::directory_iterator(path, ec))
        if (e.is_regular_file() &&
            std::find(extensions.begin(), extensions.end(), e.path().extension().string()) != extensions.end())
          files.push_back(e.path());
      std::sort(files.begin(), files.end());
      pmt::detail::require<IoError>(!files.empty(), op,
                                    [&] { return pmt::detail::str(path, ": a directory without data files"); });
    } else {
      pmt::detail::require<IoError>(fs::exists(path, ec), op, [&] { return pmt::detail::str(path, ": no such file"); });
      pmt::detail::require<IoError>(fs::is_regular_file(path, ec), op, [&] {
        return pmt::detail::str(
            path, ": not a regular file (a device, pipe or socket has no size to bound a read; pass a file)");
      });
      files.push_back(path);
    }
    std::uint64_t total = 0;
    for (const auto& f : files) total += fs::file_size(f, ec);
    pmt::detail::require<IoError>(total <= max_bytes, op, [&] {
      return pmt::detail::str(path, " holds ", total, " bytes, more than the limit of ", max_bytes,
                              " bytes a dataset reads into memory");
    });
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      pmt::detail::require<IoError>(static_cast<bool>(in), op,
                                    [&] { return pmt::detail::str(f.string(), ": cannot be read"); });
      std::string chunk(1 << 20, '\0');  // bounded reads: a file growing while read stops at the limit
      while (in && m_bytes.size() <= max_bytes) {
        in.read(&chunk[0], static_cast<std::streamsize>(chunk.size()));
        m_bytes.append(chunk.data(), static_cast<std::size_t>(in.gcount()));
      }
      pmt::detail::require<IoError>(!in.bad(), op, [&] { return pmt::detail::str(f.string(), ": read error"); });
      pmt::detail::require<IoError>(m_bytes.size() <= max_bytes, op, [&] {
        return pmt::detail::str(path, " grew past the limit of ", max_bytes, " bytes while it was read");
      });
    }
    for (const unsigned char c : m_bytes) m_fingerprint = (m_fingerprint ^ c) * 1099511628211ull;  // FNV-1a
    pmt::detail::require<IoError>(m_bytes.size() >= context + 1, op, [&] {
      return pmt::detail::str(path, " holds ", m_bytes.size(),
                              " bytes, shorter than one context (context + 1 = ", context + 1, " bytes)");
    });
    pmt::detail::require<IoError>(m_bytes.size() >= 2 * (context + 1), op, [&] {
      return pmt::detail::str(path, " holds ", m_bytes.size(),
                              " bytes; a training and a validation split need 2 (context + 1) = ", 2 * (context + 1));
    });
    m_val_begin = std::min(m_bytes.size() - (context + 1), m_bytes.size() * 9 / 10);
  }

  std::size_t size() const noexcept { return m_bytes.size(); }
  std::size_t train_size() const noexcept { return m_val_begin; }
  std::size_t val_size() const noexcept { return m_bytes.size() - m_val_begin; }
  const std::string& path() const noexcept { return m_path; }
  /// \brief A 64-bit FNV-1a hash of the bytes (a checkpoint records it to notice other data).
  std::uint64_t fingerprint() const noexcept { return m_fingerprint; }

  /// \brief Sequences [first, first + B) of the global batch of `step`: inputs and next-byte
  /// targets, B x context each, row-major, into host Views (or pointers) ids and targets.
  template <class Ids>
  void train_batch(std::uint64_t seed, std::int64_t step, std::size_t first, std::size_t B, const Ids& ids,
                   const Ids& targets) const {
    const std::size_t T = m_context, span = m_val_begin >= T + 1 ? m_val_begin - T - 1 : 0;
    for (std::size_t b = 0; b < B; ++b) {
      const double u =
          random_uniform(RngKey{seed, 1000}, static_cast<std::uint64_t>(step) * (std::uint64_t(1) << 20) + first + b);
      fill(static_cast<std::size_t>(u * static_cast<double>(span + 1)) % (span + 1), b, ids, targets);
    }
  }

  /// \brief How many validation windows of one context there are (at least 1).
  std::size_t val_windows() const noexcept { return std::max<std::size_t>(1, (val_size() - 1) / m_context); }
  /// \brief Validation windows [first, first + B) (taken modulo val_windows()).
  template <class Ids>
  void val_batch(std::size_t first, std::size_t B, const Ids& ids, const Ids& targets) const {
    for (std::size_t b = 0; b < B; ++b) fill(m_val_begin + ((first + b) % val_windows()) * m_context, b, ids, targets);
  }

 private:
  template <class Ids>
  void fill(std::size_t start, std::size_t b, const Ids& ids, const Ids& targets) const {
    const std::size_t T = m_context;
    for (std::size_t t = 0; t < T; ++t) {
      ids(b * T + t)     = static_cast<unsigned char>(m_bytes[start + t]);
      targets(b * T + t) = static_cast<unsigned char>(m_bytes[start + t + 1]);
    }
  }

  std::string m_path;
  std::size_t m_context;
  std::string m_bytes;
  std::size_t m_val_begin     = 0;
  std::uint64_t m_fingerprint = 14695981039346656037ull;
};

}  // namespace pmt::io
