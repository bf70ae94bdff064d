// SPDX-License-Identifier: Apache-2.0
#pragma once
// The host kernels of the bf16 product (ops::matmul_bf16 in ops/matmul.hpp): C = alpha
// bf16(op(A)) bf16(op(B)) + beta C with fp32 sums, on x86-64 CPUs with bf16 dot products.
//   - Operands are float. Packing rounds each element to the nearest bf16 (ties to even, as
//     pmt::bf16) into tile layout: op(A) in 32-row blocks of two 16x32 tiles per 32 k, op(B) in
//     16-column VNNI tiles (k pairs interleaved), both zero-padded to whole tiles. Both kernels
//     read the same packing.
//   - amx_block: Intel AMX (TDPBF16PS: 16x16 fp32 += 16x32 bf16 times 32x16 bf16 per
//     instruction), a 32x32 block of C in four accumulator tiles.
//   - avx512_block: AVX512-BF16 (VDPBF16PS: 16 fp32 += 16 pairs of bf16 products), the same block
//     as four 8x32 register blocks, where a CPU has AVX512-BF16 but no AMX (Zen 4, Cooper Lake).
//   - Each block of C is summed over the whole k extent by one thread and written once: every
//     element is summed in the same order whatever the thread count (deterministic).
//   - Compiled where the compiler is GCC or Clang on x86-64 (not nvcc's passes) with the AMX
//     intrinsics; functions carry their own target attributes, so no -m flag is needed. amx is
//     used only where the CPU has AMX-TILE, AMX-BF16 and AVX-512BW and Linux grants the tile state
//     (arch_prctl ARCH_REQ_XCOMP_PERM); avx512 where it has AVX512-BF16 and AVX-512BW: kernel().

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(__NVCOMPILER) && defined(__linux__) && __has_include(<amxtileintrin.h>)
#define PMT_HOST_AMX 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define PMT_HOST_AMX 0
#endif

namespace pmt::detail::hostbf16 {

#if PMT_HOST_AMX

#define PMT_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))

#define PMT_AVX512BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))

/// Whether this CPU and kernel run AMX bf16 tiles for this process (asks Linux for the tile data
/// state once).
inline bool amx_available() {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool amx_bf16 = (d >> 22) & 1u, amx_tile = (d >> 24) & 1u;
    const bool avx512f = (b >> 16) & 1u, avx512bw = (b >> 30) & 1u;
    if (!(amx_bf16 && amx_tile && avx512f && avx512bw)) return false;
    constexpr long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
  }();
  return ok;
}

/// The tile configuration: palette 1, every tile 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16]   = {};
  std::uint8_t rows[16]     = {};
};

PMT_AMX_TARGET inline void configure() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  // ldtilecfg itself, with the whole configuration as its operand: _tile_loadconfig names only
  // its first 8 bytes, and GCC at -O2 may then leave the rest unwritten (an illegal instruction
  // at the first tile operation)
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
}

PMT_AMX_TARGET inline void release() { _tile_release(); }

/// (Shifts and narrowing are written as their all-lanes zero-masked forms: the same instructions, without the
/// undefined pass-through operand GCC 12 reports as "may be used uninitialized".)
/// 16 floats at p (the lanes of `m`; the others read as 0) rounded to bf16, each in the low half
/// of a 32-bit lane: nearest, ties to even; nan stays a quiet nan (as pmt::bf16::round).
PMT_AMX_TARGET inline __m512i round16(const float* p, __mmask16 m) {
  const __m512i u  = _mm512_maskz_loadu_epi32(m, p);
  const __m512i hi = _mm512_maskz_srli_epi32(0xFFFF, u, 16);
  const __m512i r  = _mm512_maskz_srli_epi32(
       0xFFFF,
       _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), _mm512_and_si512(hi, _mm512_set1_epi32(1)))), 16);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  return _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
}

inline __mmask16 lanes(std::int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u); }

