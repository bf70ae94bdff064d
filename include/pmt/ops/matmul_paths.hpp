// SPDX-License-Identifier: Apache-2.0
#pragma once
// The paths of matmul (ops/matmul.hpp) for the process: the backend tags (MatmulAuto,
// MatmulVendor, MatmulPortable), pinning a path (set_matmul_path, PMT_MATMUL) and a bf16 kernel
// (set_bf16_kernel, PMT_BF16_MATMUL), the measured-choice op ids and keys of the products, and
// the summary lines of the paths taken.

#include "pmt/config.hpp"
#include "pmt/core/bf16.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/measured_choice.hpp"
#include "pmt/core/precision.hpp"
#include "pmt/core/step_context.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/core/workspace.hpp"
#include "pmt/ops/detail/host_bf16.hpp"
#include "pmt/ops/detail/matmul_cblas.hpp"
#include "pmt/ops/detail/matmul_cublas.hpp"
#include "pmt/ops/detail/matmul_kokkos.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <type_traits>

namespace pmt::ops {

/// \brief Whether an operand is used as is (N) or transposed (T).
enum class Trans { N, T };

/// \brief Backend tags for matmul: Auto (default), Vendor (CBLAS / cuBLAS), Portable (Kokkos).
struct MatmulAuto {};
struct MatmulVendor {};
struct MatmulPortable {};

/// \brief True when a vendor BLAS serves matmul of T on Exec in this build.
template <class Exec, class T>
inline constexpr bool has_vendor_matmul_v = (std::is_same_v<T, float> ||
                                             std::is_same_v<T, double>)&&((PMT_ENABLE_CBLAS && is_host_space_v<Exec>)
#if PMT_ENABLE_CUDA && defined(KOKKOS_ENABLE_CUDA)
                                                                          || std::is_same_v<Exec, Kokkos::Cuda>
#endif
);

/// \brief What MatmulAuto does for the whole process: measure (Auto) or take one path.
enum class MatmulPath { Auto, Vendor, Portable };

/// \brief The name of a path as PMT_MATMUL and train_gpt's --matmul spell it.
inline const char* matmul_path_name(MatmulPath p) {
  return p == MatmulPath::Vendor ? "vendor" : (p == MatmulPath::Portable ? "portable" : "auto");
}

/// \brief Parses "vendor", "portable" or "auto". \throws pmt::ConfigError naming `what` and the
/// value for anything else.
inline MatmulPath parse_matmul_path(const std::string& v, const char* what = "PMT_MATMUL") {
  if (v == "vendor") return MatmulPath::Vendor;
  if (v == "portable") return MatmulPath::Portable;
  if (v == "auto") return MatmulPath::Auto;
  throw ConfigError("pmt::ops::matmul", detail::str(what, " is '", v, "'; expected vendor, portable or auto"));
}

namespace detail_matmul {
struct PathSetting {
  std::mutex mu;
  bool read       = false;
  MatmulPath path = MatmulPath::Auto;
};
inline PathSetting& path_setting() {
  static PathSetting s;
  return s;
}
}  // namespace detail_matmul

/// \brief The process' matmul path for MatmulAuto calls: set_matmul_path's, else PMT_MATMUL's
/// (read once), else Auto. \throws pmt::ConfigError when PMT_MATMUL holds another word.
inline MatmulPath matmul_path() {
  auto& s = detail_matmul::path_setting();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.read) {
    const char* env = std::getenv("PMT_MATMUL");
    s.path          = env && *env ? parse_matmul_path(env) : MatmulPath::Auto;
    s.read          = true;
  }
  return s.path;
}

/// \brief Pins (Vendor, Portable) or unpins (Auto) the path of MatmulAuto calls for the process;
/// overrides PMT_MATMUL. Measured choices made so far are kept for when Auto is set again.
inline void set_matmul_path(MatmulPath p) {
  auto& s = detail_matmul::path_setting();
  std::lock_guard<std::mutex> lock(s.mu);
  s.path = p;
  s.read = true;
}

/// \brief The op id of matmul's entries in the measured-choice table (path 0 vendor, 1 portable).
inline constexpr std::int64_t matmul_choice_op = 1;

/// \brief The op id of the host attention's entries (ops/attention.hpp): path 0 fused per head
/// (vendor BLAS per head, in cache), 1 batched (its products under MatmulAuto). The matmul path
/// setting governs it too: vendor pins fused, portable pins batched.
inline constexpr std::int64_t attention_choice_op = 2;

