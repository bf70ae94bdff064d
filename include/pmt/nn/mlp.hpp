// SPDX-License-Identifier: Apache-2.0
#pragma once
// Mlp: the Megatron MLP block, Linear<Col> -> Gelu -> Linear<Row>, as a Chain.
// Shapes: x (N, d) -> (N, hidden/tp) -> (N, hidden/tp) -> (N, d).
// Communication: forward one all_reduce(tp) (in the Row layer); backward one (dx of the Col layer);
// with sequence parallelism an all-gather and a reduce-scatter each way instead, x (N/tp, d).

#include "pmt/comm/backend.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/core/random.hpp"
#include "pmt/nn/activation.hpp"
#include "pmt/nn/chain.hpp"
#include "pmt/nn/linear.hpp"

namespace pmt::nn {

/// \brief The transformer MLP: Linear<Col> (d -> hidden) -> Gelu -> Linear<Row> (hidden -> d);
/// one all-reduce forward (Row), one backward (Col).
template <class T, class Exec = Kokkos::DefaultExecutionSpace, class Backend = comm::default_backend_t<Exec>>
using Mlp =
    Chain<Linear<T, TensorSplit<Col>, Exec, Backend>, Gelu<T, Exec>, Linear<T, TensorSplit<Row>, Exec, Backend>>;

/// \brief An Mlp of width d and hidden width `hidden`; its weights use RNG streams `first_stream`
/// and `first_stream + 1`. With `sequence_parallel` it takes and gives this rank's N/tp rows
/// (LinearOptions::sequence_parallel). \throws pmt::ShapeError when hidden is not divisible by tp.
template <class T, class Exec = Kokkos::DefaultExecutionSpace, class Backend = comm::default_backend_t<Exec>>
Mlp<T, Exec, Backend> make_mlp(const Mesh<Backend>& mesh, std::size_t d, std::size_t hidden, std::uint64_t seed,
                               std::uint32_t first_stream, bool sequence_parallel = false) {
  LinearOptions o;
  o.sequence_parallel = sequence_parallel;
  return Mlp<T, Exec, Backend>(
      Linear<T, TensorSplit<Col>, Exec, Backend>(mesh, d, hidden, RngKey{seed, first_stream}, o), Gelu<T, Exec>(),
      Linear<T, TensorSplit<Row>, Exec, Backend>(mesh, hidden, d, RngKey{seed, first_stream + 1}, o));
}

}  // namespace pmt::nn
