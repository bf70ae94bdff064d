// SPDX-License-Identifier: Apache-2.0
#pragma once
// Zero3AdamW: AdamW with the parameters themselves sharded over the dp axis (ZeRO stage 3, as
// FSDP): each rank keeps 1/S of every parameter's values, of its gradient and of Adam's moments,
// where S is the shard group: the whole dp group, or groups of `shard_size` consecutive dp ranks
// with the groups replicating each other (hybrid sharding, HSDP: the gathers stay inside a group).
// Every parameter is cut by rows into S parts of ceil(rows / S) rows (its local shape's first
// extent; the last parts padded); this rank's parts, one after the other, are its shard (about
// P / S values). A part is a rectangle of the parameter, so a checkpoint saves each rank's parts
// as records of their own (io::save_checkpoint): nothing is gathered to save. Parameter::dp_sharded is set, and value
// and grad are empty except while a layer uses them:
//   - values_needed(params), which the model calls before a layer reads its values (each block's
//     forward and backward, the embeddings, the final norm, the LM head): their values are
//     all-gathered over the shard group into Workspace buffers and the parameters' `value` views
//     point there; values_done(params) after the layer: the views are dropped and the buffers
//     return to the Workspace, unless one of the next `prefetch` units needs them again (the last
//     block's values between its forward and its backward).
//   - Prefetch: the first step records the order in which the model names its units (the parameter
//     lists it passes); from the second step on, naming the unit at position i of that order starts
//     the non-blocking all-gathers of units i + 1 .. i + prefetch, so a block's gather runs while
//     the block before it computes; at most `prefetch` units are gathered ahead. prefetch = 0
//     gathers each unit when it is named (the same values, no overlap).
//   - Gradients: grads_needed(params) gives them zeroed Workspace buffers; grads_ready(params)
//     starts each one's reduce-scatter over the shard group and drops it (the reduce-scatters of
//     the last max_in_flight calls stay in flight while the next unit's backward runs; their
//     parts are summed into the gradient shard in the order started).
//     With HSDP the gradient shard is then summed over the replica groups (one all-reduce).
// At the step: the tied parameters' gradient shards are summed with the peer stage's over pp, the
// sequence-parallel partial gradients over tp, the norm is taken over the shards, and AdamW
// updates the value shard; no all-gather follows (the next forward gathers what it reads).
// Memory: 4 P / S (value, gradient, m, v of the shard), and the units gathered (prefetch + 1 units
// of values; in backward the gradients of the unit written and of the one reduce-scattered),
// instead of plain AdamW's 4 P.
// Communication per microbatch: one all-gather per parameter in forward and (unless kept) in
// backward, one reduce-scatter per parameter; per step the norm's all-reduces and, with HSDP,
// one all-reduce of the gradient shard over the replicas.
// Traced (obs/trace.hpp), each unit's gather is a span on the collectives track ("zero3 gather
// <its first parameter>", from its first gather's start to the last one's completion) and each
// use a span on the compute track ("zero3 uses ..."): a prefetched gather overlaps the use before.
// Outside a Trainer step nothing is gathered: gather_all() makes every value whole (collective
// over the shard group; a comparison, inference by every dp rank) until
// release_all().

#include "pmt/comm/collectives.hpp"
#include "pmt/comm/communicator.hpp"
#include "pmt/comm/request.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/instrument.hpp"
#include "pmt/core/parameter.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/core/workspace.hpp"
#include "pmt/ops/elementwise.hpp"
#include "pmt/ops/reduction.hpp"
#include "pmt/ops/update.hpp"
#include "pmt/optim/optimizers.hpp"
#include "pmt/optim/zero.hpp"
#include "pmt/parallel/stage_module.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace pmt::optim {

/// \brief Whether optimizer O shards the parameters themselves (ZeRO-3: the Trainer routes the
/// model's value and gradient hooks to it).
template <class O, class = void>
struct shards_params : std::false_type {};
template <class O>
struct shards_params<O, std::void_t<decltype(O::shards_params)>> : std::bool_constant<O::shards_params> {};
template <class O>
inline constexpr bool shards_params_v = shards_params<O>::value;

