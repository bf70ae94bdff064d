// SPDX-License-Identifier: Apache-2.0
#pragma once
// Causal multi-head self-attention on (B, T, C) with H heads, forward and backward, built from
// pmt's batched matmul and masked softmax (llm.c's layout). Legend: B batch, T sequence, C width,
// H heads, hs = C / H head size, BH = B * H.
//   forward:  qkv (B, T, 3C) -> q, k, v (B, H, T, hs) -> att = softmax_causal(q k^T / sqrt(hs))
//             (B, H, T, T) -> y = att v (B, H, T, hs) -> out (B, T, C)
//   backward: dout (B, T, C) -> dqkv (B, T, 3C), from q, k, v, att kept in AttentionCache.
// Each also takes q, k, v (and dq, dk, dv) as three separate (B, T, C) tensors: the projections'
// outputs and input gradients as they are, without packing them into one (B, T, 3C) first.
// Under tensor parallelism the caller passes the local heads: qkv (B, T, 3 C/tp), H / tp heads.
// Two implementations, the same arithmetic per element up to the order of the products' sums:
//   fused (host memory with CBLAS, at least as many heads B*H as threads): one task per (b, h)
//     does that head's whole forward or backward in cache, reading q, k, v, dout and writing out,
//     dq, dk, dv in place (no head split or merge passes), and computes each product only over
//     the causal (lower) part: row panels of `attention_panel` rows take the columns up to the
//     panel's end (for T = 128, 62.5 % of the full products' work);
//   generic (any space, or fewer heads than threads): batched matmuls over all B*H heads and the
//     masked row-wise softmax, with explicit head split and merge.
// Where both can run, the matmul path setting chooses (ops/matmul.hpp): vendor takes fused,
// portable takes generic, and auto measures both forwards on the first call of a shape class
// (scalar, ceil log2 of B*H, T and hs) like any product, agreed over the ranks; the fused one
// calls the vendor BLAS per head, so a BLAS with slow kernels for the CPU makes it lose.

#include "pmt/core/error.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/core/workspace.hpp"
#include "pmt/ops/matmul.hpp"
#include "pmt/ops/softmax.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace pmt::detail {

/// A (B, H, rows, cols) attention buffer, not zero-filled: each is written in full before it is
/// read (the head split, or a product with beta 0).
template <class T, class Exec>
Tensor<T, 4, Exec> attention_buffer(const char* label, std::int64_t B, std::int64_t H, std::int64_t rows,
                                    std::int64_t cols) {
  return workspace_view<Tensor<T, 4, Exec>>(label, static_cast<std::size_t>(B), static_cast<std::size_t>(H),
                                            static_cast<std::size_t>(rows), static_cast<std::size_t>(cols));
}

}  // namespace pmt::detail

namespace pmt::ops {

/// \brief What attention's backward needs from its forward; make_attention_cache sizes it.
/// Backward's own work buffers (dq, dk, dv and the (B, H, T, T) score gradient) are allocated by
/// attention_backward and freed when it returns: a microbatch waiting for its backward holds one
/// T x T matrix per head, not two.
template <class T, class Exec>
struct AttentionCache {
  std::int64_t B = 0, T_ = 0, C = 0, H = 0;
  Tensor<T, 4, Exec> q, k, v;  // (B, H, T, hs)
  Tensor<T, 4, Exec> att;      // (B, H, T, T) softmax output
  Tensor<T, 4, Exec> y;        // (B, H, T, hs) att v, before the head merge; backward's dy
};

/// \brief Allocates an AttentionCache for (B, T, C) inputs with H heads.
/// \throws pmt::ShapeError when C is not a positive multiple of H.
template <class T, class Exec>
AttentionCache<T, Exec> make_attention_cache(std::int64_t B, std::int64_t T_, std::int64_t C, std::int64_t H) {
  detail::require(H > 0 && C % H == 0, "pmt::ops::make_attention_cache",
                  [&] { return detail::str("width C = ", C, " is not divisible by heads H = ", H); });
  detail::require(C > 0 && B >= 0 && T_ >= 0, "pmt::ops::make_attention_cache", [&] {
    return detail::str("(B, T, C) = (", B, ", ", T_, ", ", C, "); expected C > 0 (a head of at least one feature)");
  });
  const std::int64_t hs = C / H;
  AttentionCache<T, Exec> c;
  c.B = B, c.T_ = T_, c.C = C, c.H = H;
  c.q   = detail::attention_buffer<T, Exec>("pmt::ops::attention::q", B, H, T_, hs);
  c.k   = detail::attention_buffer<T, Exec>("pmt::ops::attention::k", B, H, T_, hs);
  c.v   = detail::attention_buffer<T, Exec>("pmt::ops::attention::v", B, H, T_, hs);
  c.att = detail::attention_buffer<T, Exec>("pmt::ops::attention::att", B, H, T_, T_);
  c.y   = detail::attention_buffer<T, Exec>("pmt::ops::attention::y", B, H, T_, hs);
  return c;
}

}  // namespace pmt::ops

