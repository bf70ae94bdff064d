// SPDX-License-Identifier: Apache-2.0
#pragma once
// Saved activations per microbatch slot. A layer keeps what its backward needs (its input, the
// LayerNorm statistics, the attention probabilities) in a Saved<Cache>: one Cache per activation
// slot. The slot in use is chosen for the calling thread by an ActivationSlot scope; outside any
// scope it is slot 0, so a layer used on its own behaves as if it had a single cache. A pipeline
// stage with several microbatches in flight (GPipe: all m; 1F1B: up to the number of stages)
// runs each microbatch's forward and backward in its own slot and hands slots back when the
// backward is done, so the number of slots ever used is the stage's peak of live activations.
//   { pmt::nn::ActivationSlot s(k); y = layer.forward(exec, x); }   // saves into slot k
//   { pmt::nn::ActivationSlot s(k); dx = layer.backward(exec, dy); } // reads slot k

#include <cstddef>
#include <vector>

namespace pmt::detail {
inline thread_local std::size_t active_slot = 0;
}  // namespace pmt::detail

namespace pmt::nn {

/// \brief Selects the activation slot of this thread for the scope's lifetime (restores the
/// previous one on exit, so scopes nest).
class ActivationSlot {
 public:
  explicit ActivationSlot(std::size_t slot) noexcept : m_previous(pmt::detail::active_slot) { pmt::detail::active_slot = slot; }
  ~ActivationSlot() { pmt::detail::active_slot = m_previous; }
  ActivationSlot(const ActivationSlot&)            = delete;
  ActivationSlot& operator=(const ActivationSlot&) = delete;
  /// \brief The slot in use on this thread.
  static std::size_t current() noexcept { return pmt::detail::active_slot; }

 private:
  std::size_t m_previous;
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
  /// \brief Drops what slot k holds (its Views are released).
  void release(std::size_t k) {
    if (k < m_slots.size()) m_slots[k] = Cache{};
  }
  /// \brief How many slots have been used.
  std::size_t slots() const noexcept { return m_slots.size(); }

 private:
  std::vector<Cache> m_slots;
};

}  // namespace pmt::nn
