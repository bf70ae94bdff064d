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

#include "pmt/core/error.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/ops/matmul.hpp"
#include "pmt/ops/softmax.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <string>

namespace pmt::detail {

/// A (B, H, rows, cols) attention buffer, not zero-filled: each is written in full before it is
/// read (the head split, or a product with beta 0).
template <class T, class Exec>
Tensor<T, 4, Exec> attention_buffer(const char* label, std::int64_t B, std::int64_t H, std::int64_t rows,
                                    std::int64_t cols) {
  return Tensor<T, 4, Exec>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)),
                            static_cast<std::size_t>(B), static_cast<std::size_t>(H),
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
AttentionCache<T, Exec> make_attention_cache(std::int64_t B, std::int64_t T_, std::int64_t C,
                                             std::int64_t H) {
  detail::require(H > 0 && C % H == 0, "pmt::ops::make_attention_cache", [&] {
    return detail::str("width C = ", C, " is not divisible by heads H = ", H);
  });
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
  return Kokkos::View<T***, Kokkos::LayoutRight, typename V::memory_space,
                      Kokkos::MemoryTraits<Kokkos::Unmanaged>>(v.data(), v.extent(0) * v.extent(1),
                                                               v.extent(2), v.extent(3));
}

/// Throws unless qkv-like is (B, T, 3C) and out-like is (B, T, C) for the cache's B, T, C; the
/// names say which tensors they are ("qkv"/"out" forward, "dqkv"/"dout" backward).
template <class T, class Exec, class QV, class OV>
void check_attention(const char* op, const char* qkv_name, const QV& qkv, const char* out_name,
                     const OV& out, const ops::AttentionCache<T, Exec>& c) {
  const auto e = [](const auto& v, int d) { return static_cast<std::int64_t>(v.extent(d)); };
  require(e(qkv, 0) == c.B && e(qkv, 1) == c.T_ && e(qkv, 2) == 3 * c.C && e(out, 0) == c.B &&
              e(out, 1) == c.T_ && e(out, 2) == c.C,
          op, [&] {
            return str(qkv_name, " is ", shape_str(qkv), " and ", out_name, " is ", shape_str(out),
                       " but the cache was made for B = ", c.B, ", T = ", c.T_, ", C = ", c.C,
                       ", H = ", c.H, "; expected ", qkv_name, " (", c.B, ", ", c.T_, ", ", 3 * c.C,
                       ") and ", out_name, " (", c.B, ", ", c.T_, ", ", c.C, ")");
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
  Kokkos::parallel_for("pmt::ops::attention_forward::split_heads",
                       Kokkos::RangePolicy<Exec>(exec, 0, c.B * H * Tn), KOKKOS_LAMBDA(std::int64_t i) {
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
  auto att = as_batched(c.att);
  ops::matmul_batched(exec, Trans::N, Trans::T, scale, as_batched(c.q), as_batched(c.k), T(0), att);
  ops::softmax(exec, att, att, ops::Mask::Causal);  // (BH, T, T)
  ops::matmul_batched(exec, Trans::N, Trans::N, T(1), att, as_batched(c.v), T(0), as_batched(c.y));
  auto y = c.y;
  Kokkos::parallel_for("pmt::ops::attention_forward::merge_heads",
                       Kokkos::RangePolicy<Exec>(exec, 0, c.B * H * Tn), KOKKOS_LAMBDA(std::int64_t i) {
                         const std::int64_t t = i % Tn, h = i / Tn % H, b = i / (Tn * H);
                         auto* dst = &out(b, t, h * hs);
                         for (std::int64_t d = 0; d < hs; ++d) dst[d] = y(b, h, t, d);
                       });
}

/// From dout (B, T, C) and the cache: dq, dk, dv rows written at dst + (b T + t) ld (+ h hs),
/// every element of them overwritten.
template <class Exec, class DOV, class T>
void attention_backward_core(const Exec& exec, const DOV& dout, ops::AttentionCache<T, Exec>& c, T* dqp, T* dkp,
                             T* dvp, std::int64_t ld) {
  using ops::Trans;
  const std::int64_t B = c.B, Tn = c.T_, H = c.H, hs = c.C / c.H;
  auto dy = c.y;  // reuse: the head-split gradient of y, (B, H, T, hs)
  Kokkos::parallel_for("pmt::ops::attention_backward::split_heads",
                       Kokkos::RangePolicy<Exec>(exec, 0, B * H * Tn), KOKKOS_LAMBDA(std::int64_t i) {
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
  Kokkos::parallel_for("pmt::ops::attention_backward::merge_heads",
                       Kokkos::RangePolicy<Exec>(exec, 0, B * H * Tn), KOKKOS_LAMBDA(std::int64_t i) {
                         const std::int64_t t = i % Tn, h = i / Tn % H, b = i / (Tn * H);
                         const std::int64_t at = (b * Tn + t) * ld + h * hs;
                         for (std::int64_t d = 0; d < hs; ++d) {
                           dqp[at + d] = dq(b, h, t, d);
                           dkp[at + d] = dk(b, h, t, d);
                           dvp[at + d] = dv(b, h, t, d);
                         }
                       });
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
  detail::attention_split_heads(exec, c, p, p + c.C, p + 2 * c.C, 3 * c.C);
  detail::attention_forward_core(exec, out, c);
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
  detail::attention_split_heads(exec, c, q.data(), k.data(), v.data(), c.C);
  detail::attention_forward_core(exec, out, c);
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
  detail::attention_backward_core(exec, dout, c, p, p + c.C, p + 2 * c.C, 3 * c.C);
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
  detail::attention_backward_core(exec, dout, c, dq.data(), dk.data(), dv.data(), c.C);
}

}  // namespace pmt::ops
