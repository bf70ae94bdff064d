// SPDX-License-Identifier: Apache-2.0
#pragma once
// The policy tags: Replicate, TensorSplit<Col|Row|AutoSplit>, DataParallel<Mode>,
// Pipeline<Stages, Schedule>. Policies are empty types; everything about them is queried through
// policy_traits (policy/policy_traits.hpp), the single customization point.

#include "pmt/policy/axis.hpp"

#include <type_traits>

namespace pmt {

/// \brief No parallelism: the default layer policy (every rank holds the whole layer).
struct Replicate {};

/// \brief Tensor parallelism over the tp axis. Layers take TensorSplit<Col> or TensorSplit<Row>;
/// a model's Hybrid says TensorSplit<> (each layer picks its split).
template <class Dir = AutoSplit>
struct TensorSplit {
  static_assert(std::is_same_v<Dir, Col> || std::is_same_v<Dir, Row> || std::is_same_v<Dir, AutoSplit>,
                "pmt::TensorSplit: the direction must be pmt::Col, pmt::Row or left out (AutoSplit)");
  using direction = Dir;
};

/// \brief Data-parallel modes: synchronous gradient averaging (equal to one rank on the global
/// batch), or local SGD averaging the parameters every H steps.
struct Synchronous {};
template <int H>
struct LocalSgd {
  static_assert(H >= 1, "pmt::LocalSgd<H>: the averaging period H must be >= 1");
  static constexpr int period = H;
};

/// \brief Data parallelism over the dp axis (a model/trainer-level policy, never a layer's).
template <class Mode = Synchronous>
struct DataParallel {
  using mode = Mode;
};

/// \brief Pipeline schedules.
struct OneFOneB {};
struct GPipe {};

/// \brief Pipeline parallelism over the pp axis with a static (Pipeline<2>) or run-time
/// (Pipeline<>) number of stages.
template <int Stages = dynamic, class Schedule = OneFOneB>
struct Pipeline {
  static_assert(Stages == dynamic || Stages >= 1, "pmt::Pipeline<Stages>: Stages must be >= 1 (or pmt::dynamic)");
  static_assert(std::is_same_v<Schedule, OneFOneB> || std::is_same_v<Schedule, GPipe>,
                "pmt::Pipeline: the schedule must be pmt::OneFOneB or pmt::GPipe");
  static constexpr int stages = Stages;
  using schedule              = Schedule;
};

}  // namespace pmt
