// SPDX-License-Identifier: Apache-2.0
#pragma once
// Chain<Layers...>: layers applied in order (forward) and in reverse (backward), with their
// placements checked when the type is instantiated. A layer whose input placement differs from
// what the previous layer yields, or a non-linear layer fed a partial sum over tp, is a compile
// error; the diagnostic names both layers and says what to do.

#include "pmt/core/tensor.hpp"
#include "pmt/nn/module.hpp"
#include "pmt/policy/placement.hpp"

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace pmt::detail {

/// Fails to compile for a bad link; the instantiation names the previous layer, the next layer
/// and the placement flowing between them.
template <class Previous, class Next, class Placement, bool placement_ok, bool partial_ok>
struct check_link : std::true_type {};
template <class Previous, class Next, class Placement, bool partial_ok>
struct check_link<Previous, Next, Placement, false, partial_ok> : std::false_type {
  static_assert(sizeof(Next) == 0,
                "pmt::nn::Chain: a layer gets a tensor placed differently from what it needs (this "
                "pmt::detail::check_link<Previous, Next, Placement, ...> names both layers and the "
                "placement): follow a TensorSplit<Col> layer by a TensorSplit<Row> layer (elementwise "
                "layers may sit between them); two Col or two Row layers in a row need a gather or "
                "an all-reduce between them");
};
template <class Previous, class Next, class Placement>
struct check_link<Previous, Next, Placement, true, false> : std::false_type {
  static_assert(sizeof(Next) == 0,
                "pmt::nn::Chain: a non-linear layer cannot take a partial sum over tp (this "
                "pmt::detail::check_link<Previous, Next, Placement, ...> names both layers); "
                "all-reduce the partial sums first");
};

/// Walks the layers with the placement flowing in (AnyPlacement at the chain's input).
template <class Previous, class Current, class... Layers>
struct link_walk {
  static constexpr bool ok = true;
  using output             = Current;
};
template <class Previous, class Current, class L, class... Layers>
struct link_walk<Previous, Current, L, Layers...> {
  using in                           = typename L::input_placement;
  static constexpr bool placement_ok = std::is_same_v<in, AnyPlacement> || std::is_same_v<Current, AnyPlacement> ||
                                       std::is_same_v<in, Current>;
  static constexpr bool partial_ok   = !(L::nonlinear && std::is_same_v<Current, Partial>);
  using next = std::conditional_t<std::is_same_v<typename L::output_placement, AnyPlacement>, Current,
                                  typename L::output_placement>;
  static constexpr bool ok = check_link<Previous, L, Current, placement_ok, partial_ok>::value &&
                             link_walk<L, next, Layers...>::ok;
  using output = typename link_walk<L, next, Layers...>::output;
};

}  // namespace pmt::detail

namespace pmt::nn {

// ---------------------------------------------------------------------------------------------

/// \brief Layers in sequence; placements are checked at compile time (see the file comment).
/// Communication: that of its layers.
template <class... Layers>
class Chain {
  static_assert(sizeof...(Layers) >= 1, "pmt::nn::Chain: needs at least one layer");
  static_assert(detail::link_walk<void, AnyPlacement, Layers...>::ok, "pmt::nn::Chain: see the error above");
  using First = std::tuple_element_t<0, std::tuple<Layers...>>;

 public:
  using value_type       = typename First::value_type;
  using execution_space  = typename First::execution_space;
  using input_placement  = typename First::input_placement;
  using output_placement = typename detail::link_walk<void, AnyPlacement, Layers...>::output;
  static constexpr bool nonlinear = (Layers::nonlinear || ...);
  using T                         = value_type;
  using Exec                      = execution_space;

  explicit Chain(Layers... layers) : m_layers(std::move(layers)...) {}

  Tensor<T, 2, Exec> forward(const Exec& exec, const Tensor<T, 2, Exec>& x) {
    return forward_from<0>(exec, x);
  }
  Tensor<T, 2, Exec> backward(const Exec& exec, const Tensor<T, 2, Exec>& dy) {
    return backward_from<sizeof...(Layers)>(exec, dy);
  }
  std::vector<Parameter<T, Exec>*> parameters() {
    std::vector<Parameter<T, Exec>*> all;
    std::apply([&](auto&... l) { (append(all, l.parameters()), ...); }, m_layers);
    return all;
  }
  template <std::size_t I>
  auto& get() {
    return std::get<I>(m_layers);
  }

 private:
  template <std::size_t I>
  Tensor<T, 2, Exec> forward_from(const Exec& exec, const Tensor<T, 2, Exec>& x) {
    if constexpr (I == sizeof...(Layers)) return x;
    else return forward_from<I + 1>(exec, std::get<I>(m_layers).forward(exec, x));
  }
  template <std::size_t I>
  Tensor<T, 2, Exec> backward_from(const Exec& exec, const Tensor<T, 2, Exec>& dy) {
    if constexpr (I == 0) return dy;
    else return backward_from<I - 1>(exec, std::get<I - 1>(m_layers).backward(exec, dy));
  }
  static void append(std::vector<Parameter<T, Exec>*>& all, const std::vector<Parameter<T, Exec>*>& more) {
    all.insert(all.end(), more.begin(), more.end());
  }

  std::tuple<Layers...> m_layers;
};

}  // namespace pmt::nn