/// \brief Zero3AdamW's settings beyond AdamW's.
struct Zero3Options {
  /// Units (the parameter lists the model names together: a block, the embeddings, ...) whose
  /// values are gathered ahead of their use; 0: each when named.
  std::size_t prefetch = 1;
  /// Dp ranks a parameter is sharded over (HSDP): 0 or the dp size shards over all of dp; a
  /// divisor of it shards inside groups of that many consecutive dp ranks and replicates across.
  int shard_size = 0;
};

/// \brief AdamW with parameters, gradients and state sharded over dp (ZeRO-3, see the file comment).
/// \throws pmt::ConfigError for a shard_size that does not divide dp, a tied parameter that is not
/// among `params`, or tied parameters without a pp communicator.
template <class T, class Exec, class Backend>
class Zero3AdamW {
 public:
  static constexpr bool shards_over_dp = true;
  static constexpr bool shards_params  = true;
  /// Units (the parameter lists named together to grads_ready) whose gradient reduce-scatters
  /// stay in flight while backward goes on, the last one included; an older one is completed
  /// first.
  static constexpr std::size_t max_in_flight = 1;

  /// \param pp the pipeline communicator when the model is split into stages.
  /// \param tied the model's tied_parameters() (a tied LM head: summed with the peer stage's copy).
  /// The parameters' values must be the same on every dp rank (a seeded initialisation); each
  /// rank keeps its part and the parameters' own storage is freed.
  Zero3AdamW(std::vector<Parameter<T, Exec>*> params, AdamWOptions hyper, const comm::Communicator<Backend>& dp,
             const comm::Communicator<Backend>& tp, std::optional<comm::Communicator<Backend>> pp = std::nullopt,
             std::vector<parallel::TiedParameter<T, Exec>> tied = {}, Zero3Options options = {},
             const Exec& exec = Exec())
      : m_params(std::move(params)),
        m_h(hyper),
        m_options(options),
        m_shard_comm(shard_group(dp, options.shard_size)),
        m_replicas(dp.split(dp.rank() % group_size(dp, options.shard_size), dp.rank())),
        m_tp(tp),
        m_pp(std::move(pp)),
        m_tied(std::move(tied)) {
    constexpr const char* op = "pmt::optim::Zero3AdamW";
    const auto peer_of       = detail::tied_peers(m_params, m_tied, m_pp, op);
    layout(exec, peer_of);
  }
  Zero3AdamW(const Zero3AdamW&)            = delete;  // parameters' views point into its buffers
  Zero3AdamW& operator=(const Zero3AdamW&) = delete;
  ~Zero3AdamW() {
    for (auto& f : m_flights) f.request.wait();
    for (auto& s : m_slots) s.gather.wait();
  }

  /// \brief Clears the gradient shard and drops every gradient buffer.
  void zero_grad(const Exec& exec = Exec()) {
    drain(exec, /*keep=*/false);
    for (auto& s : m_slots) drop_grad(s);
    Kokkos::deep_copy(exec, m_g, T(0));
    m_finished = false;
  }

  /// \brief A training step begins: the order of the units named in it is recorded, and the
  /// previous step's order steers the prefetch.
  void begin_step() {
    if (!m_trace.empty()) m_order = std::move(m_trace);
    m_trace.clear();
    m_cursor    = 0;
    m_recording = true;
  }
  /// \brief Evaluation (or use outside a step): nothing is prefetched or recorded.
  void begin_eval() { m_recording = false, m_order_on = false; }
  /// \brief After evaluation: the gathered values are dropped.
  void end_eval(const Exec& exec = Exec()) {
    release_values(exec);
    m_order_on = true;
  }