/// Sizes of the packed operands, in bf16 elements: 32-row blocks of op(A) (two 16x32 tiles per
/// 32 k) and 16-column VNNI blocks of op(B) (one 16-pair tile per 32 k), columns padded to 32.
struct Packing {
  std::int64_t M, N, K, mb, nb, kb;  // blocks: 32 rows, 16 columns (even count), 32 k
  Packing(std::int64_t M_, std::int64_t N_, std::int64_t K_)
      : M(M_), N(N_), K(K_), mb((M_ + 31) / 32), nb(2 * ((N_ + 31) / 32)), kb((K_ + 31) / 32) {}
  std::int64_t a_elems() const { return mb * kb * 1024; }
  std::int64_t b_elems() const { return nb * kb * 512; }
};

/// Packs the rows [32 r, 32 r + 32) of op(A) (a(m, k) = A[m lda + k], or A[k lda + m] when
/// transposed) for all k into dst: per 32 k, two 16x32 tiles (row-major, 64 bytes a row).
PMT_AMX_TARGET inline void pack_a(const Packing& p, std::int64_t r, const float* A, std::int64_t lda, bool at,
                                  std::uint16_t* dst) {
  std::uint16_t* out = dst + r * p.kb * 1024;
  std::memset(out, 0, std::size_t(p.kb) * 1024 * sizeof(std::uint16_t));
  const std::int64_t m0 = 32 * r, rows = p.M - m0 < 32 ? p.M - m0 : 32;
  if (!at) {
    for (std::int64_t i = 0; i < rows; ++i) {
      const float* row = A + (m0 + i) * lda;
      for (std::int64_t kb = 0; kb < p.kb; ++kb) {
        const std::int64_t k0 = 32 * kb;
        const __m512i lo      = round16(row + k0, lanes(p.K - k0));
        const __m512i hi      = round16(row + k0 + 16, p.K - k0 > 16 ? lanes(p.K - k0 - 16) : __mmask16(0));
        std::uint16_t* t      = out + kb * 1024 + (i / 16) * 512 + (i % 16) * 32;
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(t), _mm512_maskz_cvtepi32_epi16(0xFFFF, lo));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(t + 16), _mm512_maskz_cvtepi32_epi16(0xFFFF, hi));
      }
    }
  } else {
    // a(m, k) = A[k lda + m]: 16 consecutive m of one k, scattered over the tile rows
    alignas(64) std::uint32_t v[16];
    for (std::int64_t k = 0; k < p.K; ++k) {
      const float* src = A + k * lda + m0;
      std::uint16_t* t = out + (k / 32) * 1024 + (k % 32);
      for (std::int64_t h = 0; h * 16 < rows; ++h) {
        _mm512_store_si512(v, round16(src + 16 * h, lanes(rows - 16 * h)));
        for (int i = 0; i < 16; ++i) t[h * 512 + i * 32] = std::uint16_t(v[i]);
      }
    }
  }
}

