// SPDX-License-Identifier: Apache-2.0
#pragma once
// The step context: everything a layer may ask about the step it runs in, in one object.
//   mode       train or eval (eval: Dropout is the identity)
//   grad       whether layers keep what their backward needs (false under NoGrad and in the
//              first forward of activation recomputation, KeepNothing)
//   random     the keys of layout-independent random draws: the global step and the global
//              index of the current microbatch's first row (Dropout's masks), and whether
//              anything set them (a training forward outside a Trainer step has no keys)
//   precision  the precision of float products (fp32, or bf16 operands with fp32 sums)
//   slot       the activation slot a layer saves into and reads from (one per microbatch in
//              flight on a pipeline stage)
//   progress   what pmt::progress() polls between blocks (the pipeline's pending messages)
// Layers read it through pmt::step_context() and nothing else. The Trainer opens one StepScope
// per step() and evaluate() with the mode, the step and the precision; the Trainer and the
// pipeline runner narrow it per microbatch (ActivationSlot, RandomRowScope), the staged model per
// chunk (KeepNothing, RandomScope to replay a recomputed forward), and comm::ProgressScope
// installs the poll. A program that runs layers without a Trainer opens a RandomScope itself. Each scope changes its
// fields of the calling thread's context for its lifetime and restores them on exit, so scopes nest. Outside any scope
// the context is the default: train mode, gradients kept, no random keys, fp32, slot 0, no poll. The context is per
// thread (a thread_local): it is the only thread-local that carries step state in pmt. The others are caches (a cuBLAS
// handle, bf16 scratch), the ErrorContext tags of error messages and the communication time counters (comm/stats.hpp):
// no layer reads them to decide what it computes.

#include <cstddef>
#include <cstdint>
#include <functional>

namespace pmt {

/// \brief The precision of float products: fp32, or bf16 mixed precision (each operand of a
/// product rounded to bf16, the sums in fp32; core/precision.hpp).
enum class Precision { fp32, bf16 };

/// \brief Whether a forward trains (Dropout drops) or evaluates (Dropout is the identity).
enum class StepMode { train, eval };

/// \brief What keys a random draw that must not depend on the layout (Dropout): the global
/// step and the global index of the current microbatch's first row. The Trainer sets both for
/// each step() and microbatch (`keyed`); outside any RandomScope nothing is set, and a layer
/// that draws refuses to guess.
struct RandomContext {
  std::uint64_t step = 0;
  std::uint64_t row0 = 0;
  bool keyed         = false;  ///< whether a Trainer step or a RandomScope set the keys
};

/// \brief The step a layer runs in (see the file comment).
struct StepContext {
  StepMode mode = StepMode::train;
  bool grad     = true;  ///< layers keep what their backward needs
  RandomContext random;  ///< keys of layout-independent draws
  Precision precision                   = Precision::fp32;
  std::size_t slot                      = 0;        ///< the activation slot in use
  const std::function<void()>* progress = nullptr;  ///< what pmt::progress() polls; none: nullptr
};

namespace detail {
inline thread_local StepContext step_context;
}  // namespace detail

/// \brief The calling thread's step context: the one accessor layers read.
inline const StepContext& step_context() noexcept { return detail::step_context; }

/// \brief Sets the whole step context of this thread for the scope's lifetime (the Trainer's one
/// scope per step and evaluation); restores the previous one on exit.
class StepScope {
 public:
  explicit StepScope(const StepContext& context) noexcept : m_previous(detail::step_context) {
    detail::step_context = context;
  }
  ~StepScope() { detail::step_context = m_previous; }
  StepScope(const StepScope&)            = delete;
  StepScope& operator=(const StepScope&) = delete;

