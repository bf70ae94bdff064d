// SPDX-License-Identifier: Apache-2.0
#pragma once
// LayerNorm<T, Exec>: y = (x - mean) / sqrt(var + eps) * weight + bias over the last dim, on a
// replicated tensor (every tp rank computes the same). weight starts at 1, bias at 0; both are
// replicated over tp. Shapes: x, y (N, C); weight, bias (C). Communication: none.

#include "pmt/core/activation_slot.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/instrument.hpp"
#include "pmt/core/step_context.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/core/workspace.hpp"
#include "pmt/nn/module.hpp"
#include "pmt/ops/layernorm.hpp"
#include "pmt/policy/placement.hpp"

#include <Kokkos_Core.hpp>

#include <string>
#include <vector>

namespace pmt::nn {

/// \brief y = (x - mean) / sqrt(var + eps) * weight + bias over the last dimension C, per row:
/// x (N, C) replicated -> y (N, C) replicated; weight (ones) and bias (zeros) replicated over tp.
/// \throws pmt::ShapeError when dy does not match the saved input.
template <class T, class Exec = Kokkos::DefaultExecutionSpace>
class LayerNorm {
 public:
  using value_type                = T;
  using execution_space           = Exec;
  using input_placement           = Replicated;
  using output_placement          = Replicated;
  static constexpr bool nonlinear = true;

  LayerNorm(const std::string& name, std::size_t C, double eps = 1e-5) : m_eps(eps) {
    GlobalSlice s;
    s.extent[0] = C;
    m_w         = Parameter<T, Exec>(name + "::weight", {C}, s, true);
    m_b         = Parameter<T, Exec>(name + "::bias", {C}, s, true);
    Kokkos::deep_copy(m_w.value, T(1));
  }

  Tensor<T, 2, Exec> forward(const Exec& exec, const Tensor<T, 2, Exec>& x) {
    const Instrument instrument("pmt::nn::LayerNorm::forward");
    Cache scratch;  // pmt::NoGrad: the statistics live for this call only
    auto& c = step_context().grad ? *m_saved : scratch;
    if (step_context().grad) c.x = x;
    if (c.mean.extent(0) != x.extent(0)) {
      c.mean = workspace_view<Tensor<T, 1, Exec>>("pmt::nn::LayerNorm::mean", x.extent(0));  // written by the forward
      c.rstd = workspace_view<Tensor<T, 1, Exec>>("pmt::nn::LayerNorm::rstd", x.extent(0));
    }
    auto y = workspace_view<Tensor<T, 2, Exec>>("pmt::nn::LayerNorm::y", x.extent(0), x.extent(1));
    ops::layernorm_forward(exec, x, m_w.value, m_b.value, y, c.mean, c.rstd, m_eps);
    return y;
  }
  Tensor<T, 2, Exec> backward(const Exec& exec, const Tensor<T, 2, Exec>& dy) {
    auto dx = workspace_view<Tensor<T, 2, Exec>>("pmt::nn::LayerNorm::dx", dy.extent(0), dy.extent(1));
    const Instrument instrument("pmt::nn::LayerNorm::backward");
    const auto c = m_saved.take();
    pmt::detail::require(c.x.data() != nullptr && c.x.extent(0) == dy.extent(0) && c.x.extent(1) == dy.extent(1),
                         "pmt::nn::LayerNorm::backward", [&] {
                           return pmt::detail::str("dy is ", shape_str(dy), " but the saved input is ", shape_str(c.x),
                                                   "; call forward first (each backward consumes its forward's input)");
                         });
    ops::layernorm_backward(exec, dy, c.x, m_w.value, c.mean, c.rstd, dx, m_w.grad, m_b.grad);
    return dx;
  }
  std::vector<Parameter<T, Exec>*> parameters() { return {&m_w, &m_b}; }
  /// \brief The width C it normalises over, in and out.
  std::size_t input_width() const noexcept { return m_w.local_shape.at(0); }
  std::size_t output_width(std::size_t) const noexcept { return m_w.local_shape.at(0); }

 private:
  double m_eps;
  Parameter<T, Exec> m_w, m_b;
  struct Cache {
    Tensor<T, 2, Exec> x;
    Tensor<T, 1, Exec> mean, rstd;
  };
  Saved<Cache> m_saved;  // per activation slot
};

}  // namespace pmt::nn
