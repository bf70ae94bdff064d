// SPDX-License-Identifier: Apache-2.0
// EXPECT: pmt::nn::Chain: a layer gets a tensor placed differently from what it needs
#include "pmt/nn/chain.hpp"
#include "pmt/nn/linear.hpp"

using Exec     = Kokkos::DefaultHostExecutionSpace;
using ColLayer = pmt::nn::Linear<float, pmt::TensorSplit<pmt::Col>, Exec, pmt::comm::Self>;

int main() { return static_cast<int>(sizeof(pmt::nn::Chain<ColLayer, ColLayer>)); }
