// SPDX-License-Identifier: Apache-2.0
#pragma once
// Hybrid<Ps...>: the composition of model-level policies, at most one per mesh axis, in any
// order (Hybrid<DataParallel<>, TensorSplit<>> and Hybrid<TensorSplit<>, DataParallel<>> mean
// the same). get<Axis> yields the policy on an axis, or Replicate where the Hybrid has none.

#include "pmt/policy/axis.hpp"
#include "pmt/policy/policies.hpp"
#include "pmt/policy/policy_traits.hpp"

#include <type_traits>

namespace pmt::detail {

template <class P, class... Ps>
inline constexpr int same_axis_count_v =
    ((policy_traits<Ps>::has_axis && policy_traits<P>::has_axis && policy_traits<Ps>::axis == policy_traits<P>::axis
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
/// one per axis). \code using Par = pmt::Hybrid<pmt::DataParallel<>, pmt::TensorSplit<>, pmt::Pipeline<2>>; \endcode
template <class... Ps>
struct Hybrid {
  static_assert((is_parallel_policy_v<Ps> && ...),
                "pmt::Hybrid: every argument must be a pmt policy (DataParallel<>, TensorSplit<>, "
                "Pipeline<>) or a type with a pmt::policy_traits specialization");
  static_assert(((!is_parallel_policy_v<Ps> || policy_traits<Ps>::model_policy) && ...),
                "pmt::Hybrid: takes model-level policies (DataParallel<>, TensorSplit<>, Pipeline<>); "
                "Replicate and TensorSplit<Col|Row> belong on layers");
  static_assert((detail::check_unique_axis<Ps, Hybrid, (detail::same_axis_count_v<Ps, Ps...> <= 1)>::value && ...),
                "pmt::Hybrid: duplicate mesh axis (see the error above)");

  /// \brief The policy on axis A, or Replicate.
  template <Axis A>
  using get = typename detail::policy_on_axis<A, Ps...>::type;

  /// \brief Whether some policy spreads work over axis A.
  static constexpr bool has(Axis a) {
    return ((policy_traits<Ps>::has_axis && policy_traits<Ps>::axis == a) || ... || false);
  }
};

}  // namespace pmt
