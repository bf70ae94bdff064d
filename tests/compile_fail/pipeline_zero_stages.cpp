// SPDX-License-Identifier: Apache-2.0
// EXPECT: pmt::Pipeline<Stages>: Stages must be >= 1
#include "pmt/policy/policies.hpp"

int main() { return pmt::Pipeline<0>::stages; }
