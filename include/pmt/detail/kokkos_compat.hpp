// SPDX-License-Identifier: Apache-2.0
#pragma once
// Differences between the Kokkos versions pmt supports (3.4 and newer, 4.x included), in one
// place. Math functions live in Kokkos::Experimental before 3.7 and in Kokkos from 3.7 on
// (the Experimental names were removed in 4.0); pmt code calls pmt::detail::math::exp etc.

#include <Kokkos_Core.hpp>

namespace pmt::detail::math {

#if KOKKOS_VERSION >= 30700
using Kokkos::cos;
using Kokkos::exp;
using Kokkos::log;
using Kokkos::sin;
using Kokkos::sqrt;
using Kokkos::tanh;
#else
using Kokkos::Experimental::cos;
using Kokkos::Experimental::exp;
using Kokkos::Experimental::log;
using Kokkos::Experimental::sin;
using Kokkos::Experimental::sqrt;
using Kokkos::Experimental::tanh;
#endif

}  // namespace pmt::detail::math