  /// \brief The model reads the values of `params` next: they are gathered (waiting for a
  /// prefetched gather), and the gathers of the next units start.
  void values_needed(const Exec& exec, const std::vector<Parameter<T, Exec>*>& params) {
    const std::size_t unit = unit_of(params);
    for (std::size_t i : m_units[unit]) start_gather(exec, m_slots[i], /*ahead=*/false, unit);
    for (std::size_t i : m_units[unit]) {
      Slot& s = m_slots[i];
      finish_gather(s);
      ++s.uses;
    }
    if (m_recording) m_trace.push_back(unit);
    advance(unit);
    if (m_order_on && m_options.prefetch > 0)
      for (std::size_t k = m_cursor; k < m_order.size() && k < m_cursor + m_options.prefetch; ++k)
        for (std::size_t i : m_units[m_order[k]]) start_gather(exec, m_slots[i], /*ahead=*/true, m_order[k]);
    if (TraceRecorder::instance().enabled()) m_uses.push_back({unit, TraceRecorder::now()});
  }
  /// \brief Polls the gathers and reduce-scatters in flight once (an MPI without a progress thread
  /// moves a non-blocking collective only inside its calls; the Trainer polls at the model's
  /// progress points, so a prefetched gather moves while a block computes).
  void poll() {
    for (std::size_t k = m_in_flight.size(); k-- > 0;)  // completed() takes entry k out, no copy
      if (m_slots[m_in_flight[k]].gather.test()) completed(m_slots[m_in_flight[k]]);
    for (auto& f : m_flights) f.request.test();
  }
  /// \brief The model no longer reads the values of `params`: their buffers are dropped unless
  /// one of the next `prefetch` units reads them.
  void values_done(const std::vector<Parameter<T, Exec>*>& params) {
    if (TraceRecorder::instance().enabled() && !m_uses.empty()) {  // the unit's use: a span on the compute track
      const std::size_t unit = unit_of(params);
      for (std::size_t k = m_uses.size(); k-- > 0;)
        if (m_uses[k].first == unit) {
          TraceRecorder::instance().record(TraceEvent{"zero3 uses " + m_slots[m_units[unit].front()].p->name,
                                                      Track::Compute, m_uses[k].second, TraceRecorder::now()});
          m_uses.erase(m_uses.begin() + static_cast<std::ptrdiff_t>(k));
          break;
        }
    }
    for (auto* p : params) {
      const auto it = m_slot_of.find(p);
      if (it == m_slot_of.end()) continue;
      Slot& s = m_slots[it->second];
      if (s.uses > 0) --s.uses;
      if (s.uses == 0 && !m_whole && !needed_soon(it->second)) drop_value(s);
    }
  }

  /// \brief The model writes the gradients of `params` next: they get zeroed buffers.
  void grads_needed(const Exec& exec, const std::vector<Parameter<T, Exec>*>& params) {
    for (auto* p : params) {
      const auto it = m_slot_of.find(p);
      if (it == m_slot_of.end()) continue;
      Slot& s = m_slots[it->second];
      if (s.grad_full.data() != nullptr) continue;
      s.grad_full = workspace_view<Tensor<T, 1, Exec>>("pmt::optim::Zero3AdamW::grad", s.padded());
      Kokkos::deep_copy(exec, s.grad_full, T(0));
      p->grad = Kokkos::subview(s.grad_full, std::make_pair(std::size_t(0), s.n));
      m_held_grads += s.padded();
      note_peak();
    }
  }
  /// \brief The gradients of `params` are final for this microbatch: their reduce-scatters start.
  void grads_ready(const Exec& exec, const std::vector<Parameter<T, Exec>*>& params) {
    ++m_group;
    for (auto* p : params) {
      const auto it = m_slot_of.find(p);
      if (it != m_slot_of.end() && m_slots[it->second].grad_full.data() != nullptr) flush(exec, it->second);
    }
    drain(exec, /*keep=*/true, /*block=*/false);
  }

