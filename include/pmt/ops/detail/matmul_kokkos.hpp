// SPDX-License-Identifier: Apache-2.0
#pragma once
// The portable matmul: a Kokkos TeamPolicy kernel, one team per (MC x NC) block of C (per batch),
// K walked in KC panels. Each panel of op(A) and op(B) is packed into team scratch in micro-panel
// order (zero-padded), then each team thread computes MR x NR micro-tiles with register
// accumulators. Tile sizes come from MatmulTiling<Exec, T>; on the host the micro-kernel is
// written with GCC/Clang vector extensions (512-bit), elsewhere as plain loops.
// Deterministic: every element of C is summed in a fixed order, independent of thread count.

#include "pmt/core/tensor.hpp"

#include <Kokkos_Core.hpp>

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

/// acc[MR][NR] = sum_p a[p][0..MR) (x) b[p][0..NR)   (packed micro-panels, kc steps)
template <class T, int MR, int NR>
KOKKOS_INLINE_FUNCTION void matmul_micro_tile(int kc, const T* a, const T* b, T* acc) {
#if defined(__GNUC__) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
  constexpr int W = static_cast<int>(host_vector_bytes / sizeof(T));
  if constexpr (NR % W == 0) {
    typedef T vec __attribute__((vector_size(host_vector_bytes)));
    constexpr int NV = NR / W;
    vec c[MR][NV];
    for (int i = 0; i < MR; ++i)
      for (int v = 0; v < NV; ++v) c[i][v] = vec{} ;
    for (int p = 0; p < kc; ++p) {
      vec bv[NV];
      for (int v = 0; v < NV; ++v) std::memcpy(&bv[v], b + p * NR + v * W, sizeof(vec));
      for (int i = 0; i < MR; ++i) {
        const T ai = a[p * MR + i];
        for (int v = 0; v < NV; ++v) c[i][v] += ai * bv[v];
      }
    }
    for (int i = 0; i < MR; ++i)
      for (int v = 0; v < NV; ++v) std::memcpy(acc + i * NR + v * W, &c[i][v], sizeof(vec));
    return;
  }
#endif
  for (int i = 0; i < MR * NR; ++i) acc[i] = T(0);
  for (int p = 0; p < kc; ++p)
    for (int i = 0; i < MR; ++i) {
      const T ai = a[p * MR + i];
      for (int j = 0; j < NR; ++j) acc[i * NR + j] += ai * b[p * NR + j];
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

/// C[b] = alpha op(A[b]) op(B[b]) + beta C[b] for b < batch; C is (batch, M, N) row-major.
template <class Exec, class T>
void matmul_portable(const Exec& exec, std::int64_t batch, std::int64_t M, std::int64_t N,
                     std::int64_t K, T alpha, MatmulOperand<T> A, MatmulOperand<T> B, T beta, T* C,
                     std::int64_t ldc, std::int64_t c_batch_stride, const char* label) {
  using Tiling          = MatmulTiling<Exec, T>;
  constexpr int MR      = Tiling::MR, NR = Tiling::NR, MC = Tiling::MC, NC = Tiling::NC, KC = Tiling::KC;
  using Policy          = Kokkos::TeamPolicy<Exec>;
  using Member          = typename Policy::member_type;
  using Scratch         = Kokkos::View<T*, typename Exec::scratch_memory_space,
                                       Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  // Rows per team block: MC, or fewer (a multiple of MR) when there would be too few blocks to
  // give every thread of the space two of them (small products).
  const std::int64_t bn        = (N + NC - 1) / NC;
  const std::int64_t want      = 2 * static_cast<std::int64_t>(exec.concurrency());
  std::int64_t rows_per_block  = MC;
  if (batch * bn * ((M + MC - 1) / MC) < want) {
    const std::int64_t blocks_m = (want + batch * bn - 1) / (batch * bn);
    rows_per_block = ((M + blocks_m - 1) / blocks_m + MR - 1) / MR * MR;
    rows_per_block = rows_per_block < MR ? MR : (rows_per_block > MC ? MC : rows_per_block);
  }
  const std::int64_t mcb = rows_per_block;
  const std::int64_t bm  = (M + mcb - 1) / mcb;
  const std::int64_t league = batch * bm * bn;
  if (league == 0) return;
  const std::size_t scratch_bytes = Scratch::shmem_size(MC * KC + KC * NC);
  Policy policy(exec, static_cast<int>(league), Tiling::team_size);
  policy = policy.set_scratch_size(0, Kokkos::PerTeam(scratch_bytes));

  Kokkos::parallel_for(label, policy, KOKKOS_LAMBDA(const Member& team) {
    const std::int64_t id = team.league_rank();
    const std::int64_t b  = id / (bm * bn);
    const std::int64_t m0 = (id / bn % bm) * mcb, n0 = (id % bn) * NC;
    const int mc = static_cast<int>(M - m0 < mcb ? M - m0 : mcb);
    const int mp = (mc + MR - 1) / MR * MR;  // packed rows: mc rounded up to whole micro-panels
    const int nc = static_cast<int>(N - n0 < NC ? N - n0 : NC);
    Scratch Ap(team.team_scratch(0), MC * KC), Bp(team.team_scratch(0), KC * NC);
    T* c_block = C + b * c_batch_stride + m0 * ldc + n0;
    for (std::int64_t k0 = 0; k0 < (K > 0 ? K : 1); k0 += KC) {
      const int kc = static_cast<int>(K - k0 < KC ? K - k0 : KC);
      // Pack op(A)[m0.., k0..] as MC/MR micro-panels of (kc x MR), op(B)[k0.., n0..] as NC/NR
      // micro-panels of (kc x NR); rows/cols past the edge of C are zeros. The inner loop walks
      // the operand's contiguous dimension.
      if (!A.trans) {
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, mp), [&](int i) {
          T* dst = Ap.data() + (i / MR) * (MR * kc) + i % MR;
          if (i < mc) {
            const T* src = A.ptr + b * A.batch_stride + (m0 + i) * A.ld + k0;
            for (int p = 0; p < kc; ++p) dst[p * MR] = src[p];
          } else {
            for (int p = 0; p < kc; ++p) dst[p * MR] = T(0);
          }
        });
      } else {
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kc), [&](int p) {
          const T* src = A.ptr + b * A.batch_stride + (k0 + p) * A.ld + m0;
          T* dst       = Ap.data() + p * MR;
          for (int ib = 0; ib < mp; ib += MR, dst += MR * kc)  // one micro-panel row per step
            for (int r = 0; r < MR; ++r) dst[r] = ib + r < mc ? src[ib + r] : T(0);
        });
      }
      if (!B.trans) {
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kc), [&](int p) {
          const T* src = B.ptr + b * B.batch_stride + (k0 + p) * B.ld + n0;
          for (int jb = 0; jb < NC; jb += NR) {
            T* dst = Bp.data() + jb * kc + p * NR;
            for (int j = 0; j < NR; ++j) dst[j] = jb + j < nc ? src[jb + j] : T(0);
          }
        });
      } else {
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, NC), [&](int j) {
          T* dst = Bp.data() + (j / NR) * (NR * kc) + j % NR;
          if (j < nc) {
            const T* src = B.ptr + b * B.batch_stride + (n0 + j) * B.ld + k0;
            for (int p = 0; p < kc; ++p) dst[p * NR] = src[p];
          } else {
            for (int p = 0; p < kc; ++p) dst[p * NR] = T(0);
          }
        });
      }
      team.team_barrier();
      const bool first = k0 == 0;
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, (MC / MR) * (NC / NR)), [&](int t) {
        const int ti = t % (MC / MR), tj = t / (MC / MR);  // B micro-panel stays in L1
        if (ti * MR >= mc || tj * NR >= nc) return;
        T acc[MR * NR];
        matmul_micro_tile<T, MR, NR>(kc, Ap.data() + ti * MR * kc, Bp.data() + tj * NR * kc, acc);
        const int ie = mc - ti * MR < MR ? mc - ti * MR : MR;
        const int je = nc - tj * NR < NR ? nc - tj * NR : NR;
        for (int i = 0; i < ie; ++i) {
          T* c_row = c_block + (ti * MR + i) * ldc + tj * NR;
          for (int j = 0; j < je; ++j) {
            const T prev = first ? (beta == T(0) ? T(0) : beta * c_row[j]) : c_row[j];
            c_row[j]     = prev + alpha * acc[i * NR + j];
          }
        }
      });
      team.team_barrier();
    }
  });
}

}  // namespace pmt::detail