namespace pmt::detail {

/// A rank-4 (B, H, X, Y) tensor seen as rank-3 (B*H, X, Y), unmanaged.
template <class V>
auto as_batched(const V& v) {
  using T = typename V::value_type;
  return Kokkos::View<T***, Kokkos::LayoutRight, typename V::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
      v.data(), v.extent(0) * v.extent(1), v.extent(2), v.extent(3));
}

/// Throws unless qkv-like is (B, T, 3C) and out-like is (B, T, C) for the cache's B, T, C; the
/// names say which tensors they are ("qkv"/"out" forward, "dqkv"/"dout" backward).
template <class T, class Exec, class QV, class OV>
void check_attention(const char* op, const char* qkv_name, const QV& qkv, const char* out_name, const OV& out,
                     const ops::AttentionCache<T, Exec>& c) {
  const auto e = [](const auto& v, int d) { return static_cast<std::int64_t>(v.extent(d)); };
  require(e(qkv, 0) == c.B && e(qkv, 1) == c.T_ && e(qkv, 2) == 3 * c.C && e(out, 0) == c.B && e(out, 1) == c.T_ &&
              e(out, 2) == c.C,
          op, [&] {
            return str(qkv_name, " is ", shape_str(qkv), " and ", out_name, " is ", shape_str(out),
                       " but the cache was made for B = ", c.B, ", T = ", c.T_, ", C = ", c.C, ", H = ", c.H,
                       "; expected ", qkv_name, " (", c.B, ", ", c.T_, ", ", 3 * c.C, ") and ", out_name, " (", c.B,
                       ", ", c.T_, ", ", c.C, ")");
          });
}

/// Throws unless q, k and v are each (B, T, C) and out-like is (B, T, C) for the cache's B, T, C.
template <class T, class Exec, class QV, class KV, class VV, class OV>
void check_attention_split(const char* op, const char* prefix, const QV& q, const KV& k, const VV& v,
                           const char* out_name, const OV& out, const ops::AttentionCache<T, Exec>& c) {
  const auto fits = [&](const auto& x) {
    return static_cast<std::int64_t>(x.extent(0)) == c.B && static_cast<std::int64_t>(x.extent(1)) == c.T_ &&
           static_cast<std::int64_t>(x.extent(2)) == c.C;
  };
  require(fits(q) && fits(k) && fits(v) && fits(out), op, [&] {
    return str(prefix, "q is ", shape_str(q), ", ", prefix, "k ", shape_str(k), ", ", prefix, "v ", shape_str(v),
               " and ", out_name, " ", shape_str(out), " but the cache was made for B = ", c.B, ", T = ", c.T_,
               ", C = ", c.C, ", H = ", c.H, "; expected each (", c.B, ", ", c.T_, ", ", c.C, ")");
  });
}

