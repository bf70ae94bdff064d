// SPDX-License-Identifier: Apache-2.0
#pragma once
// StaleSync: data-parallel gradient sums applied S steps after they start (bounded staleness).
// Step t's gradients (computed on the parameters every replica shares) start their dp sum with a
// non-blocking all-reduce; the update step t applies is the sum that started at step t - S, which
// has had S steps of compute to complete in (the model's backward hook polls it). So every
// replica applies the same sums, the replicas stay equal, and an applied gradient is exactly S
// steps old, never older: steps 0 ... S - 1 apply nothing (no sum has arrived yet), and S = 0 is
// synchronous data parallelism. Sums are SUMS over dp, as GradSync's (pmt normalises by the global
// token count).
// Memory: S + 1 flat buffers of all of this rank's gradients. Checkpoints: states() completes the
// sums in flight and shows them as "stale_grad_0" (the oldest) ... "stale_grad_{S-1}"; a run
// resumed at step t takes back the min(t, S) of them that started at steps t - S ... t - 1.
// Communication: one iall_reduce(dp, sum) of all gradients per step.

#include "pmt/comm/collectives.hpp"
#include "pmt/comm/communicator.hpp"
#include "pmt/comm/request.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/instrument.hpp"
#include "pmt/core/parameter.hpp"
#include "pmt/core/tensor.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

namespace pmt::parallel {

/// \brief Gradient sums applied S steps after they start (see the file comment).
/// \throws pmt::ConfigError for a bound S < 0.
template <class T, class Exec, class Backend>
class StaleSync {
 public:
  StaleSync(const comm::Communicator<Backend>& dp, std::vector<Parameter<T, Exec>*> params, int bound)
      : m_dp(dp), m_params(std::move(params)), m_bound(bound) {
    pmt::detail::require<ConfigError>(bound >= 0, "pmt::parallel::StaleSync", [&] {
      return pmt::detail::str("the staleness bound is ", bound, "; expected S >= 0 steps");
    });
    std::size_t n = 0;
    for (auto* p : m_params) m_offset.push_back(n), n += p->size();
    for (int s = 0; s <= bound; ++s) m_slots.emplace_back("pmt::parallel::StaleSync::sum", n);
    m_state_slot.resize(static_cast<std::size_t>(bound));
    for (int k = 0; k < bound; ++k) m_state_slot[static_cast<std::size_t>(k)] = k;
  }

  /// \brief Starts the dp sum of step `step`'s gradients (the parameters' grad, this rank's), then
  /// writes the sum that started at step - S into the gradients (waiting for it) and returns true;
  /// returns false, gradients untouched, while step < S (nothing has arrived yet).
  bool exchange(const Exec& exec, std::int64_t step) {
    if (m_loaded) restore(step);
    const int slot = free_slot();
    pack(exec, slot);
    Entry e{slot, step, {}};
    if (m_dp.size() > 1) {
      e.request = comm::iall_reduce(m_dp, exec, m_slots[static_cast<std::size_t>(slot)], comm::ReduceOp::Sum);
      m_bytes += m_slots[static_cast<std::size_t>(slot)].size() * sizeof(T);
    }
    m_pending.push_back(std::move(e));
    if (m_pending.size() <= static_cast<std::size_t>(m_bound)) {
      m_last_staleness = -1;
      return false;
    }
    Entry& oldest = m_pending.front();
    {
      const Instrument instrument("pmt::parallel::StaleSync::wait", Track::Collective, "dp stale gradient sum");
      oldest.request.wait();
    }
    unpack(exec, oldest.slot);
    m_last_staleness = step - oldest.step;
    m_pending.pop_front();
    return true;
  }

  /// \brief Polls the sums in flight once (MPI moves a non-blocking all-reduce on only inside MPI
  /// calls; the Trainer calls this from the model's backward hook).
  void progress() {
    for (auto& e : m_pending)
      if (!e.request.done()) e.request.test();
  }

