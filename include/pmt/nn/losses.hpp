// SPDX-License-Identifier: Apache-2.0
#pragma once
// Deprecated (0.2): MseLoss and CrossEntropyLoss are in nn/loss.hpp with the other losses; this
// forwarding header goes in 0.3.

#include "pmt/nn/loss.hpp"
