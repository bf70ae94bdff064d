// SPDX-License-Identifier: Apache-2.0
#pragma once
// Zero2AdamW: AdamW with its state AND the gradients sharded over the dp axis (ZeRO stage 2).
// The parameters are grouped, in backward order, into buckets of about `bucket_bytes` (a
// parameter tied to another pipeline stage gets a bucket of its own, so that both stages cut it
// alike). Each bucket is padded to a multiple of dp and cut evenly: dp rank r owns part r of
// every bucket, and this rank's parts, one after the other, are its shard (about P / dp values).
// Gradients live in bucket buffers that exist only while they are written: before a layer's
// backward writes its gradients (the model's on_grads_needed hook) their bucket is taken from the
// Workspace and zeroed, and the parameters' `grad` views point into it; once every gradient of
// the bucket is final for this microbatch (on_grads_ready), the bucket's reduce-scatter over dp
// starts without blocking and the parameters' `grad` views are dropped; at most max_in_flight (2)
// stay in flight, the oldest completed first (its part of the sum is added to the shard and the
// buffer returns to the Workspace). So a rank
// holds its full gradients only a few buckets at a time, not all P of them. Gradient accumulation
// reduce-scatters every microbatch (as DeepSpeed's ZeRO-2 does), so communication grows with the
// number of microbatches; the one-microbatch step moves what ZeRO-1's does.
// A model without on_grads_needed (or an optimizer used without the Trainer) keeps every bucket
// from zero_grad() to the step, as ZeRO-1 keeps its gradients; the results are the same.
// At the step: the tied buckets' shards are summed with the peer stage's over pp, the
// sequence-parallel partial gradients (Parameter::tp_partial) of the shard over tp; then as
// ZeroAdamW: clipping by the global norm, AdamW on the shard, and each bucket's values are
// all-gathered into the parameters.
// Memory beyond the parameters' values: 4 P / dp (gradient, value, m, v of the shard) + P / dp
// bytes of flags, and the buckets in flight (each a bucket of gradients and 1/dp of it for the
// received part); no P-sized buffer at all.
// Communication per microbatch: one ireduce_scatter(dp) per bucket; per step: the norm's
// all_reduces (dp, tp, pp), one all_gather(dp) per bucket, with pipeline stages a pp exchange of
// the tied buckets' shards, with sequence parallelism an all_reduce(tp) of the partial elements.
// Checkpoints: gathered_moments() gives the moments in parameters() order, as ZeroAdamW's and
// plain AdamW's, so any optimizer and layout loads them.

#include "pmt/comm/collectives.hpp"
#include "pmt/comm/communicator.hpp"
#include "pmt/comm/request.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/instrument.hpp"
#include "pmt/core/parameter.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/core/workspace.hpp"
#include "pmt/ops/elementwise.hpp"
#include "pmt/ops/update.hpp"
#include "pmt/optim/optimizers.hpp"
#include "pmt/optim/zero.hpp"
#include "pmt/parallel/stage_module.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace pmt::optim {

/// \brief Whether optimizer O shards the gradients themselves (ZeRO-2: it owns their storage and
/// the Trainer routes the model's gradient hooks to it).
template <class O, class = void>
struct shards_grads : std::false_type {};
template <class O>
struct shards_grads<O, std::void_t<decltype(O::shards_grads)>> : std::bool_constant<O::shards_grads> {};
template <class O>
inline constexpr bool shards_grads_v = shards_grads<O>::value;

/// \brief AdamW with its state and the gradients sharded over dp (ZeRO-2, see the file comment).
/// \throws pmt::ConfigError for bucket_bytes 0, a tied parameter that is not among `params`, or
/// tied parameters without a pp communicator.
template <class T, class Exec, class Backend>
class Zero2AdamW {
 public:
  static constexpr bool shards_over_dp              = true;
  static constexpr bool shards_grads                = true;
  static constexpr std::size_t default_bucket_bytes = std::size_t(25) << 20;
  /// Reduce-scatters left in flight while backward goes on; an older one is completed first.
  static constexpr std::size_t max_in_flight = 2;

