// SPDX-License-Identifier: Apache-2.0
#pragma once
// Placements: how a tensor between two layers is laid out over the tp axis, carried in the types
// of the layers so that a composition that would compute garbage does not compile.
//   Replicated  every tp rank holds the whole tensor
//   Sharded     each tp rank holds a slice of the last dim (the output of a Col layer)
//   Partial     each tp rank holds a partial sum; only all_reduce(tp) makes it whole
//   AnyPlacement (a layer's input only) elementwise layers take any placement and keep it

#include <type_traits>

namespace pmt {

/// \brief Where a tensor lives over tp: Replicated (every rank holds it whole), Sharded (each
/// rank a slice of its last dimension), Partial (each rank a partial sum of it), AnyPlacement
/// (a layer that keeps whatever comes in).
struct Replicated {};
struct Sharded {};
struct Partial {};
struct AnyPlacement {};

/// \brief True for Replicated, Sharded and Partial.
template <class P>
inline constexpr bool is_placement_v =
    std::is_same_v<P, Replicated> || std::is_same_v<P, Sharded> || std::is_same_v<P, Partial>;

/// \brief What a placement is called in messages.
template <class P>
constexpr const char* placement_name() {
  if constexpr (std::is_same_v<P, Replicated>)
    return "replicated";
  else if constexpr (std::is_same_v<P, Sharded>)
    return "tp-sharded";
  else if constexpr (std::is_same_v<P, Partial>)
    return "partial-sum";
  else
    return "any";
}

}  // namespace pmt
