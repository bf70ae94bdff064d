// SPDX-License-Identifier: Apache-2.0
#pragma once
// ModelSpec: any model as the planner sees it, layer by layer, per row of a microbatch (a sample
// of a regression; a token of a language model), in global (one-rank) quantities that the
// planner divides by tp where the layer splits them. A Chain reports its own (plan/describe.hpp);
// a user may write one by hand for a model pmt does not build. Legend: tp the tensor-parallel
// degree, s bytes per value, R rows of a microbatch.
//   parameters            split over tp (a Col or Row layer's weight, a Col layer's bias)
//   replicated_parameters every tp rank holds them whole (LayerNorm, a Row layer's bias)
//   flops                 forward FLOPs per row of the split part (a rank does flops / tp)
//   replicated_flops      forward FLOPs per row every tp rank does whole
//   input, output         widths of the tensors entering and leaving the layer, and whether tp
//                         splits them (what a pipeline cut after the layer sends: output / tp)
//   saved                 values per row the layer keeps for its backward (split like its input)
//   forward_reduce        values per row all-reduced over tp in forward (a Row layer's output)
//   backward_reduce       values per row all-reduced over tp in backward (a Col layer's dx)
//   divides               extents tp must divide (a split layer's split features)
// The backward does twice the forward's FLOPs. A live microbatch holds the saved values of its
// stage's layers and the stage's output; the transient of a backward is its widest gradient.

#include <cstddef>
#include <string>
#include <vector>

namespace pmt::plan {

/// \brief One layer of a model as the planner sees it (see the file comment).
struct LayerSpec {
  std::string name;
  double parameters = 0, replicated_parameters = 0;
  double flops = 0, replicated_flops = 0;
  double input = 0, output = 0;
  bool input_split = false, output_split = false;
  double saved          = 0;
  double forward_reduce = 0, backward_reduce = 0;
  std::vector<std::size_t> divides;

  /// \brief Values per row of the layer's input and output on one rank of a tp group.
  double input_local(int tp) const { return input_split ? input / tp : input; }
  double output_local(int tp) const { return output_split ? output / tp : output; }
  double saved_local(int tp) const { return input_split ? saved / tp : saved; }
  /// \brief Parameters one rank of a tp group holds.
  double parameters_local(int tp) const { return parameters / tp + replicated_parameters; }
  /// \brief Forward FLOPs per row on one rank of a tp group.
  double flops_local(int tp) const { return flops / tp + replicated_flops; }
};

/// \brief A model as the planner sees it: its layers in order, the rows of one sample and the
/// bytes of data a rank holds per row (inputs and targets).
struct ModelSpec {
  std::string name;
  std::vector<LayerSpec> layers;
  double rows_per_sample    = 1;
  double data_bytes_per_row = 0;

  bool empty() const noexcept { return layers.empty(); }
  /// \brief Every parameter of the model (one rank's count at tp 1).
  double parameters() const {
    double p = 0;
    for (const auto& l : layers) p += l.parameters + l.replicated_parameters;
    return p;
  }
};

}  // namespace pmt::plan