  /// \param pp the pipeline communicator when the model is split into stages.
  /// \param tied the model's tied_parameters() (a tied LM head: summed with the peer stage's copy).
  Zero2AdamW(std::vector<Parameter<T, Exec>*> params, AdamWOptions hyper, const comm::Communicator<Backend>& dp,
             const comm::Communicator<Backend>& tp, std::optional<comm::Communicator<Backend>> pp = std::nullopt,
             std::vector<parallel::TiedParameter<T, Exec>> tied = {}, std::size_t bucket_bytes = default_bucket_bytes)
      : m_params(std::move(params)), m_h(hyper), m_dp(dp), m_tp(tp), m_pp(std::move(pp)), m_tied(std::move(tied)) {
    constexpr const char* op = "pmt::optim::Zero2AdamW";
    detail::require<ConfigError>(bucket_bytes > 0, op, [] { return std::string("bucket_bytes is 0; expected > 0"); });
    const auto peer_of = detail::tied_peers(m_params, m_tied, m_pp, op);
    layout(bucket_bytes, peer_of);
    for (auto* p : m_params) p->grad = Tensor<T, 1, Exec>();  // the buckets hold the gradients from now on
  }
  Zero2AdamW(const Zero2AdamW&)            = delete;  // parameters' grad views point into its buckets
  Zero2AdamW& operator=(const Zero2AdamW&) = delete;
  Zero2AdamW(Zero2AdamW&&)                 = default;
  ~Zero2AdamW() {
    for (auto& f : m_flights) f.request.wait();
  }

  /// \brief Whether the model announces each layer's gradients before writing them (the
  /// Trainer sets it for models with on_grads_needed): then buckets live only while written.
  /// Otherwise zero_grad() gives every parameter its gradient storage until the step.
  void announce_grads(bool on) noexcept { m_announced = on; }
  /// \brief Whether the gradients of the coming backward passes are summed into the shard
  /// (true) or dropped when their bucket completes (the Trainer's evaluation).
  void collect_grads(bool on) noexcept { m_collect = on; }

  /// \brief Clears the shard's gradient sum and drops every bucket; without announced
  /// gradients, gives every parameter zeroed storage for the coming backward passes.
  void zero_grad(const Exec& exec = Exec()) {
    drain(exec, /*keep=*/false);
    for (auto& b : m_buckets) release(b);
    Kokkos::deep_copy(exec, m_g, T(0));
    m_finished = false;
    if (!m_announced)
      for (auto& b : m_buckets) acquire(exec, b);
  }

  /// \brief The model is about to write the gradients of `params`: their buckets get storage.
  void grads_needed(const Exec& exec, const std::vector<Parameter<T, Exec>*>& params) {
    if (!m_announced) return;
    for (auto* p : params) {
      const auto it = m_where.find(p);
      if (it != m_where.end()) acquire(exec, m_buckets[it->second.first]);
    }
  }

  /// \brief The gradients of `params` are final for this microbatch: a bucket all of whose
  /// parameters are starts its reduce-scatter (or is dropped while not collecting).
  void grads_ready(const Exec& exec, const std::vector<Parameter<T, Exec>*>& params) {
    if (m_announced) {
      for (auto* p : params) {
        const auto it = m_where.find(p);
        if (it == m_where.end()) continue;
        Bucket& b = m_buckets[it->second.first];
        if (b.buffer.data() == nullptr || b.ready[it->second.second]) continue;
        b.ready[it->second.second] = 1;
        if (++b.readied == b.params.size()) {
          flush(exec, b);
          drain(exec, /*keep=*/true, /*block=*/false);  // never more than max_in_flight
        }
      }
    }
    drain(exec, /*keep=*/true, /*block=*/false);
  }

