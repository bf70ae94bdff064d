// SPDX-License-Identifier: Apache-2.0
#pragma once
// The compute precision of float products: fp32, or bf16 mixed precision (each operand of a
// product rounded to bf16, the sums in fp32). Parameters, gradients, optimizer state and every
// other op stay in the Tensor's type: a PrecisionScope changes how ops::matmul multiplies float
// operands on the calling thread, nothing else (as an autocast region does elsewhere). The
// precision is a field of the step context (core/step_context.hpp), where PrecisionScope is.
//   { pmt::PrecisionScope bf16(pmt::Precision::bf16); model.forward(...); model.backward(...); }
// train::TrainerOptions::precision opens one around each step and evaluation.

#include "pmt/core/error.hpp"
#include "pmt/core/step_context.hpp"  // Precision, PrecisionScope, compute_precision()

#include <string>

namespace pmt {

/// \brief "fp32" or "bf16".
inline const char* precision_name(Precision p) { return p == Precision::bf16 ? "bf16" : "fp32"; }

/// \brief Parses "fp32" or "bf16". \throws pmt::ConfigError naming `what` and the value otherwise.
inline Precision parse_precision(const std::string& v, const char* what = "precision") {
  if (v == "fp32") return Precision::fp32;
  if (v == "bf16") return Precision::bf16;
  throw ConfigError("pmt::parse_precision", detail::str(what, " is '", v, "'; expected fp32 or bf16"));
}

}  // namespace pmt
