// SPDX-License-Identifier: Apache-2.0
#pragma once
// Hybrid<Ps...>: the composition of model-level policies, at most one per mesh axis and at most
// one Recompute, in any order (Hybrid<DataParallel<>, TensorSplit<>> and Hybrid<TensorSplit<>,
// DataParallel<>> mean the same). get<Axis> yields the policy on an axis, or Replicate where the
// Hybrid has none. activation_policy<P> says what a policy fixes about a model's activations:
// sequence parallelism (TensorSplit<Sequence>) and recomputation (Recompute<What, Stages>).

#include "pmt/policy/axis.hpp"
#include "pmt/policy/policies.hpp"
#include "pmt/policy/policy_traits.hpp"

#include <type_traits>

namespace pmt::detail {

template <class P, class... Ps>
inline constexpr int same_axis_count_v = ((policy_traits<Ps>::has_axis && policy_traits<P>::has_axis &&
                                                   policy_traits<Ps>::axis == policy_traits<P>::axis
                                               ? 1
                                               : 0) +
                                          ... + 0);

/// Instantiated with ok = false for a policy whose axis another policy of the Hybrid also uses;
/// the diagnostic names that policy and the whole Hybrid.
template <class Policy, class HybridType, bool ok>
struct check_unique_axis : std::true_type {};
template <class Policy, class HybridType>
struct check_unique_axis<Policy, HybridType, false> : std::false_type {
  static_assert(sizeof(Policy) == 0,
                "pmt::Hybrid: more than one policy for the same mesh axis (the policy and the Hybrid "
                "are named in this instantiation of pmt::detail::check_unique_axis); give each of dp, "
                "tp and pp at most one policy");
};

template <class... Ps>
struct recompute_of {
  using type = void;
};
template <class P, class... Ps>
struct recompute_of<P, Ps...> {
  using type = std::conditional_t<is_recompute_v<P>, P, typename recompute_of<Ps...>::type>;
};

template <Axis A, class... Ps>
struct policy_on_axis {
  using type = Replicate;
};
template <Axis A, class P, class... Ps>
struct policy_on_axis<A, P, Ps...> {
  using type = std::conditional_t<policy_traits<P>::has_axis && policy_traits<P>::axis == A, P,
                                  typename policy_on_axis<A, Ps...>::type>;
};

}  // namespace pmt::detail

namespace pmt {

// ---------------------------------------------------------------------------------------------

/// \brief Model-level composition of DataParallel<>, TensorSplit<> and Pipeline<> (any order,
/// one per axis) and Recompute<> (at most one).
/// \code using Par = pmt::Hybrid<pmt::DataParallel<>, pmt::TensorSplit<pmt::Sequence>, pmt::Pipeline<2>,
/// pmt::Recompute<pmt::Selective>>; \endcode
template <class... Ps>
struct Hybrid {
  static_assert((is_parallel_policy_v<Ps> && ...),
                "pmt::Hybrid: every argument must be a pmt policy (DataParallel<>, TensorSplit<>, "
                "Pipeline<>, Recompute<>) or a type with a pmt::policy_traits specialization");
  static_assert(((!is_parallel_policy_v<Ps> || policy_traits<Ps>::model_policy) && ...),
                "pmt::Hybrid: takes model-level policies (DataParallel<>, TensorSplit<>, TensorSplit<Sequence>, "
                "Pipeline<>, Recompute<>); Replicate and TensorSplit<Col|Row> belong on layers");
  static_assert((detail::check_unique_axis<Ps, Hybrid, (detail::same_axis_count_v<Ps, Ps...> <= 1)>::value && ...),
                "pmt::Hybrid: duplicate mesh axis (see the error above)");
  static_assert((0 + ... + (detail::is_recompute_v<Ps> ? 1 : 0)) <= 1,
                "pmt::Hybrid: more than one Recompute<>; say what recomputes, and on which stages, once");

  /// \brief The Recompute<> policy, or void where the Hybrid has none.
  using recompute = typename detail::recompute_of<Ps...>::type;
  /// \brief Whether the tensor split is TensorSplit<Sequence> (sequence parallelism fixed).
  static constexpr bool sequence_parallel = (std::is_same_v<Ps, TensorSplit<Sequence>> || ... || false);

  /// \brief The policy on axis A, or Replicate.
  template <Axis A>
  using get = typename detail::policy_on_axis<A, Ps...>::type;

  /// \brief Whether some policy spreads work over axis A.
  static constexpr bool has(Axis a) {
    return ((policy_traits<Ps>::has_axis && policy_traits<Ps>::axis == a) || ... || false);
  }
};

/// \brief What a policy fixes about a model's activations. A Hybrid with TensorSplit<Sequence>
/// fixes sequence parallelism on; one with Recompute<What, Stages> fixes which stages recompute
/// and what. Anything else (a bare dp mode, a Hybrid without them) fixes nothing: the model's
/// run-time options decide, as Pipeline<> leaves the number of stages to the mesh.
template <class Policy>
struct activation_policy {
  static constexpr bool sequence_parallel = false;  ///< sequence parallelism required (tp > 1)
  static constexpr bool fixes_recompute   = false;  ///< whether recomputation is fixed at all
  static constexpr bool full = false, selective = false;
  /// \brief Whether pipeline stage `stage` recomputes (fixes_recompute only).
  static constexpr bool recomputes_on(int) noexcept { return false; }
};
template <class... Ps>
struct activation_policy<Hybrid<Ps...>> {
  using R                                 = typename Hybrid<Ps...>::recompute;
  static constexpr bool sequence_parallel = Hybrid<Ps...>::sequence_parallel;
  static constexpr bool fixes_recompute   = !std::is_void_v<R>;
  template <class W>
  static constexpr bool what_is() {
    if constexpr (std::is_void_v<R>)
      return false;
    else
      return std::is_same_v<typename R::what, W>;
  }
  static constexpr bool full = what_is<Full>(), selective = what_is<Selective>();
  static constexpr bool recomputes_on(int stage) noexcept {
    if constexpr (std::is_void_v<R>)
      return (void)stage, false;
    else
      return R::on(stage);
  }
};

}  // namespace pmt
