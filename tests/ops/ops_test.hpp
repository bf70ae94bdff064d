// SPDX-License-Identifier: Apache-2.0
#pragma once
// Helpers for the op tests: host tensors, seeded random fills, and a central finite-difference
// gradient check. Op tests run on the host execution spaces so every element is readable.

#include "pmt/core/tensor.hpp"
#include "pmt_test.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>

namespace pmt::test {

using Host = Kokkos::DefaultHostExecutionSpace;

template <class View>
void fill_random(const View& v, std::uint32_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  auto f = pmt::detail::flat(v);
  for (std::size_t i = 0; i < f.extent(0); ++i) f(i) = static_cast<typename View::value_type>(dist(gen));
}

/// Largest |a - b| / max(1, |b|) over all elements (same shapes).
template <class A, class B>
double max_rel_diff(const A& a, const B& b) {
  auto fa      = pmt::detail::flat(a);
  auto fb      = pmt::detail::flat(b);
  double worst = 0;
  for (std::size_t i = 0; i < fa.extent(0); ++i) {
    const double d = std::abs(static_cast<double>(fa(i)) - static_cast<double>(fb(i))) /
                     std::max(1.0, std::abs(static_cast<double>(fb(i))));
    worst = std::max(worst, d);
  }
  return worst;
}

/// True when the two tensors hold bitwise the same values.
template <class A, class B>
bool bitwise_equal(const A& a, const B& b) {
  auto fa = pmt::detail::flat(a);
  auto fb = pmt::detail::flat(b);
  if (fa.extent(0) != fb.extent(0)) return false;
  for (std::size_t i = 0; i < fa.extent(0); ++i)
    if (std::memcmp(&fa(i), &fb(i), sizeof(fa(i))) != 0) return false;
  return true;
}

/// Central differences of the scalar loss() with respect to every element of x (double),
/// compared with `grad` (the analytic gradient): returns ||fd - grad|| / max(||fd||, 1e-30).
template <class XV, class GV>
double finite_difference_error(const XV& x, const GV& grad, const std::function<double()>& loss, double h = 1e-5) {
  auto fx    = pmt::detail::flat(x);
  auto fg    = pmt::detail::flat(grad);
  double num = 0, den = 0;
  for (std::size_t i = 0; i < fx.extent(0); ++i) {
    const double saved = fx(i);
    fx(i)              = saved + h;
    const double lp    = loss();
    fx(i)              = saved - h;
    const double lm    = loss();
    fx(i)              = saved;
    const double fd    = (lp - lm) / (2 * h);
    num += (fd - fg(i)) * (fd - fg(i));
    den += fd * fd;
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

/// sum(w * y): the scalar whose gradient with respect to y is w.
template <class WV, class YV>
double weighted_sum(const WV& w, const YV& y) {
  auto fw  = pmt::detail::flat(w);
  auto fy  = pmt::detail::flat(y);
  double s = 0;
  for (std::size_t i = 0; i < fw.extent(0); ++i) s += static_cast<double>(fw(i)) * static_cast<double>(fy(i));
  return s;
}

}  // namespace pmt::test
