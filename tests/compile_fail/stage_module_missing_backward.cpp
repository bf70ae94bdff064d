// SPDX-License-Identifier: Apache-2.0
// EXPECT: pmt stage module: the model lacks Activation backward_chunk(const Exec&, int chunk, const Activation& dy)
// A model the Trainer cannot drive: everything of the stage-module contract but backward_chunk.
#include "pmt/optim/optimizers.hpp"
#include "pmt/train/trainer.hpp"

#include <array>
#include <vector>

using Exec = Kokkos::DefaultHostExecutionSpace;
using Act  = pmt::Tensor<double, 2, Exec>;

struct NoBackward {
  using value_type = double;
  using Batch      = pmt::parallel::Samples<Act, Act>;
  using Activation = Act;
  int stage() const { return 0; }
  int stages() const { return 1; }
  int chunks() const { return 1; }
  std::vector<pmt::Parameter<double, Exec>*> parameters() { return {}; }
  Act forward_chunk(const Exec&, int, const Batch& b, const Act&, double, double*) { return b.input; }
  std::array<std::size_t, 2> input_extent(int, const Batch& b) const { return {b.rows, 1}; }
  std::array<std::size_t, 2> output_extent(int, const Batch& b) const { return {b.rows, 1}; }
};

int main() {
  using Backend = pmt::comm::default_backend_t<Exec>;
  return sizeof(pmt::train::Trainer<NoBackward, pmt::optim::Sgd<double, Exec>, Exec, Backend>) > 0 ? 0 : 1;
}
