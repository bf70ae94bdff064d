// SPDX-License-Identifier: Apache-2.0
#pragma once
// The compute precision of float products: fp32, or bf16 mixed precision (each operand of a
// product rounded to bf16, the sums in fp32). Parameters, gradients, optimizer state and every
// other op stay in the Tensor's type: a PrecisionScope changes how ops::matmul multiplies float
// operands on the calling thread, nothing else (as an autocast region does elsewhere).
//   { pmt::PrecisionScope bf16(pmt::Precision::bf16); model.forward(...); model.backward(...); }
// train::TrainerOptions::precision opens one around each step and evaluation.

#include "pmt/core/error.hpp"

#include <string>

namespace pmt {

/// \brief The precision of float products (see the file comment).
enum class Precision { fp32, bf16 };

/// \brief "fp32" or "bf16".
inline const char* precision_name(Precision p) { return p == Precision::bf16 ? "bf16" : "fp32"; }

/// \brief Parses "fp32" or "bf16". \throws pmt::ConfigError naming `what` and the value otherwise.
inline Precision parse_precision(const std::string& v, const char* what = "precision") {
  if (v == "fp32") return Precision::fp32;
  if (v == "bf16") return Precision::bf16;
  throw ConfigError("pmt::parse_precision", detail::str(what, " is '", v, "'; expected fp32 or bf16"));
}

namespace detail {
inline Precision& thread_precision() {
  thread_local Precision p = Precision::fp32;
  return p;
}
}  // namespace detail

/// \brief The precision of float products on this thread now: the innermost PrecisionScope's, fp32
/// outside any.
inline Precision compute_precision() { return detail::thread_precision(); }

/// \brief Sets the precision of float products on this thread for its lifetime (they nest).
class PrecisionScope {
 public:
  explicit PrecisionScope(Precision p) : m_saved(detail::thread_precision()) { detail::thread_precision() = p; }
  ~PrecisionScope() { detail::thread_precision() = m_saved; }
  PrecisionScope(const PrecisionScope&)            = delete;
  PrecisionScope& operator=(const PrecisionScope&) = delete;

 private:
  Precision m_saved;
};

}  // namespace pmt
