// SPDX-License-Identifier: Apache-2.0
#pragma once
// The portable matmul: a Kokkos TeamPolicy kernel, one team per NC-wide column panel of C and
// run of MC-row blocks (per batch), K walked in KC panels. Each panel of op(A) and op(B) is packed
// into team scratch in micro-panel order (zero-padded), then each team thread computes MR x NR
// micro-tiles with register accumulators and adds them into C. Tile sizes come from
// MatmulTiling<Exec, T>; on the host the micro-kernel is written with GCC/Clang vector extensions
// (the host's vector width), elsewhere as plain loops.
// Deterministic: every element of C is summed in a fixed order, independent of thread count.

#include "pmt/core/tensor.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace pmt::detail {

/// Block and register tile sizes of the portable matmul for an execution space.
template <class Exec, class T, class Enable = void>
struct MatmulTiling {  // GPU-like spaces: many threads per team, small register tiles
  static constexpr int MR = 4, NR = 4, MC = 64, NC = 64, KC = 32;
  static constexpr int team_size = (MC / MR) * (NC / NR);
};

/// Bytes in one SIMD register of the target the host code is compiled for.
#if defined(__AVX512F__)
inline constexpr int host_vector_bytes = 64;  // 32 zmm registers
#elif defined(__AVX__)
inline constexpr int host_vector_bytes = 32;  // 16 ymm registers
#else
inline constexpr int host_vector_bytes = 16;  // SSE2 / NEON: 16 (or 32) registers
#endif

template <class Exec, class T>
struct MatmulTiling<Exec, T, std::enable_if_t<is_host_space_v<Exec>>> {
  // One thread per team on the host. NR = two vector registers; MR rows give MR x 2 register
  // accumulators plus 2 for B and 1 broadcast: 8x2 of 32 zmm (AVX-512), 6x2 of 16 ymm (AVX2).
  static constexpr int W  = static_cast<int>(host_vector_bytes / sizeof(T));
  static constexpr int MR = host_vector_bytes == 64 ? 8 : (host_vector_bytes == 32 ? 6 : 4);
  static constexpr int NR = 2 * W, MC = MR * 48, NC = NR * 24, KC = 256;
  static constexpr int team_size = 1;
};

/// C[0..ie)[0..je) = alpha * sum_p a[p][i] b[p][j] + (first ? beta C : C), for the packed
/// micro-panels a (kc x MR) and b (kc x NR); C has row stride ldc. With first and beta == 0, C is
/// not read (it may hold NaN). A whole tile is updated with vector loads and stores on the host.
template <class T, int MR, int NR>
KOKKOS_INLINE_FUNCTION void matmul_micro_tile(int kc, const T* a, const T* b, T* c, std::int64_t ldc, int ie, int je,
                                              T alpha, T beta, bool first) {
  T acc[MR * NR];
#if defined(__GNUC__) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
  constexpr int W = static_cast<int>(host_vector_bytes / sizeof(T));
  if constexpr (NR % W == 0) {
    typedef T vec __attribute__((vector_size(host_vector_bytes)));
    constexpr int NV = NR / W;
    vec r[MR][NV];
    for (int i = 0; i < MR; ++i)
      for (int v = 0; v < NV; ++v) r[i][v] = vec{};
#if !defined(__NVCC__) && !defined(__clang__)
#pragma GCC unroll 4
#endif
    for (int p = 0; p < kc; ++p) {
      vec bv[NV];
      for (int v = 0; v < NV; ++v) std::memcpy(&bv[v], b + p * NR + v * W, sizeof(vec));
      for (int i = 0; i < MR; ++i) {
        const T ai = a[p * MR + i];
        for (int v = 0; v < NV; ++v) r[i][v] += ai * bv[v];
      }
    }
    if (ie == MR && je == NR) {  // whole tile: update C in registers
      for (int i = 0; i < MR; ++i)
        for (int v = 0; v < NV; ++v) {
          T* cp = c + i * ldc + v * W;
          vec prev{};
          if (!first || beta != T(0)) {
            std::memcpy(&prev, cp, sizeof(vec));
            if (first) prev *= beta;
          }
          const vec out = prev + alpha * r[i][v];
          std::memcpy(cp, &out, sizeof(vec));
        }
      return;
    }
    for (int i = 0; i < MR; ++i)
      for (int v = 0; v < NV; ++v) std::memcpy(acc + i * NR + v * W, &r[i][v], sizeof(vec));
  } else
#endif
  {
    for (int i = 0; i < MR * NR; ++i) acc[i] = T(0);
    for (int p = 0; p < kc; ++p)
      for (int i = 0; i < MR; ++i) {
        const T ai = a[p * MR + i];
        for (int j = 0; j < NR; ++j) acc[i * NR + j] += ai * b[p * NR + j];
      }
  }
  for (int i = 0; i < ie; ++i) {
    T* c_row = c + i * ldc;
    for (int j = 0; j < je; ++j) {
      const T prev = first ? (beta == T(0) ? T(0) : beta * c_row[j]) : c_row[j];
      c_row[j]     = prev + alpha * acc[i * NR + j];
    }
  }
}