  /// \brief Reduce-scatters the buckets still held, waits for all in flight and completes the
  /// shard's gradients (tied buckets summed over pp, partial ones over tp). step() calls it when
  /// it has not run since zero_grad(). Collective over dp, and over pp and tp when needed.
  void finish_grads(const Exec& exec) {
    if (m_finished) return;
    const Instrument instrument("pmt::optim::Zero2AdamW::finish_grads", Track::Collective, "zero2 gradients");
    for (auto& b : m_buckets)
      if (b.buffer.data() != nullptr) flush(exec, b);
    drain(exec, /*keep=*/true);
    for (const auto& b : m_buckets)
      if (b.peer >= 0)
        detail::add_peer_shard(exec, *m_pp, Kokkos::subview(m_g, std::make_pair(b.shard_at, b.shard_at + b.shard)),
                               b.peer, "pmt::optim::Zero2AdamW::peer");
    detail::sum_runs_over_tp(exec, m_tp, m_g, m_partial, m_partial_count, "pmt::optim::Zero2AdamW::partial");
    m_finished = true;
  }

  /// \brief finish_grads(), clip by the global norm (max_norm <= 0: no clipping), AdamW on this
  /// rank's shard, all-gather the values bucket by bucket. Returns the norm before clipping; no
  /// update when `skip`, or when `skip_nonfinite` and the norm is nan or inf (all ranks alike).
  double step(const Exec& exec, double lr, double max_norm, bool skip_nonfinite = false, bool skip = false) {
    const Instrument instrument("pmt::optim::Zero2AdamW::step", Track::Optimizer, "zero2-adamw");
    finish_grads(exec);
    m_finished        = false;
    const double norm = detail::sharded_grad_norm(exec, m_g, m_kind, m_dp, m_tp, m_pp);
    if (skip || (skip_nonfinite && !std::isfinite(norm))) return norm;
    ++m_step;
    if (max_norm > 0 && norm > max_norm) ops::scale(exec, m_g, static_cast<T>(max_norm / (norm + 1e-6)));
    for (const auto& pc : m_pieces)
      Kokkos::deep_copy(exec, Kokkos::subview(m_w, std::make_pair(pc.shard_pos, pc.shard_pos + pc.len)),
                        Kokkos::subview(pc.param->value, std::make_pair(pc.within, pc.within + pc.len)));
    ops::adamw_update(exec, m_w, m_g, m_m, m_v, m_h.at(lr, m_step));
    for (const auto& b : m_buckets) {
      auto whole = block_view("pmt::optim::Zero2AdamW::bucket", block_of(b.padded), b.padded);
      comm::all_gather(m_dp, exec, Kokkos::subview(m_w, std::make_pair(b.shard_at, b.shard_at + b.shard)), whole);
      for (std::size_t i = 0; i < b.params.size(); ++i)
        Kokkos::deep_copy(exec, b.params[i]->value,
                          Kokkos::subview(whole, std::make_pair(b.offset[i], b.offset[i] + b.params[i]->size())));
    }
    return norm;
  }

