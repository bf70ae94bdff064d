// SPDX-License-Identifier: Apache-2.0
// EXPECT: pmt::shape_str: the argument must be a Kokkos::View
#include "pmt/core/error.hpp"

#include <vector>

int main() {
  std::vector<float> not_a_view(4);
  return static_cast<int>(pmt::shape_str(not_a_view).size());
}
