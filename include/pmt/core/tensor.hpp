// SPDX-License-Identifier: Apache-2.0
#pragma once
// Tensors are Kokkos::Views (design invariant 1): Tensor<T, N, Exec> is the LayoutRight View of
// rank N in Exec's memory space, and make_tensor() allocates one. pmt adds no owning wrapper.
// Also here: the space traits ops dispatch on, and detail::flat(), the contiguous 1-D view of any
// tensor that elementwise kernels run over.

#include "pmt/core/error.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>  // for HUGE_VAL
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace pmt::detail {

template <class T, int N>
struct add_pointers {
  using type = typename add_pointers<T, N - 1>::type*;
};
template <class T>
struct add_pointers<T, 0> {
  using type = T;
};

template <class T>
inline constexpr bool dependent_false_v = false;

/// +infinity of T, usable in device code on every Kokkos version.
template <class T>
KOKKOS_INLINE_FUNCTION constexpr T infinity() {
  return static_cast<T>(HUGE_VAL);
}

}  // namespace pmt::detail

namespace pmt {

// ---------------------------------------------------------------------------------------------

/// \brief The tensor type: a rank-N, LayoutRight Kokkos::View of T in Exec's memory space.
template <class T, int N, class Exec = Kokkos::DefaultExecutionSpace>
using Tensor =
    Kokkos::View<typename detail::add_pointers<T, N>::type, Kokkos::LayoutRight, typename Exec::memory_space>;

/// \brief Allocates a zero-filled Tensor<T, sizeof...(dims), Exec> labelled `label`.
template <class T, class Exec = Kokkos::DefaultExecutionSpace, class... Dims>
Tensor<T, static_cast<int>(sizeof...(Dims)), Exec> make_tensor(const std::string& label, Dims... dims) {
  return Tensor<T, static_cast<int>(sizeof...(Dims)), Exec>(label, static_cast<std::size_t>(dims)...);
}

/// \brief True when Exec runs on the host (its memory is host-accessible: CBLAS may be used).
template <class Exec>
inline constexpr bool is_host_space_v =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible;

/// \brief Checks at compile time that View can be used by an op running on Exec.
template <class Exec, class View>
constexpr void static_check_view() {
  static_assert(Kokkos::is_view<View>::value, "pmt::ops: tensor arguments must be Kokkos::Views");
  static_assert(std::is_same_v<typename View::array_layout, Kokkos::LayoutRight>,
                "pmt::ops: tensors must be LayoutRight (pmt::Tensor)");
  static_assert(Kokkos::SpaceAccessibility<Exec, typename View::memory_space>::accessible,
                "pmt::ops: a tensor's memory space is not accessible from the execution space");
}

namespace detail {

/// The contiguous 1-D unmanaged view over all elements of `v` (LayoutRight, contiguous).
template <class View>
auto flat(const View& v) {
  using T = typename View::value_type;
  return Kokkos::View<T*, Kokkos::LayoutRight, typename View::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
      v.data(), v.size());
}

/// Throws ShapeError naming `op` unless `a` and `b` have the same extents.
template <class A, class B>
void require_same_shape(std::string_view op, const char* name_a, const A& a, const char* name_b, const B& b) {
  bool same = static_cast<int>(A::rank) == static_cast<int>(B::rank);
  for (std::size_t i = 0; same && i < static_cast<std::size_t>(A::rank); ++i) same = a.extent(i) == b.extent(i);
  require(same, op, [&] {
    return str(name_a, " is ", shape_str(a), " but ", name_b, " is ", shape_str(b), "; expected equal shapes");
  });
}

/// Throws ShapeError unless v.extent(dim) == expected.
template <class V>
void require_extent(std::string_view op, const char* name, const V& v, std::size_t dim, std::size_t expected,
                    const char* rule) {
  require(v.extent(dim) == expected, op, [&] {
    return str(name, " is ", shape_str(v), "; expected ", name, ".extent(", dim, ") == ", expected, " (", rule, ")");
  });
}

}  // namespace detail
}  // namespace pmt