  /// \brief Reduce-scatters the gradients still held, completes all in flight and the shard's
  /// sums (over the replica groups, tied parameters over pp, partial ones over tp). step() calls
  /// it when it has not run since zero_grad(). Collective over dp, and pp and tp when needed.
  void finish_grads(const Exec& exec) {
    if (m_finished) return;
    const Instrument instrument("pmt::optim::Zero3AdamW::finish_grads", Track::Collective, "zero3 gradients");
    for (std::size_t i = 0; i < m_slots.size(); ++i)
      if (m_slots[i].grad_full.data() != nullptr) flush(exec, i);
    drain(exec, /*keep=*/true);
    if (m_replicas.size() > 1) comm::all_reduce(m_replicas, exec, m_g, comm::ReduceOp::Sum);
    for (const auto& s : m_slots)
      if (s.peer >= 0)
        detail::add_peer_shard(exec, *m_pp, Kokkos::subview(m_g, std::make_pair(s.at, s.at + s.shard)), s.peer,
                               "pmt::optim::Zero3AdamW::peer");
    detail::sum_runs_over_tp(exec, m_tp, m_g, m_partial, m_partial_count, "pmt::optim::Zero3AdamW::partial");
    m_finished = true;
  }

  /// \brief finish_grads(), drops the gathered values (the update changes them), clips by the
  /// global norm (max_norm <= 0: no clipping) and runs AdamW on this rank's shard. Returns the
  /// norm before clipping; no update when `skip`, or when `skip_nonfinite` and the norm is nan or
  /// inf (all ranks alike).
  double step(const Exec& exec, double lr, double max_norm, bool skip_nonfinite = false, bool skip = false) {
    const Instrument instrument("pmt::optim::Zero3AdamW::step", Track::Optimizer, "zero3-adamw");
    finish_grads(exec);
    m_finished  = false;
    m_recording = false;  // the step's order is complete
    release_values(exec);
    const double norm = grad_norm(exec);
    if (skip || (skip_nonfinite && !std::isfinite(norm))) return norm;
    ++m_step;
    if (max_norm > 0 && norm > max_norm) ops::scale(exec, m_g, static_cast<T>(max_norm / (norm + 1e-6)));
    ops::adamw_update(exec, m_w, m_g, m_m, m_v, m_h.at(lr, m_step));
    return norm;
  }

  /// \brief Gathers every parameter's values (collective over the shard group) and keeps them
  /// until release_all() (or the next step()): for a comparison, inference by every dp rank
  /// (checkpoints need no gather: shard_parts()).
  void gather_all(const Exec& exec = Exec()) {
    for (auto& s : m_slots) start_gather(exec, s, /*ahead=*/false, no_unit);
    for (auto& s : m_slots) finish_gather(s);
    m_whole = true;
  }
  /// \brief Drops the values gather_all() kept.
  void release_all(const Exec& exec = Exec()) { release_values(exec); }
  /// \brief This rank's part of a parameter: rows [first_row, first_row + rows) of its local
  /// shape (columns: all), and views of the part's values and moments in the shard.
  struct ShardPart {
    const Parameter<T, Exec>* param;
    std::size_t first_row, rows;
    Tensor<T, 1, Exec> value, m, v;
  };
  /// \brief This rank's parts of the parameters that have rows here, in parameters() order (what
  /// a checkpoint writes and loads into; after loading, call loaded()).
  std::vector<ShardPart> shard_parts() const {
    std::vector<ShardPart> out;
    for (const auto& s : m_slots) {
      const auto [lo, len] = part(s);
      if (len == 0) continue;
      const auto range = std::make_pair(s.at, s.at + len);
      out.push_back({s.p, lo / s.cols, len / s.cols, Kokkos::subview(m_w, range), Kokkos::subview(m_m, range),
                     Kokkos::subview(m_v, range)});
    }
    return out;
  }
  /// \brief The shard was written from outside (a checkpoint loaded into shard_parts()): values
  /// gathered before are dropped.
  void loaded(const Exec& exec = Exec()) { release_values(exec); }