/// q, k, v rows (b, t) at src + (b T + t) ld (+ h hs for head h) -> the cache's (B, H, T, hs).
template <class Exec, class T, class S>
void attention_split_heads(const Exec& exec, const ops::AttentionCache<T, Exec>& c, const S* qp, const S* kp,
                           const S* vp, std::int64_t ld) {
  const std::int64_t Tn = c.T_, H = c.H, hs = c.C / c.H;
  auto q = c.q, k = c.k, v = c.v;
  Kokkos::parallel_for(
      "pmt::ops::attention_forward::split_heads", Kokkos::RangePolicy<Exec>(exec, 0, c.B * H * Tn),
      KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t t = i % Tn, h = i / Tn % H, b = i / (Tn * H);
        const std::int64_t at = (b * Tn + t) * ld + h * hs;
        for (std::int64_t d = 0; d < hs; ++d) {
          q(b, h, t, d) = qp[at + d];
          k(b, h, t, d) = kp[at + d];
          v(b, h, t, d) = vp[at + d];
        }
      });
}

/// att = softmax_causal(q k^T / sqrt(hs)), y = att v, out (B, T, C) = y with the heads merged.
template <class Exec, class OV, class T>
void attention_forward_core(const Exec& exec, const OV& out, ops::AttentionCache<T, Exec>& c) {
  using ops::Trans;
  const std::int64_t Tn = c.T_, H = c.H, hs = c.C / c.H;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hs)));
  auto att      = as_batched(c.att);
  ops::matmul_batched(exec, Trans::N, Trans::T, scale, as_batched(c.q), as_batched(c.k), T(0), att);
  ops::softmax(exec, att, att, ops::Mask::Causal);  // (BH, T, T)
  ops::matmul_batched(exec, Trans::N, Trans::N, T(1), att, as_batched(c.v), T(0), as_batched(c.y));
  auto y = c.y;
  Kokkos::parallel_for(
      "pmt::ops::attention_forward::merge_heads", Kokkos::RangePolicy<Exec>(exec, 0, c.B * H * Tn),
      KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t t = i % Tn, h = i / Tn % H, b = i / (Tn * H);
        auto* dst = &out(b, t, h * hs);
        for (std::int64_t d = 0; d < hs; ++d) dst[d] = y(b, h, t, d);
      });
}

/// From dout (B, T, C) and the cache: dq, dk, dv rows written at dst + (b T + t) ld (+ h hs),
/// every element of them overwritten.
template <class Exec, class DOV, class T>
void attention_backward_core(const Exec& exec, const DOV& dout, ops::AttentionCache<T, Exec>& c, T* dqp, T* dkp, T* dvp,
                             std::int64_t ld) {
  using ops::Trans;
  const std::int64_t B = c.B, Tn = c.T_, H = c.H, hs = c.C / c.H;
  auto dy = c.y;  // reuse: the head-split gradient of y, (B, H, T, hs)
  Kokkos::parallel_for(
      "pmt::ops::attention_backward::split_heads", Kokkos::RangePolicy<Exec>(exec, 0, B * H * Tn),
      KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t t = i % Tn, h = i / Tn % H, b = i / (Tn * H);
        const auto* src = &dout(b, t, h * hs);
        for (std::int64_t d = 0; d < hs; ++d) dy(b, h, t, d) = src[d];
      });
  // backward's work buffers, freed on return
  auto dq    = attention_buffer<T, Exec>("pmt::ops::attention::dq", B, H, Tn, hs);
  auto dk    = attention_buffer<T, Exec>("pmt::ops::attention::dk", B, H, Tn, hs);
  auto dv    = attention_buffer<T, Exec>("pmt::ops::attention::dv", B, H, Tn, hs);
  auto datt4 = attention_buffer<T, Exec>("pmt::ops::attention::datt", B, H, Tn, Tn);
  auto att = as_batched(c.att), datt = as_batched(datt4);
  ops::matmul_batched(exec, Trans::N, Trans::T, T(1), as_batched(dy), as_batched(c.v), T(0), datt);
  ops::matmul_batched(exec, Trans::T, Trans::N, T(1), att, as_batched(dy), T(0), as_batched(dv));
  ops::softmax_backward(exec, att, datt, datt, ops::Mask::Causal);  // d(scores)
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hs)));
  ops::matmul_batched(exec, Trans::N, Trans::N, scale, datt, as_batched(c.k), T(0), as_batched(dq));
  ops::matmul_batched(exec, Trans::T, Trans::N, scale, datt, as_batched(c.q), T(0), as_batched(dk));
  Kokkos::parallel_for(
      "pmt::ops::attention_backward::merge_heads", Kokkos::RangePolicy<Exec>(exec, 0, B * H * Tn),
      KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t t = i % Tn, h = i / Tn % H, b = i / (Tn * H);
        const std::int64_t at = (b * Tn + t) * ld + h * hs;
        for (std::int64_t d = 0; d < hs; ++d) {
          dqp[at + d] = dq(b, h, t, d);
          dkp[at + d] = dk(b, h, t, d);
          dvp[at + d] = dv(b, h, t, d);
        }
      });
}

