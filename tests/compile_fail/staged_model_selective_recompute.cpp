// SPDX-License-Identifier: Apache-2.0
// EXPECT: pmt::nn::staged_options: a StagedModel recomputes whole chunks
#include "pmt/nn/staged_model.hpp"

int main() {
  using Policy = pmt::Hybrid<pmt::DataParallel<>, pmt::Pipeline<>, pmt::Recompute<pmt::Selective>>;
  const pmt::Mesh<pmt::comm::Self>* mesh = nullptr;  // compiled, never run
  return pmt::nn::staged_options<Policy>(*mesh).recompute ? 1 : 0;
}
