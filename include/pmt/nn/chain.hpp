// SPDX-License-Identifier: Apache-2.0
#pragma once
// Chain<Layers...>: layers applied in order (forward) and in reverse (backward), with their
// placements checked when the type is instantiated. A layer whose input placement differs from
// what the previous layer yields, or a non-linear layer fed a partial sum over tp, is a compile
// error; the diagnostic names both layers and says what to do.
// A Chain also runs a range [begin, end) of its layers (a pipeline stage of nn::StagedModel),
// lists their parameters, and reports the local width of the tensor between any two layers
// (input_width() of the first layer, then each layer's output_width(in)), so that a stage can
// size what it receives before the sender has computed it.

#include "pmt/core/progress.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/nn/module.hpp"
#include "pmt/policy/placement.hpp"

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace pmt::detail {

template <class L, class = void>
struct has_output_width : std::false_type {};
template <class L>
struct has_output_width<L, std::void_t<decltype(std::size_t(std::declval<const L&>().output_width(std::size_t(1))))>>
    : std::true_type {};
template <class L, class = void>
struct has_input_width : std::false_type {};
template <class L>
struct has_input_width<L, std::void_t<decltype(std::size_t(std::declval<const L&>().input_width()))>> : std::true_type {
};

/// Fails to compile when layer L cannot say its output width; the instantiation names L.
template <class L>
constexpr bool check_output_width() {
  static_assert(
      has_output_width<L>::value,
      "pmt::nn::Chain: this layer (pmt::detail::check_output_width<L>) lacks std::size_t output_width(std::size_t "
      "input_width) const, the local width of its output for an input of that width; a pipeline stage "
      "needs it to size what it receives");
  return true;
}

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
  using in = typename L::input_placement;
  static constexpr bool placement_ok =
      std::is_same_v<in, AnyPlacement> || std::is_same_v<Current, AnyPlacement> || std::is_same_v<in, Current>;
  static constexpr bool partial_ok = !(L::nonlinear && std::is_same_v<Current, Partial>);
  using next = std::conditional_t<std::is_same_v<typename L::output_placement, AnyPlacement>, Current,
                                  typename L::output_placement>;
  static constexpr bool ok =
      check_link<Previous, L, Current, placement_ok, partial_ok>::value && link_walk<L, next, Layers...>::ok;
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
  static_assert(pmt::detail::link_walk<void, AnyPlacement, Layers...>::ok, "pmt::nn::Chain: see the error above");
  using First = std::tuple_element_t<0, std::tuple<Layers...>>;

 public:
  using value_type                = typename First::value_type;
  using execution_space           = typename First::execution_space;
  using input_placement           = typename First::input_placement;
  using output_placement          = typename pmt::detail::link_walk<void, AnyPlacement, Layers...>::output;
  static constexpr bool nonlinear = (Layers::nonlinear || ...);
  using T                         = value_type;
  using Exec                      = execution_space;

  explicit Chain(Layers... layers) : m_layers(std::move(layers)...) {}

  Tensor<T, 2, Exec> forward(const Exec& exec, const Tensor<T, 2, Exec>& x) { return forward_from<0>(exec, x); }
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

  /// \brief The number of layers.
  static constexpr std::size_t size() noexcept { return sizeof...(Layers); }

  /// \brief The hooks a chain calls around each layer with parameters that reads their values
  /// (empty: none): values_needed before it, values_done after (ZeRO-3 gathers them in between).
  struct ValueHooks {
    std::function<void(const std::vector<Parameter<T, Exec>*>&)> needed, done;
  };
  /// \brief Forward of layers [begin, end) only (a pipeline stage's part), naming each layer's
  /// parameters to `values` around it.
  Tensor<T, 2, Exec> forward(const Exec& exec, Tensor<T, 2, Exec> x, std::size_t begin, std::size_t end,
                             const ValueHooks& values = {}) {
    each([&](auto I) {
      if (I >= begin && I < end) {
        auto& layer = std::get<I>(m_layers);
        {
          const Reading reading(values, layer);
          x = layer.forward(exec, x);
        }
        pmt::progress();  // a pipeline stage's pending messages move between layers
      }
    });
    return x;
  }
  /// \brief Backward of layers [begin, end), last first; before each layer's backward
  /// `grads_needed` (when set) gets that layer's parameters, whose gradients it is about to
  /// write, and after it `grads_ready` (when set), whose gradients are then final.
  /// Each layer's parameters are named to `values` around its backward.
  template <class Hook, class Needed = Hook>
  Tensor<T, 2, Exec> backward(const Exec& exec, Tensor<T, 2, Exec> dy, std::size_t begin, std::size_t end,
                              const Hook& grads_ready, const Needed& grads_needed = Needed(),
                              const ValueHooks& values = {}) {
    each_reverse([&](auto I) {
      if (I >= begin && I < end) {
        auto& layer = std::get<I>(m_layers);
        if (grads_needed) {
          const auto ps = layer.parameters();
          if (!ps.empty()) grads_needed(ps);
        }
        {
          const Reading reading(values, layer);
          dy = layer.backward(exec, dy);
        }
        pmt::progress();
        if (grads_ready) {
          const auto ps = layer.parameters();
          if (!ps.empty()) grads_ready(ps);
        }
      }
    });
    return dy;
  }
  /// \brief The parameters of layers [begin, end), in order.
  std::vector<Parameter<T, Exec>*> parameters(std::size_t begin, std::size_t end) {
    std::vector<Parameter<T, Exec>*> all;
    each([&](auto I) {
      if (I >= begin && I < end) append(all, std::get<I>(m_layers).parameters());
    });
    return all;
  }
  /// \brief The parameters of each layer, one list per layer.
  std::vector<std::vector<Parameter<T, Exec>*>> layer_parameters() {
    std::vector<std::vector<Parameter<T, Exec>*>> all;
    each([&](auto I) { all.push_back(std::get<I>(m_layers).parameters()); });
    return all;
  }

  /// \brief The local width of the chain's input (the first layer's input_width()).
  std::size_t input_width() const {
    static_assert(pmt::detail::has_input_width<First>::value,
                  "pmt::nn::Chain::input_width: the first layer lacks std::size_t input_width() const (Linear, "
                  "LayerNorm and Chain have it); start the chain with such a layer");
    return std::get<0>(m_layers).input_width();
  }
  /// \brief The local width after every layer for an input of width `in`: widths()[i] enters
  /// layer i, widths()[size()] leaves the chain.
  std::vector<std::size_t> widths(std::size_t in) const {
    std::vector<std::size_t> w{in};
    each([&](auto I) {
      using L = std::tuple_element_t<I, std::tuple<Layers...>>;
      static_assert(pmt::detail::check_output_width<L>());
      w.push_back(std::get<I>(m_layers).output_width(w.back()));
    });
    return w;
  }
  /// \brief Whether tp splits the tensor entering each layer (entry size(): leaving the chain),
  /// from the layers' placements: Sharded after a Col layer, whole after a Row layer or a
  /// replicated one, unchanged through an elementwise layer (AnyPlacement).
  static std::vector<bool> split_widths() {
    std::vector<bool> split{std::is_same_v<typename First::input_placement, Sharded>};
    each([&](auto I) {
      using O = typename std::tuple_element_t<I, std::tuple<Layers...>>::output_placement;
      split.push_back(std::is_same_v<O, AnyPlacement> ? bool(split.back()) : std::is_same_v<O, Sharded>);
    });
    return split;
  }
  /// \brief The local width of the chain's output for an input of width `in`.
  std::size_t output_width(std::size_t in) const { return widths(in).back(); }

 private:
  /// Names a layer's parameters to the value hooks while it lives (a layer without any: nothing).
  class Reading {
   public:
    template <class Layer>
    Reading(const ValueHooks& hooks, Layer& layer) : m_hooks(hooks) {
      if (m_hooks.needed || m_hooks.done) m_params = layer.parameters();
      if (m_hooks.needed && !m_params.empty()) m_hooks.needed(m_params);
    }
    ~Reading() {
      if (m_hooks.done && !m_params.empty()) m_hooks.done(m_params);
    }
    Reading(const Reading&)            = delete;
    Reading& operator=(const Reading&) = delete;

   private:
    const ValueHooks& m_hooks;
    std::vector<Parameter<T, Exec>*> m_params;
  };
  template <class F, std::size_t... I>
  static void each_impl(F&& f, std::index_sequence<I...>) {
    (f(std::integral_constant<std::size_t, I>{}), ...);
  }
  template <class F, std::size_t... I>
  static void each_reverse_impl(F&& f, std::index_sequence<I...>) {
    (f(std::integral_constant<std::size_t, sizeof...(I) - 1 - I>{}), ...);
  }
  template <class F>
  static void each(F&& f) {
    each_impl(f, std::index_sequence_for<Layers...>{});
  }
  template <class F>
  static void each_reverse(F&& f) {
    each_reverse_impl(f, std::index_sequence_for<Layers...>{});
  }

  template <std::size_t I>
  Tensor<T, 2, Exec> forward_from(const Exec& exec, const Tensor<T, 2, Exec>& x) {
    if constexpr (I == sizeof...(Layers))
      return x;
    else
      return forward_from<I + 1>(exec, std::get<I>(m_layers).forward(exec, x));
  }
  template <std::size_t I>
  Tensor<T, 2, Exec> backward_from(const Exec& exec, const Tensor<T, 2, Exec>& dy) {
    if constexpr (I == 0)
      return dy;
    else
      return backward_from<I - 1>(exec, std::get<I - 1>(m_layers).backward(exec, dy));
  }
  static void append(std::vector<Parameter<T, Exec>*>& all, const std::vector<Parameter<T, Exec>*>& more) {
    all.insert(all.end(), more.begin(), more.end());
  }

  std::tuple<Layers...> m_layers;
};

}  // namespace pmt::nn