/// Rows per panel of the fused host attention's causal products.
inline constexpr std::int64_t attention_panel = 32;

/// Whether attention on Exec in T can take the fused host path (CBLAS on host memory).
template <class Exec, class T>
inline constexpr bool attention_fused_v = ops::has_vendor_matmul_v<Exec, T>&& is_host_space_v<Exec>;

#if PMT_ENABLE_CBLAS
/// The fused host forward: per head (b, h), q, k, v rows (b, t) at src + (b T + t) ld + h hs
/// are copied into the cache, then per row panel [r0, r1): att[r0, r1)[0, r1) = scale q k^T, the
/// causal softmax of each row (zeros past the diagonal, to the end of the row), and
/// out[b, r0..r1, h hs..] = att[r0, r1)[0, r1) v[0, r1), written in place.
template <class Exec, class OV, class T, class S>
void attention_forward_fused(const Exec& exec, const OV& out, ops::AttentionCache<T, Exec>& c, const S* qp, const S* kp,
                             const S* vp, std::int64_t ld) {
  const std::int64_t Tn = c.T_, H = c.H, hs = c.C / c.H, P = attention_panel;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hs)));
  auto q = c.q, k = c.k, v = c.v, att = c.att;
  T* const op            = out.data();
  const std::int64_t sbo = static_cast<std::int64_t>(out.stride(0)), ldo = static_cast<std::int64_t>(out.stride(1));
  Kokkos::parallel_for(
      "pmt::ops::attention_forward", Kokkos::RangePolicy<Exec>(exec, 0, c.B * H), [=](std::int64_t bh) {
        const std::int64_t b = bh / H, h = bh % H;
        T* const Q = &q(b, h, 0, 0);
        T* const K = &k(b, h, 0, 0);
        T* const V = &v(b, h, 0, 0);
        T* const A = &att(b, h, 0, 0);
        for (std::int64_t t = 0; t < Tn; ++t) {
          const std::int64_t at = (b * Tn + t) * ld + h * hs;
          if constexpr (std::is_same_v<std::remove_const_t<S>, T>) {  // vectorised row copies
            std::memcpy(Q + t * hs, qp + at, static_cast<std::size_t>(hs) * sizeof(T));
            std::memcpy(K + t * hs, kp + at, static_cast<std::size_t>(hs) * sizeof(T));
            std::memcpy(V + t * hs, vp + at, static_cast<std::size_t>(hs) * sizeof(T));
          } else {
            for (std::int64_t d = 0; d < hs; ++d) {
              Q[t * hs + d] = static_cast<T>(qp[at + d]);
              K[t * hs + d] = static_cast<T>(kp[at + d]);
              V[t * hs + d] = static_cast<T>(vp[at + d]);
            }
          }
        }
        for (std::int64_t r0 = 0; r0 < Tn; r0 += P) {
          const std::int64_t r1 = r0 + P < Tn ? r0 + P : Tn;
          matmul_cblas<T>(1, false, true, r1 - r0, r1, hs, scale, Q + r0 * hs, hs, 0, K, hs, 0, T(0), A + r0 * Tn, Tn,
                          0);
          for (std::int64_t t = r0; t < r1; ++t)
            softmax_row(A + t * Tn, A + t * Tn, t + 1, Tn, static_cast<const T*>(nullptr), static_cast<T*>(nullptr));
          matmul_cblas<T>(1, false, false, r1 - r0, hs, r1, T(1), A + r0 * Tn, Tn, 0, V, hs, 0, T(0),
                          op + b * sbo + r0 * ldo + h * hs, ldo, 0);
        }
      });
}

