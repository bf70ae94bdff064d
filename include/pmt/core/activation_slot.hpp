// SPDX-License-Identifier: Apache-2.0
#pragma once
// Saved activations per microbatch slot (the slot, NoGrad and KeepNothing are fields and scopes of
// the step context, core/step_context.hpp). A layer keeps what its backward needs (its input, the
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

#include "pmt/core/step_context.hpp"

#include <cstddef>
#include <vector>

namespace pmt {

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