  int bound() const noexcept { return m_bound; }
  /// \brief How many steps old the last applied sum was (S once updates flow; -1: none applied).
  std::int64_t last_staleness() const noexcept { return m_last_staleness; }
  /// \brief Sums in flight or waiting to be applied (at most S after exchange()).
  std::size_t pending() const noexcept { return m_pending.size(); }
  /// \brief Bytes this rank has handed to the dp all-reduces.
  std::uint64_t bytes_sent() const noexcept { return m_bytes; }

  /// \brief The sums not yet applied, as checkpoint states "stale_grad_k" (k = 0 the oldest of
  /// S; the pending ones fill the last places). Completes the sums in flight first (collective
  /// over dp). `loaded` is set when a checkpoint was loaded into them.
  std::vector<typename ParameterStates<T, Exec>::State> states() {
    for (auto& e : m_pending) e.request.wait();
    // the pending sums in the last places, free slots before them
    std::vector<int> used;
    for (const auto& e : m_pending) used.push_back(e.slot);
    std::vector<int> order;
    for (int s = 0; s <= m_bound && static_cast<int>(order.size()) + static_cast<int>(used.size()) < m_bound; ++s)
      if (std::find(used.begin(), used.end(), s) == used.end()) order.push_back(s);
    order.insert(order.end(), used.begin(), used.end());
    m_state_slot = order;
    std::vector<typename ParameterStates<T, Exec>::State> out;
    for (int k = 0; k < m_bound; ++k) {
      typename ParameterStates<T, Exec>::State st{"stale_grad_" + std::to_string(k), {}, false};
      for (std::size_t i = 0; i < m_params.size(); ++i)
        st.of.push_back(part(m_state_slot[static_cast<std::size_t>(k)], i));
      out.push_back(std::move(st));
    }
    return out;
  }
  bool* loaded_flag() noexcept { return &m_loaded; }

 private:
  struct Entry {
    int slot;
    std::int64_t step;
    comm::Request request;
  };
  /// After a checkpoint load: the sums of steps step - S ... step - 1 that exist, as states() laid
  /// them out, complete.
  void restore(std::int64_t step) {
    m_loaded = false;
    m_pending.clear();
    const std::int64_t count = std::min<std::int64_t>(step, m_bound);
    for (std::int64_t k = m_bound - count; k < m_bound; ++k)
      m_pending.push_back(Entry{m_state_slot[static_cast<std::size_t>(k)], step - m_bound + k, {}});
  }
  int free_slot() const {
    for (int s = 0; s <= m_bound; ++s) {
      bool used = false;
      for (const auto& e : m_pending) used = used || e.slot == s;
      if (!used) return s;
    }
    return 0;  // unreachable: at most S of S + 1 slots are pending here
  }
  /// Parameter i's part of a slot.
  Tensor<T, 1, Exec> part(int slot, std::size_t i) const {
    return Kokkos::subview(m_slots[static_cast<std::size_t>(slot)],
                           std::make_pair(m_offset[i], m_offset[i] + m_params[i]->size()));
  }
  void pack(const Exec& exec, int slot) {
    for (std::size_t i = 0; i < m_params.size(); ++i) Kokkos::deep_copy(exec, part(slot, i), m_params[i]->grad);
  }
  void unpack(const Exec& exec, int slot) {
    for (std::size_t i = 0; i < m_params.size(); ++i) Kokkos::deep_copy(exec, m_params[i]->grad, part(slot, i));
  }

  comm::Communicator<Backend> m_dp;
  std::vector<Parameter<T, Exec>*> m_params;
  int m_bound;
  std::vector<std::size_t> m_offset;
  std::vector<Tensor<T, 1, Exec>> m_slots;
  std::deque<Entry> m_pending;
  std::vector<int> m_state_slot;  // states()'s k -> slot
  bool m_loaded                 = false;
  std::int64_t m_last_staleness = -1;
  std::uint64_t m_bytes         = 0;
};

}  // namespace pmt::parallel