  const std::vector<Parameter<T, Exec>*>& parameters() const noexcept { return m_params; }
  const std::vector<parallel::TiedParameter<T, Exec>>& tied_parameters() const noexcept { return m_tied; }
  /// \brief Bytes of optimizer state this rank holds (Adam's two moments for its shard).
  std::size_t state_bytes() const noexcept { return 2 * m_g.size() * sizeof(T); }
  /// \brief Values of the gradient shard this rank keeps (the sum of its parts of every bucket).
  std::size_t shard_size() const noexcept { return m_g.size(); }
  std::size_t buckets() const noexcept { return m_buckets.size(); }
  /// \brief The largest number of buckets this rank held at once (written or in flight) since
  /// construction: the gradient memory is about that many buckets, not all of them.
  std::size_t peak_buckets() const noexcept { return m_peak_held; }
  /// \brief The most bytes of gradient buffers this rank held at once since construction (the
  /// buckets being written, those in flight and the parts they receive).
  std::size_t peak_gradient_bytes() const noexcept { return m_peak_bytes; }
  /// \brief Bytes this rank has handed to the gradients' reduce-scatters so far.
  std::uint64_t bytes_sent() const noexcept { return m_bytes; }
  std::int64_t steps() const noexcept { return m_step; }
  void set_steps(std::int64_t n) noexcept { m_step = n; }
  /// \brief The length of gathered_moments(): every parameter of this rank, in parameters() order.
  std::size_t padded_size() const noexcept { return m_total; }
  /// \brief Adam's moments of all this rank's parameters, flat in parameters() order (collective
  /// over dp: each bucket's parts are all-gathered).
  std::pair<Tensor<T, 1, Exec>, Tensor<T, 1, Exec>> gathered_moments(const Exec& exec) const {
    Tensor<T, 1, Exec> m("pmt::optim::Zero2AdamW::gathered_m", m_total),
        v("pmt::optim::Zero2AdamW::gathered_v", m_total);
    for (const auto& b : m_buckets) {
      Tensor<T, 1, Exec> whole("pmt::optim::Zero2AdamW::gathered_bucket", b.padded);
      for (auto [shard, flat] : {std::pair{m_m, m}, std::pair{m_v, v}}) {
        comm::all_gather(m_dp, exec, Kokkos::subview(shard, std::make_pair(b.shard_at, b.shard_at + b.shard)), whole);
        for (std::size_t i = 0; i < b.params.size(); ++i) {
          const std::size_t at = m_offset.at(b.params[i]), n = b.params[i]->size();
          Kokkos::deep_copy(exec, Kokkos::subview(flat, std::make_pair(at, at + n)),
                            Kokkos::subview(whole, std::make_pair(b.offset[i], b.offset[i] + n)));
        }
      }
    }
    return {m, v};
  }
  /// \brief Keeps this rank's part of full moments laid out as gathered_moments() gives them.
  /// \throws pmt::ShapeError when `m` or `v` is not padded_size() long.
  void set_moments(const Exec& exec, const Tensor<T, 1, Exec>& m, const Tensor<T, 1, Exec>& v) {
    detail::require(m.size() == m_total && v.size() == m_total, "pmt::optim::Zero2AdamW::set_moments", [&] {
      return detail::str("m has ", m.size(), " and v ", v.size(), " elements; expected padded_size() = ", m_total);
    });
    for (const auto& pc : m_pieces) {
      const std::size_t at = m_offset.at(pc.param) + pc.within;
      Kokkos::deep_copy(exec, Kokkos::subview(m_m, std::make_pair(pc.shard_pos, pc.shard_pos + pc.len)),
                        Kokkos::subview(m, std::make_pair(at, at + pc.len)));
      Kokkos::deep_copy(exec, Kokkos::subview(m_v, std::make_pair(pc.shard_pos, pc.shard_pos + pc.len)),
                        Kokkos::subview(v, std::make_pair(at, at + pc.len)));
    }
  }

 private:
  struct Bucket {
    std::vector<Parameter<T, Exec>*> params;  // in backward order
    std::vector<std::size_t> offset;          // of each parameter in the bucket
    std::size_t padded = 0, shard = 0;        // the bucket's length (a multiple of dp), its part per rank
    std::size_t shard_at = 0;                 // where this rank's part sits in the shard
    int peer             = -1;                // a tied parameter's bucket: the peer stage
    Tensor<T, 1, Exec> buffer;                // the gradients while held
    std::vector<char> ready;                  // per parameter: final since the bucket was taken
    std::size_t readied = 0;
  };
  struct Flight {  // a bucket's reduce-scatter in progress
    std::size_t bucket;
    Tensor<T, 1, Exec> sent, part;  // the bucket (held until completed here) and this rank's part of the sum
    comm::Request request;
    bool keep;
  };
  struct Piece {  // a run of one parameter inside this rank's shard
    Parameter<T, Exec>* param;
    std::size_t within, shard_pos, len;
  };

