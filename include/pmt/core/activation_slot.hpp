// SPDX-License-Identifier: Apache-2.0
#pragma once
// Saved activations per microbatch slot. A layer keeps what its backward needs (its input, the
// LayerNorm statistics, the attention probabilities) in a Saved<Cache>: one Cache per activation
// slot. The slot in use is chosen for the calling thread by an ActivationSlot scope; outside any
// scope it is slot 0, so a layer used on its own behaves as if it had a single cache. A pipeline
// stage with several microbatches in flight (GPipe: all m; 1F1B: up to the number of stages)
// runs each microbatch's forward and backward in its own slot. A backward takes (moves out) what
// its forward saved, so the memory of a microbatch's activations is freed by its backward and a
// stage holds exactly its live microbatches' activations.
//   { pmt::ActivationSlot s(k); y = layer.forward(exec, x); }   // saves into slot k
//   { pmt::ActivationSlot s(k); dx = layer.backward(exec, dy); } // reads slot k
// Evaluation: inside a pmt::NoGrad scope (per thread, nestable) grad_enabled() is false and the
// layers save nothing for a backward (as torch.no_grad()): a forward then holds no activations
// beyond its output, and Dropout passes its input through. KeepNothing only stops the saving
// (the first forward of activation recomputation: Dropout still drops).
//   { pmt::NoGrad eval; auto y = model.predict(exec, x); }

#include <cstddef>
#include <vector>

namespace pmt::detail {
inline thread_local std::size_t active_slot = 0;
inline thread_local bool no_grad            = false;  // layers keep nothing for a backward
inline thread_local bool evaluating         = false;  // Dropout is the identity
}  // namespace pmt::detail

namespace pmt {

/// \brief Selects the activation slot of this thread for the scope's lifetime (restores the
/// previous one on exit, so scopes nest).
class ActivationSlot {
 public:
  explicit ActivationSlot(std::size_t slot) noexcept : m_previous(pmt::detail::active_slot) {
    pmt::detail::active_slot = slot;
  }
  ~ActivationSlot() { pmt::detail::active_slot = m_previous; }
  ActivationSlot(const ActivationSlot&)            = delete;
  ActivationSlot& operator=(const ActivationSlot&) = delete;
  /// \brief The slot in use on this thread.
  static std::size_t current() noexcept { return pmt::detail::active_slot; }

 private:
  std::size_t m_previous;
};

/// \brief Whether layers save activations for a backward on this thread (false inside NoGrad
/// and KeepNothing).
inline bool grad_enabled() noexcept { return !pmt::detail::no_grad; }
/// \brief Whether this thread is in evaluation mode (inside NoGrad): Dropout passes its input.
inline bool evaluating() noexcept { return pmt::detail::evaluating; }

/// \brief Evaluation mode for the scope's lifetime on this thread: layers save nothing and
/// Dropout is the identity (restores the previous mode on exit, so scopes nest).
class NoGrad {
 public:
  NoGrad() noexcept : m_grad(pmt::detail::no_grad), m_eval(pmt::detail::evaluating) {
    pmt::detail::no_grad = pmt::detail::evaluating = true;
  }
  ~NoGrad() { pmt::detail::no_grad = m_grad, pmt::detail::evaluating = m_eval; }
  NoGrad(const NoGrad&)            = delete;
  NoGrad& operator=(const NoGrad&) = delete;

 private:
  bool m_grad, m_eval;
};

/// \brief A training forward that keeps nothing for a backward (the first forward of activation
/// recomputation): layers compute as in training, Dropout included, but save nothing.
class KeepNothing {
 public:
  KeepNothing() noexcept : m_grad(pmt::detail::no_grad) { pmt::detail::no_grad = true; }
  ~KeepNothing() { pmt::detail::no_grad = m_grad; }
  KeepNothing(const KeepNothing&)            = delete;
  KeepNothing& operator=(const KeepNothing&) = delete;

 private:
  bool m_grad;
};

/// \brief One Cache per activation slot; `*saved` and `saved->` reach the current slot's.
template <class Cache>
class Saved {
 public:
  Cache& operator*() {
    const std::size_t k = ActivationSlot::current();
    if (m_slots.size() <= k) m_slots.resize(k + 1);
    return m_slots[k];
  }
  Cache* operator->() { return &**this; }
  /// \brief Moves the current slot's Cache out, leaving the slot empty: a backward consumes
  /// what its forward saved, so a microbatch's activations are freed as soon as its backward ran.
  Cache take() {
    Cache c = std::move(**this);
    **this  = Cache{};
    return c;
  }
  /// \brief How many slots have been used.
  std::size_t slots() const noexcept { return m_slots.size(); }

 private:
  std::vector<Cache> m_slots;
};

}  // namespace pmt
