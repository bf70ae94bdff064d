// SPDX-License-Identifier: Apache-2.0
// EXPECT: pmt::Hybrid: more than one Recompute<>
#include "pmt/policy/hybrid.hpp"

int main() {
  pmt::Hybrid<pmt::DataParallel<>, pmt::Recompute<pmt::Full>, pmt::Recompute<pmt::Selective, 1>> twice;
  (void)twice;
}