/// \brief The op id of the bf16 products' vendor entries (matmul_bf16 under MatmulAuto on a host
/// whose BLAS has a bf16 GEMM): path 0 pmt's kernel, 1 the BLAS's bf16 GEMM on bf16 copies.
inline constexpr std::int64_t bf16_vendor_choice_op = 4;

/// \brief One line on the matmul paths taken so far, e.g. "matmul auto: portable for 9 shape
/// classes (52-61 % of peak), vendor for 3 shape classes (40-44 % of peak), 0 pending", and the
/// attention's when it measured any ("; attention: batched for 1 shape class, fused for 0 ..."),
/// and the bf16 products' against the BLAS's bf16 GEMM ("; bf16: vendor for 0 shape classes, pmt for 4 ...");
/// with a pin, "matmul pinned: vendor".
inline std::string matmul_path_summary(double peak_gflops = 0) {
  const MatmulPath p = matmul_path();
  if (p != MatmulPath::Auto) return std::string("matmul pinned: ") + matmul_path_name(p);
  std::string line = "matmul auto: " + measured_choice_summary(matmul_choice_op, "vendor", "portable", peak_gflops);
  bool attention = false, bf16 = false;
  for (const auto& entry : measured_choices()) {
    attention = attention || entry.first.op == attention_choice_op;
    bf16      = bf16 || entry.first.op == bf16_vendor_choice_op;
  }
  if (attention)
    line += "; attention: " + measured_choice_summary(attention_choice_op, "fused", "batched", peak_gflops);
  if (bf16) line += "; bf16: " + measured_choice_summary(bf16_vendor_choice_op, "pmt", "vendor", peak_gflops);
  return line;
}

/// \brief The paths MatmulAuto calls take now, for a progress line: the pinned one, else
/// "vendor", "portable" or "vendor+portable" over the decided shape classes (a pending class runs
/// the vendor path), "auto" before any call.
inline std::string matmul_path_label() {
  const MatmulPath p = matmul_path();
  if (p != MatmulPath::Auto) return matmul_path_name(p);
  bool used[2] = {false, false};
  for (const auto& [k, c] : measured_choices())
    if (k.op == matmul_choice_op) used[c.decided() ? c.path : 0] = true;
  return used[0] && used[1] ? "vendor+portable" : (used[1] ? "portable" : (used[0] ? "vendor" : "auto"));
}

/// \brief The kernels of matmul_bf16's MatmulAuto path: AMX tiles, AVX512-BF16 dot products,
/// cuBLAS's bf16 GEMM (on Kokkos::Cuda), the host BLAS's bf16 GEMM (vendor), or the rounded path
/// (operands rounded into fp32 copies, then the fp32 product).
enum class Bf16Kernel { automatic, amx, avx512bf16, rounded, cublas, vendor };

/// \brief "auto", "amx", "avx512bf16", "rounded", "cublas" or "vendor".
inline const char* bf16_kernel_name(Bf16Kernel k) {
  return k == Bf16Kernel::amx          ? "amx"
         : k == Bf16Kernel::avx512bf16 ? "avx512bf16"
         : k == Bf16Kernel::rounded    ? "rounded"
         : k == Bf16Kernel::cublas     ? "cublas"
         : k == Bf16Kernel::vendor     ? "vendor"
                                       : "auto";
}

namespace detail_matmul {
struct Bf16Setting {
  std::mutex mu;
  bool read         = false;
  Bf16Kernel kernel = Bf16Kernel::automatic;
};
inline Bf16Setting& bf16_setting() {
  static Bf16Setting s;
  return s;
}
}  // namespace detail_matmul

/// \brief Pins the kernel of matmul_bf16's MatmulAuto path for the process (automatic: the best
/// this CPU has); overrides PMT_BF16_MATMUL=auto|amx|avx512bf16|rounded|vendor. A kernel the CPU
/// lacks falls back to the next: amx -> avx512bf16 -> rounded; vendor (the host BLAS's bf16 GEMM)
/// where the BLAS has none to pmt's best kernel.
inline void set_bf16_kernel(Bf16Kernel k) {
  auto& s = detail_matmul::bf16_setting();
  std::lock_guard<std::mutex> lock(s.mu);
  s.kernel = k, s.read = true;
}