  void layout(std::size_t bucket_bytes, const std::map<const Parameter<T, Exec>*, int>& peer_of) {
    const auto dp = static_cast<std::size_t>(m_dp.size()), me = static_cast<std::size_t>(m_dp.rank());
    Bucket current;
    std::size_t bytes = 0;
    const auto close  = [&] {
      if (!current.params.empty()) m_buckets.push_back(std::move(current));
      current = Bucket(), bytes = 0;
    };
    for (auto it = m_params.rbegin(); it != m_params.rend(); ++it) {  // backward order
      const auto tied = peer_of.find(*it);
      if (tied != peer_of.end()) {  // a bucket of its own, cut alike on both stages
        close();
        current.params.push_back(*it), current.peer = tied->second;
        close();
        continue;
      }
      current.params.push_back(*it);
      bytes += (*it)->bytes();
      if (bytes >= bucket_bytes) close();
    }
    close();
    std::size_t at = 0;
    for (auto* p : m_params) m_offset[p] = at, at += p->size();
    m_total              = at;
    std::size_t shard_at = 0;
    for (std::size_t bi = 0; bi < m_buckets.size(); ++bi) {
      Bucket& b     = m_buckets[bi];
      std::size_t n = 0;
      for (std::size_t i = 0; i < b.params.size(); ++i) {
        b.offset.push_back(n);
        m_where[b.params[i]] = {bi, i};
        n += b.params[i]->size();
      }
      b.shard = (n + dp - 1) / dp, b.padded = b.shard * dp, b.shard_at = shard_at;
      b.ready.assign(b.params.size(), 0);
      const std::size_t lo = me * b.shard, hi = lo + b.shard;  // my part of the bucket
      for (std::size_t i = 0; i < b.params.size(); ++i) {
        const std::size_t a = std::max(lo, b.offset[i]), e = std::min(hi, b.offset[i] + b.params[i]->size());
        if (a < e) m_pieces.push_back({b.params[i], a - b.offset[i], shard_at + (a - lo), e - a});
      }
      shard_at += b.shard;
    }
    m_g = Tensor<T, 1, Exec>("pmt::optim::Zero2AdamW::grad_shard", shard_at);
    m_w = Tensor<T, 1, Exec>("pmt::optim::Zero2AdamW::value_shard", shard_at);
    m_m = Tensor<T, 1, Exec>("pmt::optim::Zero2AdamW::m", shard_at);
    m_v = Tensor<T, 1, Exec>("pmt::optim::Zero2AdamW::v", shard_at);
    // per element of the shard: 0 tp-sharded, 1 tp-replicated (or a tp partial, summed before the
    // norm), 2 a pipeline copy (left out of the norm); padding is 0 and holds zeros
    m_kind = Kokkos::View<std::uint8_t*, Kokkos::LayoutRight, typename Exec::memory_space>(
        "pmt::optim::Zero2AdamW::kind", shard_at);
    auto host = Kokkos::create_mirror_view(m_kind);
    Kokkos::deep_copy(host, std::uint8_t(0));
    for (const auto& pc : m_pieces) {
      const std::uint8_t k = pc.param->pp_copy ? 2 : (pc.param->tp_replicated ? 1 : 0);
      for (std::size_t i = 0; i < pc.len; ++i) host(pc.shard_pos + i) = k;
      if (pc.param->tp_partial) m_partial.push_back({pc.shard_pos, pc.len}), m_partial_count += pc.len;
    }
    Kokkos::deep_copy(m_kind, host);
  }

