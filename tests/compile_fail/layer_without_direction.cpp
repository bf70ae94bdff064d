// SPDX-License-Identifier: Apache-2.0
// EXPECT: pmt::nn: a layer needs a direction: TensorSplit<pmt::Col> or TensorSplit<pmt::Row>
#include "pmt/nn/linear.hpp"

int main() {
  return static_cast<int>(
      sizeof(pmt::nn::Linear<float, pmt::TensorSplit<>, Kokkos::DefaultHostExecutionSpace, pmt::comm::Self>));
}
