// SPDX-License-Identifier: Apache-2.0
#pragma once
// Host memory that a training step frees and allocates again.
//
// Every step allocates its activations and work buffers as Views and frees them at the end.
// glibc's malloc hands blocks above its mmap threshold straight back to the kernel, and trims
// the top of the heap once more than twice that threshold is free, so the next step gets fresh
// pages and faults each one in (and the kernel zeroes it). For the width-256 GPT of
// bench_train_step that was about 35 000 page faults, a quarter of the step.
//
// keep_freed_host_memory() makes glibc keep such blocks for reuse. It changes a process-wide
// setting, so pmt never calls it by itself: programs opt in (train_gpt and the benchmarks do,
// and say so). Trainer::step warns once when a step page-faults heavily and nobody opted in.

#include "pmt/core/error.hpp"

#include <cstdio>

#if defined(__GLIBC__)
#include <malloc.h>
#endif
#if defined(__unix__) || defined(__APPLE__)
#include <sys/resource.h>
#endif

namespace pmt::detail {

inline bool& host_memory_kept_flag() noexcept {
  static bool kept = false;
  return kept;
}

}  // namespace pmt::detail

namespace pmt {

/// \brief Keeps host memory that is freed for reuse in this process instead of returning it to
/// the kernel: glibc's mmap threshold is fixed at its maximum (32 MiB on 64-bit; larger blocks
/// are still mapped and unmapped) and its trim threshold at 2 GiB. The process then holds on to
/// its peak heap. Process-wide; call once, e.g. right after pmt::ScopeGuard.
/// \return true when applied (glibc), false elsewhere (nothing changed).
inline bool keep_freed_host_memory() noexcept {
#if defined(__GLIBC__)
  const bool ok = mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024) == 1 && mallopt(M_TRIM_THRESHOLD, 0x7fffffff) == 1;
  detail::host_memory_kept_flag() = ok;
  return ok;
#else
  return false;
#endif
}

/// \brief Whether keep_freed_host_memory() has been applied in this process.
inline bool freed_host_memory_kept() noexcept { return detail::host_memory_kept_flag(); }

/// \brief This process' minor page faults so far (0 where the platform does not say).
inline long minor_page_faults() noexcept {
#if defined(__unix__) || defined(__APPLE__)
  rusage u{};
  return getrusage(RUSAGE_SELF, &u) == 0 ? static_cast<long>(u.ru_minflt) : 0L;
#else
  return 0L;
#endif
}

}  // namespace pmt

namespace pmt::detail {

/// Counts the page faults of each step (two getrusage calls) and, on rank 0, warns once when a
/// step after the first two faulted in more than 64 MiB of fresh pages while the process has not
/// called keep_freed_host_memory().
class PageFaultWatch {
 public:
  void begin() noexcept { m_start = minor_page_faults(); }
  void end(const char* where) noexcept {
    const long faults = minor_page_faults() - m_start;
    if (++m_steps <= 2 || m_warned || freed_host_memory_kept() || process_context().rank != 0) return;
    constexpr long threshold = 16384;  // 64 MiB of 4 KiB pages
    if (faults < threshold) return;
    m_warned = true;
    std::fprintf(stderr,
                 "pmt: warning: %s page-faulted %ld times in one step (%.0f MiB of fresh pages): the "
                 "C library returns freed activation memory to the kernel and the next step faults "
                 "it in again. Call pmt::keep_freed_host_memory() once after pmt::ScopeGuard "
                 "(pmt/core/host_memory.hpp) to keep it for reuse.\n",
                 where, faults, static_cast<double>(faults) * 4096.0 / (1 << 20));
  }

 private:
  long m_start = 0;
  long m_steps = 0;
  bool m_warned = false;
};

}  // namespace pmt::detail
