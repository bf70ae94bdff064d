// SPDX-License-Identifier: Apache-2.0
#pragma once
// policy_traits<P>: THE customization point of pmt's policies. A policy is any type with a
// specialization providing:
//   has_axis        whether it spreads work over a mesh axis
//   axis            which one (dp, tp or pp)
//   layer_policy    whether a layer may take it (Replicate, TensorSplit<Col|Row>)
//   model_policy    whether Hybrid may take it (DataParallel<>, TensorSplit<>, Pipeline<>,
//                   Recompute<>)
//   static_degree   the axis size fixed in the type, or pmt::dynamic
//   split           Col, Row or void (layer policies)
//   input_placement, output_placement   of a Linear-like layer under this policy
// Users add policies the same way (tests/policy holds one); pmt never uses ADL or virtuals here.

#include "pmt/policy/axis.hpp"
#include "pmt/policy/placement.hpp"
#include "pmt/policy/policies.hpp"

#include <type_traits>

namespace pmt {

/// \brief Unspecialized: not a policy.
template <class P>
struct policy_traits {};

/// \brief The policies' traits: whether a policy has a mesh axis, is a layer or a model policy,
/// its static degree, its split (Col, Row or none) and, for layer policies, the placements in and
/// out: Replicate Replicated -> Replicated, TensorSplit<Col> Replicated -> Sharded,
/// TensorSplit<Row> Sharded -> Replicated.
template <>
struct policy_traits<Replicate> {
  static constexpr bool has_axis = false, layer_policy = true, model_policy = false;
  static constexpr Axis axis         = Axis::tp;  // unused
  static constexpr int static_degree = 1;
  using split                        = void;
  using input_placement              = Replicated;
  using output_placement             = Replicated;
};

/// \brief Column split over tp: Replicated in, Sharded out.
template <>
struct policy_traits<TensorSplit<Col>> {
  static constexpr bool has_axis = true, layer_policy = true, model_policy = false;
  static constexpr Axis axis         = Axis::tp;
  static constexpr int static_degree = dynamic;
  using split                        = Col;
  using input_placement              = Replicated;
  using output_placement             = Sharded;
};

/// \brief Row split over tp: Sharded in, Replicated out (an all-reduce inside).
template <>
struct policy_traits<TensorSplit<Row>> {
  static constexpr bool has_axis = true, layer_policy = true, model_policy = false;
  static constexpr Axis axis         = Axis::tp;
  static constexpr int static_degree = dynamic;
  using split                        = Row;
  using input_placement              = Sharded;
  using output_placement             = Replicated;
};

/// \brief TensorSplit<> on a model: the tp axis, each layer choosing its split.
template <>
struct policy_traits<TensorSplit<AutoSplit>> {
  static constexpr bool has_axis = true, layer_policy = false, model_policy = true;
  static constexpr Axis axis         = Axis::tp;
  static constexpr int static_degree = dynamic;
  using split                        = void;
};

/// \brief TensorSplit<Sequence> on a model: the tp axis with sequence parallelism.
template <>
struct policy_traits<TensorSplit<Sequence>> {
  static constexpr bool has_axis = true, layer_policy = false, model_policy = true;
  static constexpr Axis axis         = Axis::tp;
  static constexpr int static_degree = dynamic;
  using split                        = void;
};

/// \brief Recompute<What, Stages>: a model policy on no mesh axis.
template <class What, int Stages>
struct policy_traits<Recompute<What, Stages>> {
  static constexpr bool has_axis = false, layer_policy = false, model_policy = true;
  static constexpr Axis axis         = Axis::pp;  // unused
  static constexpr int static_degree = 1;
  using split                        = void;
};

/// \brief DataParallel<Mode>: the dp axis, a model policy.
template <class Mode>
struct policy_traits<DataParallel<Mode>> {
  static constexpr bool has_axis = true, layer_policy = false, model_policy = true;
  static constexpr Axis axis         = Axis::dp;
  static constexpr int static_degree = dynamic;
  using split                        = void;
};

/// \brief Pipeline<Stages, Schedule>: the pp axis, Stages stages (pmt::dynamic: any).
template <int Stages, class Schedule>
struct policy_traits<Pipeline<Stages, Schedule>> {
  static constexpr bool has_axis = true, layer_policy = false, model_policy = true;
  static constexpr Axis axis         = Axis::pp;
  static constexpr int static_degree = Stages;
  using split                        = void;
};

/// \brief True when P has a policy_traits specialization (is_parallel_policy_v below).
template <class P, class = void>
struct is_parallel_policy : std::false_type {};
template <class P>
struct is_parallel_policy<P, std::void_t<decltype(policy_traits<P>::layer_policy)>> : std::true_type {};

/// \brief True when P has a policy_traits specialization.
template <class P>
inline constexpr bool is_parallel_policy_v = is_parallel_policy<P>::value;

namespace detail {

template <class P>
inline constexpr bool is_data_parallel_v = false;
template <class M>
inline constexpr bool is_data_parallel_v<DataParallel<M>> = true;
template <class P>
inline constexpr bool is_pipeline_v = false;
template <int S, class Sch>
inline constexpr bool is_pipeline_v<Pipeline<S, Sch>> = true;
template <class P>
inline constexpr bool is_recompute_v = false;
template <class W, int S>
inline constexpr bool is_recompute_v<Recompute<W, S>> = true;

/// Compile-time checks for a policy handed to a layer; `Layer` only names the layer in
/// diagnostics. Each message says what to do instead.
template <class Layer, class P>
constexpr bool check_layer_policy() {
  static_assert(is_parallel_policy_v<P>,
                "pmt::nn: the layer's policy is not a pmt policy; use pmt::Replicate, "
                "pmt::TensorSplit<pmt::Col> or pmt::TensorSplit<pmt::Row>, or specialize "
                "pmt::policy_traits for your own");
  if constexpr (is_parallel_policy_v<P>) {
    static_assert(!is_data_parallel_v<P>,
                  "pmt::nn: DataParallel is a model-level policy; pass it to Hybrid/Trainer and "
                  "use Replicate or TensorSplit<Col|Row> on the layer");
    static_assert(!is_pipeline_v<P>,
                  "pmt::nn: Pipeline is a model-level policy; pass it to Hybrid/Trainer and use "
                  "Replicate or TensorSplit<Col|Row> on the layer");
    static_assert(!std::is_same_v<P, TensorSplit<AutoSplit>> && !std::is_same_v<P, TensorSplit<Sequence>>,
                  "pmt::nn: a layer needs a direction: TensorSplit<pmt::Col> or "
                  "TensorSplit<pmt::Row>; TensorSplit<> and TensorSplit<Sequence> belong in Hybrid");
    static_assert(!is_recompute_v<P>,
                  "pmt::nn: Recompute is a model-level policy; pass it to Hybrid/Trainer and build the "
                  "model with its options (nn::gpt_options<Policy>, nn::staged_options<Policy>)");
    static_assert(policy_traits<P>::layer_policy || is_data_parallel_v<P> || is_pipeline_v<P> || is_recompute_v<P> ||
                      std::is_same_v<P, TensorSplit<AutoSplit>> || std::is_same_v<P, TensorSplit<Sequence>>,
                  "pmt::nn: this policy's policy_traits says layer_policy = false");
  }
  return true;
}

}  // namespace detail
}  // namespace pmt
