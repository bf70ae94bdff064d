// SPDX-License-Identifier: Apache-2.0
#pragma once
// Deprecated (0.2): the optimizer update kernels are in ops/update.hpp (beside optim/, which
// drives them); this forwarding header goes in 0.3.

#include "pmt/ops/update.hpp"