/// \brief The pinned kernel (set_bf16_kernel, else PMT_BF16_MATMUL, read once), automatic when
/// none is. \throws pmt::ConfigError when PMT_BF16_MATMUL holds another word.
inline Bf16Kernel bf16_kernel_setting() {
  auto& s = detail_matmul::bf16_setting();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.read) {
    const char* env     = std::getenv("PMT_BF16_MATMUL");
    const std::string v = env ? env : "auto";
    s.kernel            = v == "amx"          ? Bf16Kernel::amx
                          : v == "avx512bf16" ? Bf16Kernel::avx512bf16
                          : v == "rounded"    ? Bf16Kernel::rounded
                          : v == "vendor"     ? Bf16Kernel::vendor
                          : v == "auto" || v.empty()
                              ? Bf16Kernel::automatic
                              : throw ConfigError("pmt::ops::matmul_bf16",
                                                  detail::str("PMT_BF16_MATMUL is '", v,
                                                              "'; expected auto, amx, avx512bf16, rounded or vendor"));
    s.read              = true;
  }
  return s.kernel;
}

/// \brief The op id of matmul_bf16's entries in the measured-choice table: on a CPU whose best
/// kernel is AVX512-BF16, path 0 the rounded path, 1 the AVX512-BF16 kernel (whose dot products
/// are not faster than fp32 FMAs on every such CPU), timed per shape class as matmul's paths.
inline constexpr std::int64_t bf16_choice_op = 3;

/// \brief The kernel matmul_bf16 with MatmulAuto runs on Exec: the pinned one (set_bf16_kernel,
/// else PMT_BF16_MATMUL, read once) where the CPU (or the BLAS, for vendor) has it, else the best
/// it has; on Kokkos::Cuda cuBLAS's bf16 GEMM unless rounded is pinned; rounded on other devices.
/// Unpinned, a host's bf16 products may still take the BLAS's bf16 GEMM by measurement.
/// \throws pmt::ConfigError when PMT_BF16_MATMUL holds another word.
template <class Exec>
Bf16Kernel bf16_kernel() {
  const Bf16Kernel want = bf16_kernel_setting();
#if PMT_ENABLE_CBLAS
  if constexpr (is_host_space_v<Exec>)
    if (want == Bf16Kernel::vendor && detail::cblas_bf16_gemm().fn != nullptr) return Bf16Kernel::vendor;
#endif
#if PMT_HOST_AMX
  if constexpr (is_host_space_v<Exec>) {
    const bool any = want == Bf16Kernel::automatic || want == Bf16Kernel::vendor;
    if ((any || want == Bf16Kernel::amx) && detail::hostbf16::amx_available()) return Bf16Kernel::amx;
    if ((any || want == Bf16Kernel::amx || want == Bf16Kernel::avx512bf16) && detail::hostbf16::avx512_available())
      return Bf16Kernel::avx512bf16;
  }
#endif
#if PMT_ENABLE_CUDA && defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same_v<Exec, Kokkos::Cuda>)
    if (want != Bf16Kernel::rounded) return Bf16Kernel::cublas;
#endif
  (void)want;
  return Bf16Kernel::rounded;
}

/// \brief What matmul_bf16 with MatmulAuto runs on Exec in this process (bf16_kernel): "amx-bf16"
/// (AMX tiles), "avx512-bf16" (AVX512-BF16 dot products), "cublas-bf16" (cublasGemmEx on bf16
/// copies), "vendor-bf16" (the host BLAS's bf16 GEMM on bf16 copies) or "rounded-fp32" (rounded
/// operand copies, then the fp32 product).
template <class Exec>
const char* bf16_matmul_isa() {
  const Bf16Kernel k = bf16_kernel<Exec>();
  return k == Bf16Kernel::amx          ? "amx-bf16"
         : k == Bf16Kernel::avx512bf16 ? "avx512-bf16"
         : k == Bf16Kernel::cublas     ? "cublas-bf16"
         : k == Bf16Kernel::vendor     ? "vendor-bf16"
                                       : "rounded-fp32";
}

}  // namespace pmt::ops

namespace pmt::detail {

/// ceil(log2(x)) for x >= 1 (0 for x <= 1): the shape class of one extent.
inline std::int64_t extent_class(std::int64_t x) {
  std::int64_t c = 0;
  while ((std::int64_t(1) << c) < x && c < 62) ++c;
  return c;
}

}  // namespace pmt::detail

namespace pmt::ops {

/// \brief The measured-choice key of a product C = op(A) op(B) of T on Exec: the scalar, the
/// transposes, host or device, and the shape class ceil(log2) of batch, M, N and K.
template <class Exec, class T>
ChoiceKey matmul_choice_key(std::int64_t batch, Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K) {
  using detail::extent_class;
  return ChoiceKey{matmul_choice_op,
                   std::int64_t(sizeof(T)) | (ta == Trans::T ? 256 : 0) | (tb == Trans::T ? 512 : 0) |
                       (is_host_space_v<Exec> ? 1024 : 0),
                   extent_class(batch) | extent_class(M) << 8 | extent_class(N) << 16 | extent_class(K) << 24};
}

}  // namespace pmt::ops
