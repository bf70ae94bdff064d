// SPDX-License-Identifier: Apache-2.0
// EXPECT: pmt::nn::Chain: a non-linear layer cannot take a partial sum over tp
#include "pmt/nn/activation.hpp"
#include "pmt/nn/chain.hpp"

using Exec = Kokkos::DefaultHostExecutionSpace;

// A user layer that leaves its output as partial sums over tp (a Row product before its all-reduce).
struct PartialProduct {
  using value_type                = float;
  using execution_space           = Exec;
  using input_placement           = pmt::Sharded;
  using output_placement          = pmt::Partial;
  static constexpr bool nonlinear = false;
};

int main() { return static_cast<int>(sizeof(pmt::nn::Chain<PartialProduct, pmt::nn::Gelu<float, Exec>>)); }
