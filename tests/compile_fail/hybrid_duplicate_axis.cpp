// SPDX-License-Identifier: Apache-2.0
// EXPECT: pmt::Hybrid: more than one policy for the same mesh axis
#include "pmt/policy/hybrid.hpp"

int main() {
  pmt::Hybrid<pmt::DataParallel<>, pmt::TensorSplit<>, pmt::DataParallel<pmt::LocalSgd<4>>> twice;
  (void)twice;
}