  const std::vector<Parameter<T, Exec>*>& parameters() const noexcept { return m_params; }
  const std::vector<parallel::TiedParameter<T, Exec>>& tied_parameters() const noexcept { return m_tied; }
  const Zero3Options& options() const noexcept { return m_options; }
  /// \brief The shard group (the dp ranks a parameter is cut over) and the replica group.
  const comm::Communicator<Backend>& shard_comm() const noexcept { return m_shard_comm; }
  const comm::Communicator<Backend>& replica_comm() const noexcept { return m_replicas; }
  /// \brief Values of the shard this rank keeps (of values, gradients and each moment).
  std::size_t shard_size() const noexcept { return m_w.size(); }
  /// \brief Bytes this rank keeps between steps: the value, gradient and moment shards.
  std::size_t state_bytes() const noexcept { return 4 * m_w.size() * sizeof(T); }
  /// \brief The most bytes of gathered values and gradient buffers this rank held at once.
  std::size_t peak_gathered_bytes() const noexcept { return m_peak * sizeof(T); }
  /// \brief Units named so far (distinct parameter lists) and the recorded order's length.
  std::size_t units() const noexcept { return m_units.size(); }
  std::size_t order_length() const noexcept { return m_order.size(); }
  /// \brief Uses of a parameter's values served by a gather started ahead (prefetch), and all
  /// gathers started.
  std::uint64_t prefetched() const noexcept { return m_prefetched; }
  std::uint64_t gathers() const noexcept { return m_gathers; }
  /// \brief Seconds a use of values waited for their gather so far (what prefetch did not hide).
  double gather_wait_seconds() const noexcept { return m_gather_wait; }
  /// \brief Bytes this rank has handed to the gradients' reduce-scatters and the values' gathers.
  std::uint64_t bytes_sent() const noexcept { return m_bytes; }
  std::int64_t steps() const noexcept { return m_step; }
  void set_steps(std::int64_t n) noexcept { m_step = n; }

 private:
  struct Slot {
    Parameter<T, Exec>* p = nullptr;
    std::size_t n = 0, shard = 0;  // the parameter's length, its part per shard rank
    std::size_t at   = 0;          // where this rank's part sits in the shard
    std::size_t cols = 1;          // a row's length (parts are cut by rows)
    int peer         = -1;         // a tied parameter: the peer stage
    Tensor<T, 1, Exec> full;       // the gathered values while held
    comm::Request gather;          // the gather in flight
    bool gathering = false, ahead = false;
    std::size_t unit = static_cast<std::size_t>(-1);  // traced: the unit its gather belongs to
    int uses         = 0;
    Tensor<T, 1, Exec> grad_full;  // the gradient while written
    std::size_t padded() const noexcept { return shard * groups; }
    std::size_t groups = 1;
  };
  struct Flight {             // a gradient's reduce-scatter in progress
    std::size_t slot, group;  // the parameter, the grads_ready call that started it
    Tensor<T, 1, Exec> sent, part;
    comm::Request request;
    bool keep;
  };

  static int group_size(const comm::Communicator<Backend>& dp, int shard_size) {
    const int s = shard_size <= 0 ? dp.size() : shard_size;
    detail::require<ConfigError>(s <= dp.size() && dp.size() % s == 0, "pmt::optim::Zero3AdamW", [&] {
      return detail::str("shard_size ", shard_size, " does not divide the dp size ", dp.size(),
                         "; expected 0 (all of dp) or a divisor of it");
    });
    return s;
  }
  static comm::Communicator<Backend> shard_group(const comm::Communicator<Backend>& dp, int shard_size) {
    const int s = group_size(dp, shard_size);
    return dp.split(dp.rank() / s, dp.rank() % s);
  }
  /// This rank's part of slot s: where it starts in the parameter and how many real values it has.
  std::pair<std::size_t, std::size_t> part(const Slot& s) const noexcept {
    const std::size_t lo = static_cast<std::size_t>(m_shard_comm.rank()) * s.shard;
    return {lo, lo >= s.n ? 0 : std::min(s.shard, s.n - lo)};
  }
  void copy_part(const Exec& exec, const Slot& s, const Tensor<T, 1, Exec>& whole) {
    const auto [lo, len] = part(s);
    if (len > 0)
      Kokkos::deep_copy(exec, Kokkos::subview(m_w, std::make_pair(s.at, s.at + len)),
                        Kokkos::subview(whole, std::make_pair(lo, lo + len)));
  }

