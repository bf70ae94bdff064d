// SPDX-License-Identifier: Apache-2.0
#pragma once
// Gelu<T, Exec>: the elementwise GELU (tanh approximation) as a layer. It takes a tensor of any
// placement and keeps it, except a partial sum over tp (non-linear: Chain refuses that).
// Communication: none.

#include "pmt/core/instrument.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/nn/module.hpp"
#include "pmt/core/activation_slot.hpp"
#include "pmt/ops/elementwise.hpp"
#include "pmt/policy/placement.hpp"

#include <Kokkos_Core.hpp>

#include <vector>

namespace pmt::nn {

template <class T, class Exec = Kokkos::DefaultExecutionSpace>
class Gelu {
 public:
  using value_type       = T;
  using execution_space  = Exec;
  using input_placement  = AnyPlacement;
  using output_placement = AnyPlacement;  // = its input's
  static constexpr bool nonlinear = true;

  Tensor<T, 2, Exec> forward(const Exec& exec, const Tensor<T, 2, Exec>& x) {
    const Instrument instrument("pmt::nn::Gelu::forward");
    *m_x = x;
    Tensor<T, 2, Exec> y(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pmt::nn::Gelu::y"), x.extent(0), x.extent(1));
    ops::gelu(exec, x, y);
    return y;
  }
  Tensor<T, 2, Exec> backward(const Exec& exec, const Tensor<T, 2, Exec>& dy) {
    const Instrument instrument("pmt::nn::Gelu::backward");
    Tensor<T, 2, Exec> dx(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pmt::nn::Gelu::dx"), dy.extent(0), dy.extent(1));
    ops::gelu_backward(exec, m_x.take(), dy, dx);
    return dx;
  }
  std::vector<Parameter<T, Exec>*> parameters() { return {}; }

 private:
  Saved<Tensor<T, 2, Exec>> m_x;  // the input, per activation slot
};

}  // namespace pmt::nn