/// Packs the 16 columns [16 c, 16 c + 16) of op(B) (b(k, n) = B[k ldb + n], or B[n ldb + k] when
/// transposed) for all k into dst: per 32 k, a 16x16 tile of (k, k + 1) pairs.
PMT_AMX_TARGET inline void pack_b(const Packing& p, std::int64_t c, const float* B, std::int64_t ldb, bool bt,
                                  std::uint16_t* dst) {
  std::uint32_t* out = reinterpret_cast<std::uint32_t*>(dst + c * p.kb * 512);
  std::memset(out, 0, std::size_t(p.kb) * 512 * sizeof(std::uint16_t));
  const std::int64_t n0 = 16 * c, cols = p.N - n0 < 16 ? (p.N - n0 > 0 ? p.N - n0 : 0) : 16;
  if (cols == 0) return;
  if (!bt) {
    const __mmask16 m = lanes(cols);
    for (std::int64_t k = 0; k < p.K; k += 2) {
      const __m512i even = round16(B + k * ldb + n0, m);
      const __m512i odd  = k + 1 < p.K ? round16(B + (k + 1) * ldb + n0, m) : _mm512_setzero_si512();
      _mm512_storeu_si512(out + (k / 32) * 256 + ((k % 32) / 2) * 16,
                          _mm512_or_si512(even, _mm512_maskz_slli_epi32(0xFFFF, odd, 16)));
    }
  } else {
    // b(k, n) = B[n ldb + k]: one column is 32 consecutive k, i.e. 16 pairs, a column of the tile
    alignas(64) std::uint16_t v[32];
    for (std::int64_t j = 0; j < cols; ++j) {
      const float* src = B + (n0 + j) * ldb;
      for (std::int64_t kb = 0; kb < p.kb; ++kb) {
        const std::int64_t k0 = 32 * kb;
        _mm256_store_si256(reinterpret_cast<__m256i*>(v),
                           _mm512_maskz_cvtepi32_epi16(0xFFFF, round16(src + k0, lanes(p.K - k0))));
        _mm256_store_si256(reinterpret_cast<__m256i*>(v + 16),
                           _mm512_maskz_cvtepi32_epi16(
                               0xFFFF, round16(src + k0 + 16, p.K - k0 > 16 ? lanes(p.K - k0 - 16) : __mmask16(0))));
        std::uint32_t pairs[16];
        std::memcpy(pairs, v, sizeof pairs);
        std::uint32_t* t = out + kb * 256 + j;
        for (int q = 0; q < 16; ++q) t[q * 16] = pairs[q];
      }
    }
  }
}

/// Whether this CPU runs AVX512-BF16 (and AVX-512BW for the packing).
inline bool avx512_available() {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((b >> 16) & 1u) || !((b >> 30) & 1u)) return false;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !((a >> 5) & 1u)) return false;  // AVX512_BF16
    return __builtin_cpu_supports("avx512f") != 0;                                   // and the OS keeps the zmm state
  }();
  return ok;
}

/// C block rows [m0, m0 + rows) x columns [n0, n0 + cols) = alpha acc + beta C (acc: 32 floats a
/// row); beta 0 reads no C (NaNs in C do not propagate), as the fp32 matmul.
PMT_AVX512BF16_TARGET inline void store_block(const float* acc, std::int64_t m0, std::int64_t n0, std::int64_t rows,
                                              std::int64_t cols, float alpha, float beta, float* C, std::int64_t ldc) {
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (std::int64_t i = 0; i < rows; ++i) {
    float* out = C + (m0 + i) * ldc + n0;
    for (std::int64_t h = 0; h * 16 < cols; ++h) {
      const __mmask16 m = lanes(cols - 16 * h);
      const __m512 x    = _mm512_mul_ps(va, _mm512_load_ps(acc + i * 32 + 16 * h));
      const __m512 y    = beta == 0.0f ? x : _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, out + 16 * h), x);
      _mm512_mask_storeu_ps(out + 16 * h, m, y);
    }
  }
}