/// Packs X(i, p) (i < rows, p < kc) into micro-panels of (kc x R): dst[(i / R) R kc + p R + i % R],
/// with zeros for the rows up to a whole panel. `along_i`: X(i, p) = src[p ld + i], contiguous
/// along i (a team index packs one k step of every panel); else X(i, p) = src[i ld + p] (a team
/// index packs one (panel, k step) pair: R values gathered from R rows).
template <int R, class Member, class T>
KOKKOS_INLINE_FUNCTION void matmul_pack(const Member& team, T* dst, const T* src, std::int64_t ld, int rows, int kc,
                                        bool along_i) {
  const int panels = (rows + R - 1) / R;
  if (along_i) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kc), [&](int p) {
      const T* s = src + p * ld;
      T* d       = dst + p * R;
      for (int ib = 0; ib < panels * R; ib += R, d += R * kc) {
        if (ib + R <= rows) {
          for (int r = 0; r < R; ++r) d[r] = s[ib + r];
        } else {
          for (int r = 0; r < R; ++r) d[r] = ib + r < rows ? s[ib + r] : T(0);
        }
      }
    });
  } else {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, panels * kc), [&](int t) {
      const int ib = t / kc * R, p = t % kc, e = rows - ib < R ? rows - ib : R;
      const T* s = src + ib * ld + p;
      T* d       = dst + ib * kc + p * R;
      for (int r = 0; r < e; ++r) d[r] = s[r * ld];
      for (int r = e; r < R; ++r) d[r] = T(0);
    });
  }
}

/// Strided, batched description of one operand: element (b, r, c) of op(X) is
/// ptr[b*batch_stride + (trans ? c*ld + r : r*ld + c)].
template <class T>
struct MatmulOperand {
  const T* ptr;
  std::int64_t ld, batch_stride;
  bool trans;
  KOKKOS_INLINE_FUNCTION T at(std::int64_t b, std::int64_t r, std::int64_t c) const {
    return ptr[b * batch_stride + (trans ? c * ld + r : r * ld + c)];
  }
};

/// Bytes of team scratch the portable matmul asks per team: its packed op(A) and op(B) panels.
template <class Exec, class T>
std::size_t matmul_portable_scratch_bytes() {
  using Tiling  = MatmulTiling<Exec, T>;
  using Scratch = Kokkos::View<T*, typename Exec::scratch_memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  return Scratch::shmem_size(static_cast<std::size_t>(Tiling::MC) * Tiling::KC +
                             static_cast<std::size_t>(Tiling::KC) * Tiling::NC);
}