  void layout(const Exec& exec, const std::map<const Parameter<T, Exec>*, int>& peer_of) {
    const auto groups = static_cast<std::size_t>(m_shard_comm.size());
    std::size_t at    = 0;
    for (auto* p : m_params) {
      Slot s;
      s.p = p, s.n = p->size(), s.groups = groups;
      s.cols          = p->local_shape.size() > 1 ? p->local_shape[1] : 1;
      const auto rows = s.n / std::max<std::size_t>(s.cols, 1);
      s.shard = (rows + groups - 1) / groups * s.cols, s.at = at;
      const auto tied = peer_of.find(p);
      if (tied != peer_of.end()) s.peer = tied->second;
      m_slot_of[p] = m_slots.size();
      m_slots.push_back(std::move(s));
      at += m_slots.back().shard;
    }
    m_g = Tensor<T, 1, Exec>("pmt::optim::Zero3AdamW::grad_shard", at);
    m_w = Tensor<T, 1, Exec>("pmt::optim::Zero3AdamW::value_shard", at);
    m_m = Tensor<T, 1, Exec>("pmt::optim::Zero3AdamW::m", at);
    m_v = Tensor<T, 1, Exec>("pmt::optim::Zero3AdamW::v", at);
    // runs of the shard by what the norm does with them: 0 tp-sharded, 1 tp-replicated (or a tp
    // partial, summed before the norm), 2 a pipeline copy (left out); padding holds zeros
    for (const auto& s : m_slots) {
      const int k = s.p->pp_copy ? 2 : (s.p->tp_replicated ? 1 : 0);
      if (!m_runs.empty() && m_runs.back().kind == k && m_runs.back().end == s.at)
        m_runs.back().end += s.shard;
      else
        m_runs.push_back({s.at, s.at + s.shard, k});
      const auto len = part(s).second;
      if (s.p->tp_partial && len > 0) m_partial.push_back({s.at, len}), m_partial_count += len;
    }
    for (auto& s : m_slots) {  // keep this rank's part; the parameter's own storage goes
      copy_part(exec, s, s.p->value);
      s.p->dp_sharded = true;
      s.p->value = Tensor<T, 1, Exec>(), s.p->grad = Tensor<T, 1, Exec>();
    }
    exec.fence();
  }

  /// The unit of a parameter list (registered when first named).
  std::size_t unit_of(const std::vector<Parameter<T, Exec>*>& params) {
    std::vector<std::size_t> slots;
    for (auto* p : params) {
      const auto it = m_slot_of.find(p);
      if (it != m_slot_of.end()) slots.push_back(it->second);
    }
    const auto it = m_unit_index.find(slots);
    if (it != m_unit_index.end()) return it->second;
    m_units.push_back(slots);
    return m_unit_index[slots] = m_units.size() - 1;
  }
  /// Moves the prefetch cursor past `unit` in the recorded order (a unit not found there ahead
  /// of the cursor, the order having changed, stops the prefetch for this step).
  void advance(std::size_t unit) {
    if (!m_order_on) return;
    for (std::size_t k = m_cursor; k < m_order.size(); ++k)
      if (m_order[k] == unit) {
        m_cursor = k + 1;
        return;
      }
    m_cursor = m_order.size();
  }
  bool needed_soon(std::size_t slot) const {
    if (!m_order_on) return false;
    for (std::size_t k = m_cursor; k < m_order.size() && k < m_cursor + m_options.prefetch; ++k)
      for (std::size_t i : m_units[m_order[k]])
        if (i == slot) return true;
    return false;
  }

