// SPDX-License-Identifier: Apache-2.0
#pragma once
// describe(net, tp): a Chain as the planner sees it (plan/model_spec.hpp), read off its layers:
// each layer's parameters (global counts, split over tp or replicated, from their GlobalSlice and
// tp_replicated), its widths and whether tp splits them (Chain::widths and Chain::split_widths,
// i.e. the layers' placements), and from these:
//   flops            2 per element of a rank-2 weight and 1 per element of a bias or a scale,
//                    per row (a product x W costs 2 in out)
//   saved            its input (the layers keep their input for the backward; Dropout keeps
//                    only its RNG keys; LayerNorm also 2 statistics per row)
//   forward_reduce   a layer with split parameters from a split input to a whole output (Row):
//                    its output; backward_reduce from a whole input to a split output (Col): its input
//   divides          the split features of such a layer (Col: out, Row: in)
// The Chain may belong to a StagedModel whose other stages' values are freed: only shapes are read.
//   pmt::plan::Problem pr;
//   pr.spec  = pmt::plan::describe(model.net(), mesh.degree(pmt::Axis::tp), "mlp");
//   pr.batch = 64;  // samples per step
//   auto plan = pmt::plan::search(pr, machine);

#include "pmt/core/error.hpp"
#include "pmt/nn/chain.hpp"
#include "pmt/nn/dropout.hpp"
#include "pmt/nn/layernorm.hpp"
#include "pmt/plan/model_spec.hpp"

#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace pmt::plan {

namespace detail {
template <class L>
struct is_dropout : std::false_type {};
template <class T, class Exec, class Placement, class Backend>
struct is_dropout<nn::Dropout<T, Exec, Placement, Backend>> : std::true_type {};
template <class L>
struct is_layernorm : std::false_type {};
template <class T, class Exec>
struct is_layernorm<nn::LayerNorm<T, Exec>> : std::true_type {};

template <class Layers, class F, std::size_t... I>
void each_type(F&& f, std::index_sequence<I...>) {
  (f(std::integral_constant<std::size_t, I>{}, static_cast<std::tuple_element_t<I, Layers>*>(nullptr)), ...);
}
template <class Net>
struct layer_types;
template <class... Layers>
struct layer_types<nn::Chain<Layers...>> {
  using type = std::tuple<Layers...>;
};
}  // namespace detail

/// \brief The ModelSpec of a Chain built on a mesh of tp degree `tp` (see the file comment).
/// `data_bytes_per_row`: what a rank holds of the data per row (default: the input and output
/// widths, one value each).
/// \throws pmt::ConfigError when tp < 1 or a parameter's shard is not 1 / tp of its global shape.
template <class Net>
ModelSpec describe(Net& net, int tp, std::string name = "chain", double data_bytes_per_row = -1) {
  using T = typename Net::value_type;
  pmt::detail::require<ConfigError>(tp >= 1, "pmt::plan::describe",
                                    [&] { return pmt::detail::str("tp = ", tp, "; expected >= 1"); });
  ModelSpec spec;
  spec.name               = std::move(name);
  const auto widths       = net.widths(net.input_width());
  const auto split        = Net::split_widths();
  const auto params       = net.layer_parameters();
  const auto global_width = [&](std::size_t i) { return double(widths[i]) * (split[i] ? tp : 1); };
  detail::each_type<typename detail::layer_types<Net>::type>(
      [&](auto I, auto* type) {
        using L = std::remove_pointer_t<decltype(type)>;
        LayerSpec y;
        y.name  = spec.name + ".layer" + std::to_string(I);
        y.input = global_width(I), y.output = global_width(I + 1);
        y.input_split = split[I], y.output_split = split[I + 1];
        for (const auto* p : params[I]) {
          double n = 1, local = 1;
          for (std::size_t d = 0; d < p->local_shape.size(); ++d)
            n *= double(p->slice.extent[d]), local *= double(p->local_shape[d]);
          pmt::detail::require<ConfigError>(
              p->tp_replicated ? local == n : local * tp == n, "pmt::plan::describe", [&] {
                return pmt::detail::str(
                    "parameter ", p->name, " holds ", local, " of ", n, " elements here; with tp = ", tp,
                    " a split one holds 1 / tp, a replicated one all: was the chain built on a mesh of tp ", tp, "?");
              });
          const double f = p->local_shape.size() >= 2 ? 2 * n : n;
          (p->tp_replicated ? y.replicated_parameters : y.parameters) += n;
          (p->tp_replicated ? y.replicated_flops : y.flops) += f;
        }
        if constexpr (!detail::is_dropout<L>::value) y.saved = y.input;
        if constexpr (detail::is_layernorm<L>::value) y.saved += 2;  // mean and 1 / std per row
        if (y.parameters > 0 && y.input_split && !y.output_split)
          y.forward_reduce = y.output, y.divides = {std::size_t(y.input)};
        if (y.parameters > 0 && !y.input_split && y.output_split)
          y.backward_reduce = y.input, y.divides = {std::size_t(y.output)};
        spec.layers.push_back(std::move(y));
      },
      std::make_index_sequence<Net::size()>{});
  spec.data_bytes_per_row = data_bytes_per_row >= 0
                                ? data_bytes_per_row
                                : double(sizeof(T)) * (spec.layers.front().input + spec.layers.back().output);
  return spec;
}

}  // namespace pmt::plan