  /// The Workspace block a bucket of `padded` values is cut from: rounded up to one of 8
  /// lengths per octave (a multiple of dp; at most 1/8 more), so that buckets of similar length
  /// share blocks (the Workspace keys blocks by their length: one block per distinct length
  /// would hold all P gradients again).
  std::size_t block_of(std::size_t padded) const noexcept {
    const auto dp      = static_cast<std::size_t>(m_dp.size());
    std::size_t octave = 1;
    while (octave * 2 <= padded / dp) octave *= 2;
    const std::size_t step = dp * std::max<std::size_t>(1, octave / 8);
    return (padded + step - 1) / step * step;
  }
  Tensor<T, 1, Exec> block_view(const char* label, std::size_t block, std::size_t n) const {
    return Kokkos::subview(workspace_view<Tensor<T, 1, Exec>>(label, block), std::make_pair(std::size_t(0), n));
  }
  /// Bytes of gradient buffers held now: the buckets being written and those in flight with the
  /// parts they receive (their Workspace blocks).
  std::size_t held_bytes() const {
    std::size_t bytes = 0;
    const auto dp     = static_cast<std::size_t>(m_dp.size());
    for (const auto& b : m_buckets)
      if (b.buffer.data() != nullptr) bytes += block_of(b.padded) * sizeof(T);
    for (const auto& f : m_flights) bytes += block_of(m_buckets[f.bucket].padded) * (1 + 1 / double(dp)) * sizeof(T);
    return bytes;
  }
  void acquire(const Exec& exec, Bucket& b) {
    if (b.buffer.data() != nullptr) return;
    b.buffer = block_view("pmt::optim::Zero2AdamW::grad_bucket", block_of(b.padded), b.padded);
    Kokkos::deep_copy(exec, b.buffer, T(0));
    for (std::size_t i = 0; i < b.params.size(); ++i)
      b.params[i]->grad = Kokkos::subview(b.buffer, std::make_pair(b.offset[i], b.offset[i] + b.params[i]->size()));
    std::fill(b.ready.begin(), b.ready.end(), 0);
    b.readied = 0;
    ++m_held;
    m_peak_held  = std::max(m_peak_held, m_held + m_flights.size());
    m_peak_bytes = std::max(m_peak_bytes, held_bytes());
  }
  void release(Bucket& b) {
    if (b.buffer.data() == nullptr) return;
    for (auto* p : b.params) p->grad = Tensor<T, 1, Exec>();
    b.buffer = Tensor<T, 1, Exec>();
    --m_held;
  }
  /// Starts the bucket's reduce-scatter (collecting) and drops it from the parameters.
  void flush(const Exec& exec, Bucket& b) {
    const std::size_t index = static_cast<std::size_t>(&b - m_buckets.data());
    if (m_collect) {
      auto part = block_view("pmt::optim::Zero2AdamW::grad_part",
                             block_of(b.padded) / static_cast<std::size_t>(m_dp.size()), b.shard);
      m_flights.push_back({index, b.buffer, part, comm::ireduce_scatter(m_dp, exec, b.buffer, part), true});
      m_bytes += b.padded * sizeof(T);
      m_peak_bytes = std::max(m_peak_bytes, held_bytes());
    }
    release(b);
  }
  /// Completes the reduce-scatters in flight in the order they started (so the sums are added
  /// alike on every run): all when `block`; otherwise each in flight is polled once (MPI moves a
  /// non-blocking collective on only inside its calls) and the oldest are completed until at
  /// most max_in_flight remain, so the memory a step holds is the same in every step (the
  /// Workspace then serves every later step without allocating). `keep`: add them to the shard.
  void drain(const Exec& exec, bool keep, bool block = true) {
    if (!block)
      for (auto& f : m_flights) f.request.test();
    while (!m_flights.empty() && (block || m_flights.size() > max_in_flight)) {
      Flight& f = m_flights.front();
      f.request.wait();
      if (keep && f.keep) {
        const Bucket& b = m_buckets[f.bucket];
        auto g          = Kokkos::subview(m_g, std::make_pair(b.shard_at, b.shard_at + b.shard));
        ops::add(exec, g, f.part, g);
      }
      m_flights.pop_front();
    }
  }
  std::vector<Parameter<T, Exec>*> m_params;
  AdamWOptions m_h;
  comm::Communicator<Backend> m_dp, m_tp;
  std::optional<comm::Communicator<Backend>> m_pp;
  std::vector<parallel::TiedParameter<T, Exec>> m_tied;
  std::vector<Bucket> m_buckets;
  std::map<const Parameter<T, Exec>*, std::pair<std::size_t, std::size_t>> m_where;  // bucket, index in it
  std::map<const Parameter<T, Exec>*, std::size_t> m_offset;                         // in parameters() order
  std::vector<Piece> m_pieces;
  std::vector<std::pair<std::size_t, std::size_t>> m_partial;  // tp-partial runs of the shard
  std::size_t m_total = 0, m_partial_count = 0;
  Tensor<T, 1, Exec> m_g, m_w, m_m, m_v;
  Kokkos::View<std::uint8_t*, Kokkos::LayoutRight, typename Exec::memory_space> m_kind;
  std::deque<Flight> m_flights;
  std::size_t m_held = 0, m_peak_held = 0, m_peak_bytes = 0;
  std::uint64_t m_bytes = 0;
  std::int64_t m_step   = 0;
  bool m_announced = false, m_collect = true, m_finished = false;
};

}  // namespace pmt::optim