/// The same block as amx_block with AVX512-BF16: per 8 rows, 16 accumulators (8 rows x 32
/// columns); per k pair, two 16-column VNNI rows of B and one broadcast pair of each A row.
PMT_AVX512BF16_TARGET inline void avx512_block(const Packing& p, std::int64_t r, std::int64_t c,
                                               const std::uint16_t* Ap, const std::uint16_t* Bp, float alpha,
                                               float beta, float* C, std::int64_t ldc) {
  alignas(64) float acc[32 * 32];
  const std::uint16_t* a  = Ap + r * p.kb * 1024;
  const std::uint16_t* b0 = Bp + (2 * c) * p.kb * 512;
  const std::uint16_t* b1 = b0 + p.kb * 512;
  const std::int64_t m0 = 32 * r, rows = p.M - m0 < 32 ? p.M - m0 : 32;
  for (std::int64_t i0 = 0; i0 < rows; i0 += 8) {
    __m512 s[8][2];
    for (int i = 0; i < 8; ++i) s[i][0] = s[i][1] = _mm512_setzero_ps();
    // row i of this sub-block: tile (i0 + i) / 16, row (i0 + i) % 16, 32 bf16 (16 pairs) per k block
    const std::uint16_t* arow = a + (i0 / 16) * 512 + (i0 % 16) * 32;
    for (std::int64_t kb = 0; kb < p.kb; ++kb) {
      const std::uint16_t* ak  = arow + kb * 1024;
      const std::uint16_t* bk0 = b0 + kb * 512;
      const std::uint16_t* bk1 = b1 + kb * 512;
      for (int q = 0; q < 16; ++q) {
        const __m512bh x0 = (__m512bh)_mm512_loadu_si512(bk0 + q * 32);
        const __m512bh x1 = (__m512bh)_mm512_loadu_si512(bk1 + q * 32);
        for (int i = 0; i < 8; ++i) {
          std::uint32_t pair;
          std::memcpy(&pair, ak + i * 32 + 2 * q, sizeof pair);
          const __m512bh y = (__m512bh)_mm512_set1_epi32(int(pair));
          s[i][0]          = _mm512_dpbf16_ps(s[i][0], y, x0);
          s[i][1]          = _mm512_dpbf16_ps(s[i][1], y, x1);
        }
      }
    }
    for (int i = 0; i < 8; ++i) {
      _mm512_store_ps(acc + (i0 + i) * 32, s[i][0]);
      _mm512_store_ps(acc + (i0 + i) * 32 + 16, s[i][1]);
    }
  }
  const std::int64_t n0 = 32 * c, cols = p.N - n0 < 32 ? p.N - n0 : 32;
  store_block(acc, m0, n0, rows, cols, alpha, beta, C, ldc);
}

/// The 32x32 block (row block r, column blocks 2 c and 2 c + 1) of alpha op(A) op(B) + beta C.
/// The tile configuration must be loaded (configure()).
PMT_AMX_TARGET inline void amx_block(const Packing& p, std::int64_t r, std::int64_t c, const std::uint16_t* Ap,
                                     const std::uint16_t* Bp, float alpha, float beta, float* C, std::int64_t ldc) {
  alignas(64) float acc[32 * 32];
  const std::uint16_t* a  = Ap + r * p.kb * 1024;
  const std::uint16_t* b0 = Bp + (2 * c) * p.kb * 512;
  const std::uint16_t* b1 = b0 + p.kb * 512;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (std::int64_t kb = 0; kb < p.kb; ++kb) {
    _tile_loadd(4, a + kb * 1024, 64);
    _tile_loadd(5, a + kb * 1024 + 512, 64);
    _tile_loadd(6, b0 + kb * 512, 64);
    _tile_loadd(7, b1 + kb * 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, acc, 128);
  _tile_stored(1, acc + 16, 128);
  _tile_stored(2, acc + 512, 128);
  _tile_stored(3, acc + 528, 128);
  const std::int64_t m0 = 32 * r, n0 = 32 * c;
  const std::int64_t rows = p.M - m0 < 32 ? p.M - m0 : 32, cols = p.N - n0 < 32 ? p.N - n0 : 32;
  store_block(acc, m0, n0, rows, cols, alpha, beta, C, ldc);
}

/// Per-thread packing buffers, 64-byte aligned, grown as needed and kept.
inline std::uint16_t* buffer(int which, std::int64_t elems) {
  thread_local std::vector<std::uint16_t> store[2];
  auto& v = store[which];
  if (std::int64_t(v.size()) < elems + 32) v.resize(std::size_t(elems + 32));
  const auto addr = reinterpret_cast<std::uintptr_t>(v.data());
  return reinterpret_cast<std::uint16_t*>((addr + 63) & ~std::uintptr_t(63));
}

#undef PMT_AMX_TARGET
#undef PMT_AVX512BF16_TARGET

#else

inline bool amx_available() { return false; }
inline bool avx512_available() { return false; }

#endif  // PMT_HOST_AMX

}  // namespace pmt::detail::hostbf16
