// SPDX-License-Identifier: Apache-2.0
#pragma once
// Comparing a model's parameter shards with the one-rank model's parameters.
#include "pmt/nn/module.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace pmt::test {

/// max |shard - slice of whole| / max(max |whole|, floor) over a parameter (a tp shard) and the
/// same parameter of the one-rank model; the shard's GlobalSlice says where it sits. `floor`
/// keeps gradients that are analytically zero (the key bias: softmax ignores a shift of all
/// scores) from dividing rounding noise by rounding noise.
template <class P>
double shard_error(const P& shard, const P& whole, bool grads, double floor) {
  const auto& s = shard.slice;
  const auto a = grads ? shard.grad : shard.value, b = grads ? whole.grad : whole.value;
  const std::size_t rows = shard.local_shape[0], cols = shard.local_shape.size() > 1 ? shard.local_shape[1] : 1;
  const std::size_t gcols = shard.local_shape.size() > 1 ? s.extent[1] : 1;
  double worst = 0, scale = std::max(floor, 1e-300);
  for (std::size_t i = 0; i < b.extent(0); ++i) scale = std::max(scale, std::abs(double(b(i))));
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) {
      const std::size_t g = (s.offset[0] + i) * gcols + (shard.local_shape.size() > 1 ? s.offset[1] + j : 0);
      worst               = std::max(worst, std::abs(double(a(i * cols + j)) - double(b(g))));
    }
  return worst / scale;
}

/// {||shard - slice of whole||^2, ||slice of whole||^2} over this rank's shard, matched through
/// the shard's GlobalSlice.
template <class P>
std::pair<double, double> shard_squared_norms(const P& shard, const P& whole) {
  const auto& s          = shard.slice;
  const std::size_t rows = shard.local_shape[0], cols = shard.local_shape.size() > 1 ? shard.local_shape[1] : 1;
  const std::size_t gcols = shard.local_shape.size() > 1 ? s.extent[1] : 1;
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) {
      const std::size_t g = (s.offset[0] + i) * gcols + (shard.local_shape.size() > 1 ? s.offset[1] + j : 0);
      const double a = double(shard.value(i * cols + j)), b = double(whole.value(g));
      diff += (a - b) * (a - b);
      ref += b * b;
    }
  return {diff, ref};
}

/// Norm-wise relative difference ||shard - slice of whole|| / max(||slice of whole||, floor)
/// (the Frobenius norm over this rank's shard).
template <class P>
double shard_norm_error(const P& shard, const P& whole, double floor) {
  const auto [diff, ref] = shard_squared_norms(shard, whole);
  return std::sqrt(diff) / std::max(std::sqrt(ref), std::max(floor, 1e-300));
}

}  // namespace pmt::test