  void start_gather(const Exec& exec, Slot& s, bool ahead, std::size_t unit) {
    if (s.full.data() != nullptr) return;
    if (unit != no_unit && TraceRecorder::instance().enabled()) {  // the unit's span in the trace
      if (m_span_pending.size() < m_units.size())
        m_span_pending.resize(m_units.size(), 0), m_span_begin.resize(m_units.size());
      if (m_span_pending[unit]++ == 0) m_span_begin[unit] = TraceRecorder::now();
      s.unit = unit;
    }
    s.full = workspace_view<Tensor<T, 1, Exec>>("pmt::optim::Zero3AdamW::values", s.padded());
    s.gather =
        comm::iall_gather(m_shard_comm, exec, Kokkos::subview(m_w, std::make_pair(s.at, s.at + s.shard)), s.full);
    s.gathering = true;
    s.ahead     = ahead;
    m_in_flight.push_back(static_cast<std::size_t>(&s - m_slots.data()));
    m_held_values += s.padded();
    m_bytes += s.shard * sizeof(T);
    ++m_gathers;
    note_peak();
  }
  void finish_gather(Slot& s) {
    if (s.gathering) {
      const auto t0 = std::chrono::steady_clock::now();
      s.gather.wait();
      m_gather_wait += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      completed(s);
    }
    if (s.ahead) ++m_prefetched, s.ahead = false;
    s.p->value = Kokkos::subview(s.full, std::make_pair(std::size_t(0), s.n));
  }
  void drop_value(Slot& s) {
    if (s.full.data() == nullptr) return;
    if (s.gathering) s.gather.wait(), completed(s);
    s.p->value = Tensor<T, 1, Exec>();
    s.full     = Tensor<T, 1, Exec>();
    s.ahead    = false;
    s.uses     = 0;
    m_held_values -= s.padded();
  }
  /// A gather found complete: out of the list in flight; the last of its unit's ends the unit's
  /// span in the trace ("zero3 gather <first parameter>", from its first gather's start).
  void completed(Slot& s) {
    s.gathering  = false;
    const auto i = static_cast<std::size_t>(&s - m_slots.data());
    m_in_flight.erase(std::remove(m_in_flight.begin(), m_in_flight.end(), i), m_in_flight.end());
    if (s.unit == no_unit) return;
    const std::size_t unit = std::exchange(s.unit, no_unit);
    if (--m_span_pending[unit] == 0 && TraceRecorder::instance().enabled())
      TraceRecorder::instance().record(TraceEvent{"zero3 gather " + m_slots[m_units[unit].front()].p->name,
                                                  Track::Collective, m_span_begin[unit], TraceRecorder::now()});
  }
  void release_values(const Exec& exec) {
    exec.fence();
    for (auto& s : m_slots) drop_value(s);
    m_whole = false;
  }
  void drop_grad(Slot& s) {
    if (s.grad_full.data() == nullptr) return;
    s.p->grad   = Tensor<T, 1, Exec>();
    s.grad_full = Tensor<T, 1, Exec>();
    m_held_grads -= s.padded();
  }
  void note_peak() noexcept { m_peak = std::max(m_peak, m_held_values + m_held_grads); }