/// C[b] = alpha op(A[b]) op(B[b]) + beta C[b] for b < batch; C is (batch, M, N) row-major.
/// Loop order as in BLIS: a team owns an NC-wide column panel of C and a run of MC-row blocks of
/// it; per KC panel it packs op(B) once and reuses it over all its row blocks, packing op(A) per
/// block; within a block the B micro-panel stays in L1 while the A micro-panels stream from L2.
template <class Exec, class T>
void matmul_portable(const Exec& exec, std::int64_t batch, std::int64_t M, std::int64_t N, std::int64_t K, T alpha,
                     MatmulOperand<T> A, MatmulOperand<T> B, T beta, T* C, std::int64_t ldc,
                     std::int64_t c_batch_stride, const char* label) {
  using Tiling     = MatmulTiling<Exec, T>;
  constexpr int MR = Tiling::MR, NR = Tiling::NR, MC = Tiling::MC, NC = Tiling::NC, KC = Tiling::KC;
  using Policy  = Kokkos::TeamPolicy<Exec>;
  using Member  = typename Policy::member_type;
  using Scratch = Kokkos::View<T*, typename Exec::scratch_memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  // Column panels and row blocks of even size (at most NC and MC, whole micro-panels), so that
  // no thread is left with a thin remainder. On the host (one thread per team), fewer rows per
  // block when there would be too few blocks to give every thread two of them (small products);
  // a GPU team keeps whole MC-row blocks, which its threads fill. Then the blocks of a column
  // panel are grouped into runs, as few as still give every team slot of the space two teams.
  auto even = [](std::int64_t n, std::int64_t parts, std::int64_t unit) {
    return ((n + parts - 1) / parts + unit - 1) / unit * unit;
  };
  const std::int64_t want = 2 * static_cast<std::int64_t>(exec.concurrency()) / Tiling::team_size;
  const std::int64_t ncb  = N > 0 ? even(N, (N + NC - 1) / NC, NR) : NC;
  const std::int64_t bn   = (N + ncb - 1) / ncb;
  std::int64_t blocks_m   = (M + MC - 1) / MC;
  if (Tiling::team_size == 1 && batch * bn * blocks_m < want) blocks_m = (want + batch * bn - 1) / (batch * bn);
  const std::int64_t mcb    = M > 0 ? even(M, blocks_m, MR) : MC;
  const std::int64_t bm     = (M + mcb - 1) / mcb;
  std::int64_t runs         = (want + batch * bn - 1) / (batch * bn);
  runs                      = runs > bm ? bm : (runs < 1 ? 1 : runs);
  const std::int64_t league = batch * runs * bn;
  if (league == 0 || M == 0) return;
  // The host's packed panels (about 1 MiB) exceed the level-0 limit that newer Kokkos enforces
  // (32 KiB on OpenMP, "roughly L1"); they go to level 1, which on the host is the same
  // thread-private memory. A GPU team's panels (16 KiB) fit level 0: shared memory.
  const std::size_t scratch_bytes = matmul_portable_scratch_bytes<Exec, T>();
  const int level                 = scratch_bytes <= static_cast<std::size_t>(Policy::scratch_size_max(0)) ? 0 : 1;
  Policy policy(exec, static_cast<int>(league), Tiling::team_size);
  policy = policy.set_scratch_size(level, Kokkos::PerTeam(scratch_bytes));

  Kokkos::parallel_for(
      label, policy, KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t id  = team.league_rank();
        const std::int64_t b   = id / (runs * bn);
        const std::int64_t run = id / bn % runs, n0 = (id % bn) * ncb;
        const std::int64_t blk_lo = run * bm / runs, blk_hi = (run + 1) * bm / runs;
        const int nc = static_cast<int>(N - n0 < ncb ? N - n0 : ncb);
        const int np = (nc + NR - 1) / NR * NR;  // packed columns: whole micro-panels
        Scratch Ap(team.team_scratch(level), MC * KC), Bp(team.team_scratch(level), KC * NC);
        const T* a_base = A.ptr + b * A.batch_stride;
        const T* b_base = B.ptr + b * B.batch_stride;
        T* c_panel      = C + b * c_batch_stride + n0;
        for (std::int64_t k0 = 0; k0 < (K > 0 ? K : 1); k0 += KC) {
          const int kc     = static_cast<int>(K - k0 < KC ? K - k0 : KC);
          const bool first = k0 == 0;
          // Pack op(B)[k0.., n0..] as micro-panels of (kc x NR), columns past nc zero.
          team.team_barrier();  // the previous panel's tiles are done with Bp
          const std::int64_t b_at = B.trans ? n0 * B.ld + k0 : k0 * B.ld + n0;
          matmul_pack<NR>(team, Bp.data(), b_base + b_at, B.ld, nc, kc, !B.trans);
          for (std::int64_t blk = blk_lo; blk < blk_hi; ++blk) {
            const std::int64_t m0 = blk * mcb;
            const int mc          = static_cast<int>(M - m0 < mcb ? M - m0 : mcb);
            const int mp          = (mc + MR - 1) / MR * MR;  // packed rows: whole micro-panels
            // Pack op(A)[m0.., k0..] as micro-panels of (kc x MR), rows past mc zero.
            team.team_barrier();  // the previous block's tiles are done with Ap
            const std::int64_t a_at = A.trans ? k0 * A.ld + m0 : m0 * A.ld + k0;
            matmul_pack<MR>(team, Ap.data(), a_base + a_at, A.ld, mc, kc, A.trans);
            team.team_barrier();
            T* c_block     = c_panel + m0 * ldc;
            const int ti_n = mp / MR;
            Kokkos::parallel_for(Kokkos::TeamThreadRange(team, ti_n * (np / NR)), [&](int t) {
              const int ti = t % ti_n, tj = t / ti_n;  // B micro-panel stays in L1
              const int ie = mc - ti * MR < MR ? mc - ti * MR : MR;
              const int je = nc - tj * NR < NR ? nc - tj * NR : NR;
              matmul_micro_tile<T, MR, NR>(kc, Ap.data() + ti * MR * kc, Bp.data() + tj * NR * kc,
                                           c_block + ti * MR * ldc + tj * NR, ldc, ie, je, alpha, beta, first);
            });
          }
        }
      });
}

}  // namespace pmt::detail