/// The fused host backward, per head: row panels give d(att) = dy v^T, the softmax backward
/// (zeros past the diagonal to the panel's end) and dq = scale d(scores) k; then column panels
/// [c0, c1) give dv = att[c0, T)[c0, c1)^T dy[c0, T) and dk = scale d(scores)[c0, T)[c0, c1)^T
/// q[c0, T): the rows above c0 hold only zeros there. dq, dk, dv rows (b, t) at
/// dst + (b T + t) ld + h hs, every element of them overwritten.
template <class Exec, class DOV, class T>
void attention_backward_fused(const Exec& exec, const DOV& dout, ops::AttentionCache<T, Exec>& c, T* dqp, T* dkp,
                              T* dvp, std::int64_t ld) {
  const std::int64_t B = c.B, Tn = c.T_, H = c.H, hs = c.C / c.H, P = attention_panel;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hs)));
  auto q = c.q, k = c.k, v = c.v, att = c.att;
  auto datt              = attention_buffer<T, Exec>("pmt::ops::attention::datt", B, H, Tn, Tn);  // freed on return
  const T* const dop     = dout.data();
  const std::int64_t sbo = static_cast<std::int64_t>(dout.stride(0)), ldo = static_cast<std::int64_t>(dout.stride(1));
  Kokkos::parallel_for("pmt::ops::attention_backward", Kokkos::RangePolicy<Exec>(exec, 0, B * H), [=](std::int64_t bh) {
    const std::int64_t b = bh / H, h = bh % H;
    const T* const Q      = &q(b, h, 0, 0);
    const T* const K      = &k(b, h, 0, 0);
    const T* const V      = &v(b, h, 0, 0);
    const T* const A      = &att(b, h, 0, 0);
    T* const D            = &datt(b, h, 0, 0);
    const T* const dY     = dop + b * sbo + h * hs;
    const std::int64_t at = b * Tn * ld + h * hs;
    for (std::int64_t r0 = 0; r0 < Tn; r0 += P) {
      const std::int64_t r1 = r0 + P < Tn ? r0 + P : Tn;
      matmul_cblas<T>(1, false, true, r1 - r0, r1, hs, T(1), dY + r0 * ldo, ldo, 0, V, hs, 0, T(0), D + r0 * Tn, Tn, 0);
      for (std::int64_t t = r0; t < r1; ++t) softmax_backward_row(A + t * Tn, D + t * Tn, D + t * Tn, t + 1, r1);
      matmul_cblas<T>(1, false, false, r1 - r0, hs, r1, scale, D + r0 * Tn, Tn, 0, K, hs, 0, T(0), dqp + at + r0 * ld,
                      ld, 0);
    }
    for (std::int64_t c0 = 0; c0 < Tn; c0 += P) {
      const std::int64_t c1 = c0 + P < Tn ? c0 + P : Tn;
      matmul_cblas<T>(1, true, false, c1 - c0, hs, Tn - c0, T(1), A + c0 * Tn + c0, Tn, 0, dY + c0 * ldo, ldo, 0, T(0),
                      dvp + at + c0 * ld, ld, 0);
      matmul_cblas<T>(1, true, false, c1 - c0, hs, Tn - c0, scale, D + c0 * Tn + c0, Tn, 0, Q + c0 * hs, hs, 0, T(0),
                      dkp + at + c0 * ld, ld, 0);
    }
  });
}
#endif  // PMT_ENABLE_CBLAS

/// Test hook: while true, attention takes the generic path on every space, so that tests can
/// compare the two implementations on the same inputs.
inline bool& attention_force_generic() {
  static bool force = false;
  return force;
}

/// Test hook: how many forwards and backwards took the fused host path in this process (the two
/// paths can agree bit for bit, so tests count which one ran).
inline std::int64_t& attention_fused_calls() {
  static std::int64_t n = 0;
  return n;
}