  /// Starts slot i's reduce-scatter and drops its gradient buffer from the parameter.
  void flush(const Exec& exec, std::size_t i) {
    Slot& s   = m_slots[i];
    auto part = workspace_view<Tensor<T, 1, Exec>>("pmt::optim::Zero3AdamW::grad_part", s.shard);
    m_flights.push_back(
        {i, m_group, s.grad_full, part, comm::ireduce_scatter(m_shard_comm, exec, s.grad_full, part), true});
    m_bytes += s.padded() * sizeof(T);
    m_held_grads += s.shard;  // the part it receives
    note_peak();
    s.p->grad   = Tensor<T, 1, Exec>();
    s.grad_full = Tensor<T, 1, Exec>();  // the flight holds the buffer until completed
  }
  /// Completes reduce-scatters in the order they started: all when `block`, else the oldest
  /// until those of at most max_in_flight grads_ready calls (the last included) remain. `keep`:
  /// add them to the shard.
  void drain(const Exec& exec, bool keep, bool block = true) {
    if (!block)
      for (auto& f : m_flights) f.request.test();
    while (!m_flights.empty() && (block || m_flights.front().group + max_in_flight <= m_group)) {
      Flight& f = m_flights.front();
      f.request.wait();
      const Slot& s = m_slots[f.slot];
      if (keep && f.keep) {
        auto g = Kokkos::subview(m_g, std::make_pair(s.at, s.at + s.shard));
        ops::add(exec, g, f.part, g);
      }
      m_held_grads -= s.padded() + s.shard;
      m_flights.pop_front();
    }
  }
  /// The global gradient norm from the shards (as detail::sharded_grad_norm, by runs): the
  /// squares summed over the shard group, the tp-sharded ones over tp, all over pp.
  double grad_norm(const Exec& exec) const {
    auto sums = workspace_view<Kokkos::View<double*, Kokkos::HostSpace>>("pmt::optim::Zero3AdamW::norm", 2);
    sums(0) = sums(1) = 0;
    for (const auto& r : m_runs)
      if (r.kind != 2)
        sums(std::size_t(r.kind)) +=
            ops::squared_norm_value(exec, Kokkos::subview(m_g, std::make_pair(r.begin, r.end)));
    return detail::norm_of_shard_sums(exec, sums, m_shard_comm, m_tp, m_pp);
  }
  std::vector<Parameter<T, Exec>*> m_params;
  AdamWOptions m_h;
  Zero3Options m_options;
  comm::Communicator<Backend> m_shard_comm, m_replicas, m_tp;
  std::optional<comm::Communicator<Backend>> m_pp;
  std::vector<parallel::TiedParameter<T, Exec>> m_tied;
  std::vector<Slot> m_slots;
  std::map<const Parameter<T, Exec>*, std::size_t> m_slot_of;
  std::vector<std::vector<std::size_t>> m_units;  // slots of each unit
  std::map<std::vector<std::size_t>, std::size_t> m_unit_index;
  std::vector<std::size_t> m_order, m_trace;  // units in the order named: the last step's, this step's
  std::size_t m_cursor = 0;
  bool m_recording = false, m_order_on = true, m_whole = false, m_finished = false;
  std::vector<std::pair<std::size_t, std::size_t>> m_partial;  // tp-partial runs of the shard
  std::size_t m_partial_count = 0;
  Tensor<T, 1, Exec> m_g, m_w, m_m, m_v;
  struct Run {  // a run of the shard's elements the norm treats alike
    std::size_t begin, end;
    int kind;  // 0 tp-sharded, 1 tp-replicated, 2 a pipeline copy
  };
  std::vector<Run> m_runs;
  std::deque<Flight> m_flights;
  std::vector<std::size_t> m_in_flight;  // slots whose gather is in flight
  static constexpr std::size_t no_unit = static_cast<std::size_t>(-1);
  std::vector<std::size_t> m_span_pending;             // traced: per unit, its gathers in flight
  std::vector<double> m_span_begin;                    // and when the first of them started
  std::vector<std::pair<std::size_t, double>> m_uses;  // traced: units in use and since when
  std::size_t m_held_values = 0, m_held_grads = 0, m_peak = 0;
  std::uint64_t m_bytes = 0, m_prefetched = 0, m_gathers = 0;
  std::size_t m_group  = 0;  // grads_ready calls so far
  double m_gather_wait = 0;
  std::int64_t m_step  = 0;
};

}  // namespace pmt::optim
