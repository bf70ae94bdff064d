// SPDX-License-Identifier: Apache-2.0
#pragma once
// The tools layer: programs built on the library rather than parts of it. The planner
// (plan/model.hpp: the cost and memory model; plan/planner.hpp: the layout search;
// plan/calibrate.hpp: the rates measured on the ranks), the token dataset reader
// (io/dataset.hpp) and the FMA peak probe (obs/peak.hpp). train_gpt and pmt-plan use them; no
// header of pmt.hpp includes any of them.

#include "pmt/pmt.hpp"

#include "pmt/io/dataset.hpp"
#include "pmt/obs/peak.hpp"
#include "pmt/plan/calibrate.hpp"
#include "pmt/plan/describe.hpp"
#include "pmt/plan/model.hpp"
#include "pmt/plan/planner.hpp"
