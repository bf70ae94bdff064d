// SPDX-License-Identifier: Apache-2.0
#pragma once
// The policy tags: Replicate, TensorSplit<Col|Row|AutoSplit|Sequence>, DataParallel<Mode>,
// Pipeline<Stages, Schedule> and Recompute<What, Stages>. Policies are empty types; everything about them is queried
// through policy_traits (policy/policy_traits.hpp), the single customization point.

#include "pmt/policy/axis.hpp"

#include <type_traits>

namespace pmt {

/// \brief No parallelism: the default layer policy (every rank holds the whole layer).
struct Replicate {};

/// \brief Tensor parallelism over the tp axis. Layers take TensorSplit<Col> or TensorSplit<Row>;
/// a model's Hybrid says TensorSplit<> (each layer picks its split; sequence parallelism is the
/// model's run-time option) or TensorSplit<Sequence> (sequence parallelism fixed in the type).
template <class Dir = AutoSplit>
struct TensorSplit {
  static_assert(std::is_same_v<Dir, Col> || std::is_same_v<Dir, Row> || std::is_same_v<Dir, AutoSplit> ||
                    std::is_same_v<Dir, Sequence>,
                "pmt::TensorSplit: the direction must be pmt::Col, pmt::Row, pmt::Sequence or left out (AutoSplit)");
  using direction = Dir;
};

/// \brief Data-parallel modes: synchronous gradient averaging (equal to one rank on the global
/// batch), local SGD averaging the parameters every H steps, DiLoCo or bounded staleness (below).
/// LocalSgd<> and DiLoCo<> take their period at run time (train::TrainerOptions::period).
struct Synchronous {};
template <int H = dynamic>
struct LocalSgd {
  static_assert(H == dynamic || H >= 1, "pmt::LocalSgd<H>: the averaging period H must be >= 1");
  static constexpr int period = H;
};

/// \brief DiLoCo: H inner optimizer steps per replica with no communication, then an outer step
/// shared by all replicas: Nesterov-momentum SGD on the dp average of what the H inner steps
/// changed (train::OuterOptions holds its learning rate and momentum). With an outer learning
/// rate of 1 and no momentum it is LocalSgd<H>.
template <int H = dynamic>
struct DiLoCo {
  static_assert(H == dynamic || H >= 1, "pmt::DiLoCo<H>: the outer period H must be >= 1");
  static constexpr int period = H;
};

/// \brief Bounded staleness: asynchronous data parallelism in which each step applies the dp sum
/// of the gradients of S steps before, whose all-reduce had those S steps to complete in
/// (parallel::StaleSync). BoundedStaleness<0> is Synchronous; BoundedStaleness<> takes S at run
/// time (train::TrainerOptions::staleness).
template <int S = dynamic>
struct BoundedStaleness {
  static_assert(S == dynamic || S >= 0, "pmt::BoundedStaleness<S>: the staleness bound S must be >= 0");
  static constexpr int bound = S;
};

/// \brief Data parallelism over the dp axis (a model/trainer-level policy, never a layer's).
template <class Mode = Synchronous>
struct DataParallel {
  using mode = Mode;
};

/// \brief Pipeline schedules. On a model cut into several chunks per stage (virtual stages),
/// OneFOneB runs interleaved 1F1B and GPipe runs all chunks' forwards, then their backwards.
/// Interleaved<V> is OneFOneB that also requires the model to hold V chunks per stage.
struct OneFOneB {};
struct GPipe {};
template <int Chunks>
struct Interleaved {
  static_assert(Chunks >= 2, "pmt::Interleaved<Chunks>: interleaving needs at least 2 model chunks per stage");
  static constexpr int chunks = Chunks;
};

namespace detail {
template <class S>
inline constexpr bool is_interleaved_v = false;
template <int V>
inline constexpr bool is_interleaved_v<Interleaved<V>> = true;
}  // namespace detail

/// \brief Pipeline parallelism over the pp axis with a static (Pipeline<2>) or run-time
/// (Pipeline<>) number of stages.
template <int Stages = dynamic, class Schedule = OneFOneB>
struct Pipeline {
  static_assert(Stages == dynamic || Stages >= 1, "pmt::Pipeline<Stages>: Stages must be >= 1 (or pmt::dynamic)");
  static_assert(std::is_same_v<Schedule, OneFOneB> || std::is_same_v<Schedule, GPipe> ||
                    detail::is_interleaved_v<Schedule>,
                "pmt::Pipeline: the schedule must be pmt::OneFOneB, pmt::GPipe or pmt::Interleaved<Chunks>");
  static constexpr int stages = Stages;
  using schedule              = Schedule;
};

/// \brief What Recompute<> recomputes in backward: the attention core of each block (Megatron's
/// selective recomputation: q k^T, softmax and times v run again; the T x T matrices are not
/// kept) or whole blocks / chunks (each keeps only its input and runs its forward again).
struct Selective {};
struct Full {};

/// \brief Activation recomputation, a model policy without a mesh axis: Recompute<Full> or
/// Recompute<Selective> on every pipeline stage, Recompute<What, K> on the first K stages only
/// (under 1F1B the first stages hold the most live microbatches). The same gradients bit for bit;
/// less activation memory for more forward work. A Hybrid without Recompute leaves recomputation
/// to the model's run-time options.
template <class What = Full, int Stages = 0>
struct Recompute {
  static_assert(std::is_same_v<What, Full> || std::is_same_v<What, Selective>,
                "pmt::Recompute<What>: What must be pmt::Full (whole blocks) or pmt::Selective (the attention core)");
  static_assert(Stages >= 0,
                "pmt::Recompute<What, Stages>: Stages (the first stages that recompute; 0: all) must be >= 0");
  using what                  = What;
  static constexpr int stages = Stages;
  /// \brief Whether pipeline stage `stage` recomputes.
  static constexpr bool on(int stage) noexcept { return Stages == 0 || stage < Stages; }
};

}  // namespace pmt