/// Whether this call can take the fused host path: a CBLAS host space with at least as many
/// heads as threads (each head is one task), unless `generic` forces the batched path (tests).
template <class Exec, class T>
bool attention_can_fuse(const Exec& exec, const ops::AttentionCache<T, Exec>& c, bool generic) {
  if constexpr (attention_fused_v<Exec, T>)
    return !generic && c.B * c.H >= static_cast<std::int64_t>(exec.concurrency()) && c.T_ > 0;
  (void)exec, (void)c, (void)generic;
  return false;
}

/// The measured-choice key of an attention call: the scalar and ceil log2 of B*H, T and hs.
template <class T>
ChoiceKey attention_choice_key(std::int64_t BH, std::int64_t Tn, std::int64_t hs) {
  return ChoiceKey{ops::attention_choice_op, std::int64_t(sizeof(T)) | 1024,
                   extent_class(BH) | extent_class(Tn) << 8 | extent_class(hs) << 16};
}

/// Whether a call that can fuse takes the fused path: by the matmul path setting, or (auto) by
/// the shape class's measured choice; `measure(path)` runs one forward on that path, and is
/// called only on a forward's first call of its class (a backward takes the forward's choice).
template <class T, class Measure>
bool attention_fused_chosen(std::int64_t BH, std::int64_t Tn, std::int64_t hs, Measure&& measure) {
  const ops::MatmulPath pin = ops::matmul_path();
  if (pin != ops::MatmulPath::Auto) return pin == ops::MatmulPath::Vendor;
  const ChoiceKey key = attention_choice_key<T>(BH, Tn, hs);
  const int now       = current_choice(key);
  if (now >= 0) return now == 0;
  if constexpr (std::is_same_v<Measure, std::nullptr_t>) {
    return true;  // a backward without a measured forward: the default path
  } else {
    measure(1);  // once, outside the timing: the batched path's products measure their own classes
    const auto shape   = [&] { return str(BH, " heads x T ", Tn, " x hs ", hs, sizeof(T) == 4 ? " fp32" : " fp64"); };
    const double flops = 2.0 * double(BH) * double(Tn) * double(Tn) * double(hs);  // the causal halves
    return measured_choice(key, shape, flops, measure) == 0;
  }
}

/// Forward from q, k, v rows at src + (b T + t) ld (+ h hs): fused or generic.
template <class Exec, class OV, class T, class S>
void attention_forward_any(const Exec& exec, const OV& out, ops::AttentionCache<T, Exec>& c, const S* qp, const S* kp,
                           const S* vp, std::int64_t ld, bool generic) {
#if PMT_ENABLE_CBLAS
  if constexpr (attention_fused_v<Exec, T>) {
    if (attention_can_fuse(exec, c, generic)) {
      Kokkos::View<T***, Kokkos::LayoutRight, typename Exec::memory_space> scratch;  // measurement only
      const auto measure = [&](int path) {  // one forward into scratch; the cache gets the same values
        if (scratch.data() == nullptr)
          scratch =
              decltype(scratch)("pmt::ops::attention::measure", std::size_t(c.B), std::size_t(c.T_), std::size_t(c.C));
        exec.fence();
        if (path == 0) {
          attention_forward_fused(exec, scratch, c, qp, kp, vp, ld);
        } else {
          attention_split_heads(exec, c, qp, kp, vp, ld);
          attention_forward_core(exec, scratch, c);
        }
        exec.fence();
      };
      if (attention_fused_chosen<T>(c.B * c.H, c.T_, c.C / c.H, measure)) {
        ++attention_fused_calls();
        return attention_forward_fused(exec, out, c, qp, kp, vp, ld);
      }
    }
  }
#endif
  (void)generic;
  attention_split_heads(exec, c, qp, kp, vp, ld);
  attention_forward_core(exec, out, c);
}

/// Backward into dq, dk, dv rows at dst + (b T + t) ld (+ h hs): fused or generic.
template <class Exec, class DOV, class T>
void attention_backward_any(const Exec& exec, const DOV& dout, ops::AttentionCache<T, Exec>& c, T* dqp, T* dkp, T* dvp,
                            std::int64_t ld, bool generic) {
#if PMT_ENABLE_CBLAS
  if constexpr (attention_fused_v<Exec, T>) {
    if (attention_can_fuse(exec, c, generic) && attention_fused_chosen<T>(c.B * c.H, c.T_, c.C / c.H, nullptr)) {
      ++attention_fused_calls();
      return attention_backward_fused(exec, dout, c, dqp, dkp, dvp, ld);
    }
  }
#endif
  (void)generic;
  attention_backward_core(exec, dout, c, dqp, dkp, dvp, ld);
}

}  // namespace pmt::detail

