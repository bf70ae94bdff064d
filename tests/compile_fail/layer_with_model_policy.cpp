// SPDX-License-Identifier: Apache-2.0
// EXPECT: pmt::nn: DataParallel is a model-level policy; pass it to Hybrid/Trainer
#include "pmt/nn/linear.hpp"

int main() {
  return static_cast<int>(
      sizeof(pmt::nn::Linear<float, pmt::DataParallel<>, Kokkos::DefaultHostExecutionSpace, pmt::comm::Self>));
}
