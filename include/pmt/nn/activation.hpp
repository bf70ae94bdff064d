// SPDX-License-Identifier: Apache-2.0
#pragma once
// Elementwise activations as layers: Gelu<T, Exec> (tanh approximation, as GPT-2), Relu, Silu
// (x sigmoid(x)) and Tanh. Each takes a tensor of any placement and keeps it, except a partial
// sum over tp (non-linear: Chain refuses that). Gelu, Relu and Silu keep their input for the
// backward, Tanh its output; under pmt::NoGrad (core/activation_slot.hpp) they keep nothing.
// Communication: none.

#include "pmt/core/activation_slot.hpp"
#include "pmt/core/instrument.hpp"
#include "pmt/core/step_context.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/core/workspace.hpp"
#include "pmt/nn/module.hpp"
#include "pmt/ops/elementwise.hpp"
#include "pmt/policy/placement.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <vector>

namespace pmt::nn {

/// \brief Which function a Pointwise layer applies.
enum class PointwiseKind { Gelu, Relu, Silu, Tanh };

/// \brief y = f(x) elementwise, as a layer (see the file comment); use the aliases Gelu, Relu,
/// Silu and Tanh.
template <class T, class Exec, PointwiseKind Kind>
class Pointwise {
 public:
  using value_type                = T;
  using execution_space           = Exec;
  using input_placement           = AnyPlacement;
  using output_placement          = AnyPlacement;  // = its input's
  static constexpr bool nonlinear = true;

  Tensor<T, 2, Exec> forward(const Exec& exec, const Tensor<T, 2, Exec>& x) {
    const Instrument instrument(region(true));
    auto y = workspace_view<Tensor<T, 2, Exec>>("pmt::nn::Pointwise::y", x.extent(0), x.extent(1));
    if constexpr (Kind == PointwiseKind::Gelu)
      ops::gelu(exec, x, y);
    else if constexpr (Kind == PointwiseKind::Relu)
      ops::relu(exec, x, y);
    else if constexpr (Kind == PointwiseKind::Silu)
      ops::silu(exec, x, y);
    else
      ops::tanh(exec, x, y);
    if (step_context().grad) *m_saved = Kind == PointwiseKind::Tanh ? y : x;
    return y;
  }
  Tensor<T, 2, Exec> backward(const Exec& exec, const Tensor<T, 2, Exec>& dy) {
    const Instrument instrument(region(false));
    const Tensor<T, 2, Exec> s = m_saved.take();
    pmt::detail::require(
        s.data() != nullptr && s.extent(0) == dy.extent(0) && s.extent(1) == dy.extent(1), name(), [&] {
          return pmt::detail::str("backward: dy is ", shape_str(dy), " but the forward saved ", shape_str(s),
                                  "; call forward first, with gradients on (not under pmt::NoGrad)");
        });
    auto dx = workspace_view<Tensor<T, 2, Exec>>("pmt::nn::Pointwise::dx", dy.extent(0), dy.extent(1));
    if constexpr (Kind == PointwiseKind::Gelu)
      ops::gelu_backward(exec, s, dy, dx);
    else if constexpr (Kind == PointwiseKind::Relu)
      ops::relu_backward(exec, s, dy, dx);
    else if constexpr (Kind == PointwiseKind::Silu)
      ops::silu_backward(exec, s, dy, dx);
    else
      ops::tanh_backward(exec, s, dy, dx);
    return dx;
  }
  std::vector<Parameter<T, Exec>*> parameters() { return {}; }
  /// \brief Elementwise: the output is as wide as the input.
  std::size_t output_width(std::size_t in) const noexcept { return in; }
  static const char* region(bool forward) noexcept {
    if constexpr (Kind == PointwiseKind::Gelu)
      return forward ? "pmt::nn::Gelu::forward" : "pmt::nn::Gelu::backward";
    else if constexpr (Kind == PointwiseKind::Relu)
      return forward ? "pmt::nn::Relu::forward" : "pmt::nn::Relu::backward";
    else if constexpr (Kind == PointwiseKind::Silu)
      return forward ? "pmt::nn::Silu::forward" : "pmt::nn::Silu::backward";
    else
      return forward ? "pmt::nn::Tanh::forward" : "pmt::nn::Tanh::backward";
  }
  static const char* name() noexcept {
    if constexpr (Kind == PointwiseKind::Gelu)
      return "pmt::nn::Gelu";
    else if constexpr (Kind == PointwiseKind::Relu)
      return "pmt::nn::Relu";
    else if constexpr (Kind == PointwiseKind::Silu)
      return "pmt::nn::Silu";
    else
      return "pmt::nn::Tanh";
  }

 private:
  Saved<Tensor<T, 2, Exec>> m_saved;  // the input (Tanh: the output), per activation slot
};

/// \brief The pointwise layers: y = f(x) elementwise, any placement in and the same out (see
/// Pointwise); Gelu (tanh approximation), Relu, Silu (x sigmoid(x)) and Tanh.
template <class T, class Exec = Kokkos::DefaultExecutionSpace>
using Gelu = Pointwise<T, Exec, PointwiseKind::Gelu>;
template <class T, class Exec = Kokkos::DefaultExecutionSpace>
using Relu = Pointwise<T, Exec, PointwiseKind::Relu>;
template <class T, class Exec = Kokkos::DefaultExecutionSpace>
using Silu = Pointwise<T, Exec, PointwiseKind::Silu>;
template <class T, class Exec = Kokkos::DefaultExecutionSpace>
using Tanh = Pointwise<T, Exec, PointwiseKind::Tanh>;

}  // namespace pmt::nn