 private:
  StepContext m_previous;
};

namespace detail {

/// A scope that sets one field of this thread's step context and restores it on exit.
template <class V, V StepContext::*Field>
class FieldScope {
 public:
  explicit FieldScope(V value) noexcept : m_previous(detail::step_context.*Field) {
    detail::step_context.*Field = value;
  }
  ~FieldScope() { detail::step_context.*Field = m_previous; }
  FieldScope(const FieldScope&)            = delete;
  FieldScope& operator=(const FieldScope&) = delete;

 private:
  V m_previous;
};

}  // namespace detail

/// \brief Selects the activation slot of this thread for the scope's lifetime (restores the
/// previous one on exit, so scopes nest).
class ActivationSlot : detail::FieldScope<std::size_t, &StepContext::slot> {
 public:
  explicit ActivationSlot(std::size_t slot) noexcept : FieldScope(slot) {}
  /// \brief The slot in use on this thread.
  static std::size_t current() noexcept { return step_context().slot; }
};

/// \brief Sets the precision of float products on this thread for its lifetime (they nest).
class PrecisionScope : detail::FieldScope<Precision, &StepContext::precision> {
 public:
  explicit PrecisionScope(Precision p) noexcept : FieldScope(p) {}
};

/// \brief Evaluation for the scope's lifetime on this thread: eval mode (Dropout is the
/// identity) and no gradients (layers save nothing); restores both on exit, so scopes nest.
class NoGrad {
 public:
  NoGrad() noexcept : m_mode(StepMode::eval), m_grad(false) {}

 private:
  detail::FieldScope<StepMode, &StepContext::mode> m_mode;
  detail::FieldScope<bool, &StepContext::grad> m_grad;
};

/// \brief A training forward that keeps nothing for a backward (the first forward of activation
/// recomputation): layers compute as in training, Dropout included, but save nothing.
class KeepNothing : detail::FieldScope<bool, &StepContext::grad> {
 public:
  KeepNothing() noexcept : FieldScope(false) {}
};

/// \brief Sets this thread's random keys for the scope's lifetime (restores the previous ones on
/// exit): what a Trainer step does, for a program that runs layers by hand. `step` is the global
/// step, `row0` the global index of the batch's first row in the step's global batch; every
/// layout that gives each row the same global index draws the same random numbers.
class RandomScope : detail::FieldScope<RandomContext, &StepContext::random> {
 public:
  RandomScope(std::uint64_t step, std::uint64_t row0) noexcept : FieldScope(RandomContext{step, row0, true}) {}
  /// \brief Restores saved keys (a recomputed forward replays its first forward's).
  explicit RandomScope(const RandomContext& keys) noexcept : FieldScope(keys) {}
};

/// \brief Sets this thread's first global row (keeps the step) for the scope's lifetime: the
/// Trainer and the pipeline runner, per microbatch.
class RandomRowScope : detail::FieldScope<RandomContext, &StepContext::random> {
 public:
  explicit RandomRowScope(std::uint64_t row0) noexcept : FieldScope(with_row(row0)) {}

 private:
  static RandomContext with_row(std::uint64_t row0) noexcept {
    RandomContext keys = detail::step_context.random;
    keys.row0          = row0;
    return keys;
  }
};

/// \brief Whether layers save activations for a backward on this thread (false inside NoGrad
/// and KeepNothing): step_context().grad.
inline bool grad_enabled() noexcept { return step_context().grad; }
/// \brief Whether this thread evaluates (inside NoGrad): step_context().mode == StepMode::eval.
inline bool evaluating() noexcept { return step_context().mode == StepMode::eval; }
/// \brief The random keys of this thread's step: step_context().random.
inline RandomContext random_context() noexcept { return step_context().random; }
/// \brief The precision of float products on this thread now: step_context().precision.
inline Precision compute_precision() noexcept { return step_context().precision; }

/// \brief A progress point: runs the poll of the innermost comm::ProgressScope of this thread,
/// if any (core/progress.hpp).
inline void progress() {
  if (const auto* poll = step_context().progress) (*poll)();
}

}  // namespace pmt