namespace pmt::ops {

// ---------------------------------------------------------------------------------------------

/// \brief Causal self-attention forward: out (B, T, C) from qkv (B, T, 3C) = [q | k | v], H heads.
/// Keeps q, k, v and the attention matrix in `cache` for backward.
/// \throws pmt::ShapeError when qkv, out and the cache disagree.
template <class Exec, class QKV, class OV, class T>
void attention_forward(const Exec& exec, const QKV& qkv, const OV& out, AttentionCache<T, Exec>& c) {
  static_check_view<Exec, QKV>();
  static_check_view<Exec, OV>();
  static_assert(QKV::rank == 3 && OV::rank == 3, "pmt::ops::attention_forward: qkv (B, T, 3C), out (B, T, C)");
  detail::check_attention("pmt::ops::attention_forward", "qkv", qkv, "out", out, c);
  const auto* p = qkv.data();
  detail::attention_forward_any(exec, out, c, p, p + c.C, p + 2 * c.C, 3 * c.C, detail::attention_force_generic());
}

/// \brief The same from separate q, k, v (B, T, C) (the projections' outputs, not packed first).
/// \throws pmt::ShapeError when q, k, v, out and the cache disagree.
template <class Exec, class QV, class KV, class VV, class OV, class T>
void attention_forward(const Exec& exec, const QV& q, const KV& k, const VV& v, const OV& out,
                       AttentionCache<T, Exec>& c) {
  static_check_view<Exec, QV>();
  static_check_view<Exec, KV>();
  static_check_view<Exec, VV>();
  static_check_view<Exec, OV>();
  static_assert(QV::rank == 3 && KV::rank == 3 && VV::rank == 3 && OV::rank == 3,
                "pmt::ops::attention_forward: q, k, v and out (B, T, C)");
  detail::check_attention_split("pmt::ops::attention_forward", "", q, k, v, "out", out, c);
  detail::attention_forward_any(exec, out, c, q.data(), k.data(), v.data(), c.C, detail::attention_force_generic());
}

/// \brief Causal self-attention backward: dqkv (B, T, 3C) (overwritten) from dout (B, T, C) and the
/// cache filled by attention_forward.
/// \throws pmt::ShapeError when dout, dqkv and the cache disagree.
template <class Exec, class DOV, class DQKV, class T>
void attention_backward(const Exec& exec, const DOV& dout, const DQKV& dqkv, AttentionCache<T, Exec>& c) {
  static_check_view<Exec, DOV>();
  static_check_view<Exec, DQKV>();
  detail::check_attention("pmt::ops::attention_backward", "dqkv", dqkv, "dout", dout, c);
  auto* p = dqkv.data();
  detail::attention_backward_any(exec, dout, c, p, p + c.C, p + 2 * c.C, 3 * c.C, detail::attention_force_generic());
}

/// \brief The same into separate dq, dk, dv (B, T, C) (each overwritten).
/// \throws pmt::ShapeError when dout, dq, dk, dv and the cache disagree.
template <class Exec, class DOV, class DQV, class DKV, class DVV, class T>
void attention_backward(const Exec& exec, const DOV& dout, const DQV& dq, const DKV& dk, const DVV& dv,
                        AttentionCache<T, Exec>& c) {
  static_check_view<Exec, DOV>();
  static_check_view<Exec, DQV>();
  static_check_view<Exec, DKV>();
  static_check_view<Exec, DVV>();
  detail::check_attention_split("pmt::ops::attention_backward", "d", dq, dk, dv, "dout", dout, c);
  detail::attention_backward_any(exec, dout, c, dq.data(), dk.data(), dv.data(), c.C,
                                 detail::attention_force_generic());
}

}  // namespace pmt::ops
