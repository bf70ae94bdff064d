// SPDX-License-Identifier: Apache-2.0
#pragma once
// The umbrella header: the whole public API of pmt. Area headers may be included directly to
// save compile time, but only this header carries the stability promise.

#include "pmt/config.hpp"
#include "pmt/version.hpp"

#include "pmt/core/environment.hpp"
#include "pmt/core/error.hpp"
