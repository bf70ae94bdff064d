// SPDX-License-Identifier: Apache-2.0
#pragma once
// ZeroAdamW: AdamW with its state sharded over the dp axis (ZeRO stage 1). All parameter shards of
// this rank are viewed as one flat vector of P elements (padded to a multiple of dp). Each dp rank
// owns 1/dp of it: the gradients are reduce-scattered (summed, as pmt normalises by the global
// token count), clipped by the global norm, updated by AdamW on the owned part (Adam's moments
// exist only for that part: 2 P / dp values instead of 2 P), and the updated values are
// all-gathered and written back to the parameters.
// Memory beyond the parameters and their gradients: one flat buffer of P (gradients in, values
// out) and 4 P / dp (gradient, value, m, v of the shard) + P / dp bytes of flags, against plain
// AdamW's 2 P plus the dp gradient buckets' P: less from dp = 4 on.
// Communication per step: reduce_scatter(dp) of P, all_reduce(dp) + all_reduce(tp) of 2 numbers
// for the norm (and all_reduce(pp) of 1 with pipeline stages), all_gather(dp) of P. The Trainer
// leaves the gradient reduction to this optimizer.

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
#include "pmt/parallel/stage_module.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace pmt::detail {

/// The global gradient norm from this rank's sums of squares of its dp shard: sums(0) of the
/// elements sharded over tp, sums(1) of those replicated over tp (counted once). Summed over dp,
/// the sharded ones over tp, both over pp.
template <class Exec, class Backend>
double norm_of_shard_sums(const Exec& exec, const Kokkos::View<double*, Kokkos::HostSpace>& sums,
                          const comm::Communicator<Backend>& dp, const comm::Communicator<Backend>& tp,
                          const std::optional<comm::Communicator<Backend>>& pp) {
  comm::all_reduce_host_values(dp, exec, sums);
  Kokkos::View<double*, Kokkos::HostSpace> sharded(sums.data(), 1);
  if (tp.size() > 1) comm::all_reduce_host_values(tp, exec, sharded);
  sums(0) += sums(1);
  if (pp && pp->size() > 1) comm::all_reduce_host_values(*pp, exec, sharded);
  return std::sqrt(sums(0));
}

/// The global gradient norm from the dp shards of the ZeRO optimizers: `g` is this rank's shard
/// and `kind(i)` says what element i is (0 sharded over tp, 1 replicated over tp: counted once, 2
/// a pipeline copy: not counted). The squares are summed over dp, the sharded ones over tp, and
/// both over pp. Collective over dp, tp and (when given and > 1) pp. A free function: CUDA's
/// extended lambdas may not sit in a private member.
template <class Exec, class Backend, class G, class K>
double sharded_grad_norm(const Exec& exec, const G& g, const K& kind, const comm::Communicator<Backend>& dp,
                         const comm::Communicator<Backend>& tp, const std::optional<comm::Communicator<Backend>>& pp) {
  auto sums   = workspace_view<Kokkos::View<double*, Kokkos::HostSpace>>("pmt::optim::sharded_grad_norm", 2);
  double s_sh = 0, s_rep = 0;
  Kokkos::parallel_reduce(
      "pmt::optim::sharded_grad_norm", Kokkos::RangePolicy<Exec>(exec, 0, g.size()),
      KOKKOS_LAMBDA(std::size_t i, double& a) { a += kind(i) == 0 ? double(g(i)) * double(g(i)) : 0.0; }, s_sh);
  Kokkos::parallel_reduce(
      "pmt::optim::sharded_grad_norm", Kokkos::RangePolicy<Exec>(exec, 0, g.size()),
      KOKKOS_LAMBDA(std::size_t i, double& a) { a += kind(i) == 1 ? double(g(i)) * double(g(i)) : 0.0; }, s_rep);
  sums(0) = s_sh, sums(1) = s_rep;
  return norm_of_shard_sums(exec, sums, dp, tp, pp);
}

/// The tied parameters' peer stages (a ZeRO-2/3 optimizer's constructor), checked: each among
/// `params`, with a pp communicator of its peer's stage. \throws pmt::ConfigError naming `op`.
template <class T, class Exec, class Backend>
std::map<const Parameter<T, Exec>*, int> tied_peers(const std::vector<Parameter<T, Exec>*>& params,
                                                    const std::vector<parallel::TiedParameter<T, Exec>>& tied,
                                                    const std::optional<comm::Communicator<Backend>>& pp,
                                                    const char* op) {
  std::map<const Parameter<T, Exec>*, int> peer_of;
  for (const auto& t : tied) {
    const bool known = std::find(params.begin(), params.end(), t.param) != params.end();
    require<ConfigError>(known && pp && t.peer >= 0 && t.peer < pp->size(), op, [&] {
      return str(
          "a tied parameter (peer stage ", t.peer, ") is ",
          known ? "given without a pp communicator of that many stages" : "not among the optimizer's parameters");
    });
    peer_of[t.param] = t.peer;
  }
  return peer_of;
}

/// mine += the peer stage's copy of it, in one exchange over pp (NCCL's stream order: one group);
/// g + g' on one stage, g' + g on the other: the same bits.
template <class Exec, class Backend, class V>
void add_peer_shard(const Exec& exec, const comm::Communicator<Backend>& pp, const V& mine, int peer,
                    const char* label) {
  using Buffer = Kokkos::View<typename V::non_const_value_type*, Kokkos::LayoutRight, typename V::memory_space>;
  auto other   = workspace_view<Buffer>(label, mine.size());
  comm::Request rq, sq;
  comm::group(pp, exec, [&] {
    rq = comm::irecv(pp, exec, other, peer, /*tag=*/7);
    sq = comm::isend(pp, exec, mine, peer, 7);
  });
  rq.wait();
  sq.wait();
  ops::add(exec, mine, other, mine);
}

/// The runs [at, at + length) of g summed over tp, packed into one all-reduce of `count` values
/// (sequence parallelism's partial gradients in a ZeRO shard).
template <class Exec, class Backend, class G>
void sum_runs_over_tp(const Exec& exec, const comm::Communicator<Backend>& tp, const G& g,
                      const std::vector<std::pair<std::size_t, std::size_t>>& runs, std::size_t count,
                      const char* label) {
  if (tp.size() <= 1 || count == 0) return;
  auto packed         = workspace_view<G>(label, count);
  const auto each_run = [&](bool to_packed) {
    std::size_t at = 0;
    for (const auto& [pos, len] : runs) {
      auto slot = Kokkos::subview(packed, std::make_pair(at, at + len));
      auto mine = Kokkos::subview(g, std::make_pair(pos, pos + len));
      if (to_packed)
        Kokkos::deep_copy(exec, slot, mine);
      else
        Kokkos::deep_copy(exec, mine, slot);
      at += len;
    }
  };
  each_run(true);
  comm::all_reduce(tp, exec, packed, comm::ReduceOp::Sum);
  each_run(false);
}

}  // namespace pmt::detail

namespace pmt::optim {

/// \brief AdamW with its state sharded over dp (ZeRO-1, see the file comment): step() reduce-
/// scatters the gradients over dp, clips by the global norm, updates this rank's part and
/// all-gathers the values. \throws pmt::ConfigError for a dp communicator of another size than
/// the mesh's.
template <class T, class Exec, class Backend>
class ZeroAdamW {
 public:
  static constexpr bool shards_over_dp = true;

  /// \param pp the pipeline communicator when the model is split into stages (the norm then
  /// sums over stages and leaves out pipeline copies such as the tied LM head).
  ZeroAdamW(std::vector<Parameter<T, Exec>*> params, AdamWOptions hyper, const comm::Communicator<Backend>& dp,
            const comm::Communicator<Backend>& tp, std::optional<comm::Communicator<Backend>> pp = std::nullopt)
      : m_params(std::move(params)), m_h(hyper), m_dp(dp), m_tp(tp), m_pp(std::move(pp)) {
    std::size_t total = 0;
    for (auto* p : m_params) total += p->size();
    const auto n = static_cast<std::size_t>(m_dp.size());
    m_shard      = (total + n - 1) / n;
    m_flat_g     = Tensor<T, 1, Exec>("pmt::optim::ZeroAdamW::grads", m_shard * n);
    m_g          = Tensor<T, 1, Exec>("pmt::optim::ZeroAdamW::grad_shard", m_shard);
    m_w          = Tensor<T, 1, Exec>("pmt::optim::ZeroAdamW::value_shard", m_shard);
    m_m          = Tensor<T, 1, Exec>("pmt::optim::ZeroAdamW::m", m_shard);
    m_v          = Tensor<T, 1, Exec>("pmt::optim::ZeroAdamW::v", m_shard);
    // Per element of my shard: 0 tp-sharded, 1 tp-replicated (counted once in the norm), 2 a
    // pipeline copy (not counted).
    m_replicated = Kokkos::View<std::uint8_t*, Kokkos::LayoutRight, typename Exec::memory_space>(
        "pmt::optim::ZeroAdamW::replicated", m_shard);
    auto host            = Kokkos::create_mirror_view(m_replicated);
    const std::size_t lo = m_shard * static_cast<std::size_t>(m_dp.rank());
    std::size_t offset   = 0;
    for (auto* p : m_params) {
      for (std::size_t i = std::max(offset, lo); i < std::min(offset + p->size(), lo + m_shard); ++i)
        host(i - lo) = p->pp_copy ? 2 : (p->tp_replicated ? 1 : 0);
      offset += p->size();
    }
    Kokkos::deep_copy(m_replicated, host);
  }

  void zero_grad(const Exec& exec = Exec()) { optim::zero_grad(exec, m_params); }

  /// \brief Reduce-scatter the gradients over dp, clip by the global norm (max_norm <= 0: no
  /// clipping), AdamW on this rank's part, all-gather the values. Returns the norm before clipping.
  /// No update (values, moments and step count unchanged) when `skip`, or when
  /// `skip_nonfinite` and the norm is nan or inf; the norm is global, so all ranks skip alike.
  double step(const Exec& exec, double lr, double max_norm, bool skip_nonfinite = false, bool skip = false) {
    const Instrument instrument("pmt::optim::ZeroAdamW::step", Track::Optimizer, "zero-adamw");
    ++m_step;
    pack(exec, &Parameter<T, Exec>::grad, m_flat_g);
    comm::reduce_scatter(m_dp, exec, m_flat_g, m_g, comm::ReduceOp::Sum);
    const double norm = detail::sharded_grad_norm(exec, m_g, m_replicated, m_dp, m_tp, m_pp);
    if (skip || (skip_nonfinite && !std::isfinite(norm))) {
      --m_step;
      return norm;
    }
    if (max_norm > 0 && norm > max_norm) ops::scale(exec, m_g, static_cast<T>(max_norm / (norm + 1e-6)));
    // AdamW on my part of the flat values; the flat gradient buffer, free after the
    // reduce-scatter, carries the values (one flat buffer of P, not two)
    pack(exec, &Parameter<T, Exec>::value, m_flat_g);
    const std::size_t lo = m_shard * static_cast<std::size_t>(m_dp.rank());
    Kokkos::deep_copy(exec, m_w, Kokkos::subview(m_flat_g, std::make_pair(lo, lo + m_shard)));
    ops::adamw_update(exec, m_w, m_g, m_m, m_v, m_h.at(lr, m_step));
    comm::all_gather(m_dp, exec, m_w, m_flat_g);
    unpack(exec, m_flat_g);
    return norm;
  }

  const std::vector<Parameter<T, Exec>*>& parameters() const noexcept { return m_params; }
  /// \brief Bytes of optimizer state this rank holds (Adam's two moments for its part).
  std::size_t state_bytes() const noexcept { return 2 * m_shard * sizeof(T); }
  std::int64_t steps() const noexcept { return m_step; }
  /// \brief Sets the step count (bias correction continues from it; for checkpoints).
  void set_steps(std::int64_t n) noexcept { m_step = n; }
  /// \brief The length of the flat vector of all this rank's parameters, padded to a multiple of dp.
  std::size_t padded_size() const noexcept { return m_shard * static_cast<std::size_t>(m_dp.size()); }
  /// \brief Adam's first and second moments of all of this rank's parameters, flat in
  /// parameters() order (padded_size() long): all-gathered over dp, so collective over the dp
  /// axis. Checkpoints write them per parameter, as they write plain AdamW's.
  std::pair<Tensor<T, 1, Exec>, Tensor<T, 1, Exec>> gathered_moments(const Exec& exec) const {
    Tensor<T, 1, Exec> m("pmt::optim::ZeroAdamW::gathered_m", padded_size()),
        v("pmt::optim::ZeroAdamW::gathered_v", padded_size());
    comm::all_gather(m_dp, exec, m_m, m);
    comm::all_gather(m_dp, exec, m_v, v);
    return {m, v};
  }
  /// \brief Keeps this rank's part of full moments laid out as gathered_moments() gives them.
  /// \throws pmt::ShapeError when `m` or `v` is not padded_size() long.
  void set_moments(const Exec& exec, const Tensor<T, 1, Exec>& m, const Tensor<T, 1, Exec>& v) {
    detail::require(m.size() == padded_size() && v.size() == padded_size(), "pmt::optim::ZeroAdamW::set_moments", [&] {
      return detail::str("m has ", m.size(), " and v ", v.size(),
                         " elements; expected padded_size() = ", padded_size());
    });
    const std::size_t lo = m_shard * static_cast<std::size_t>(m_dp.rank());
    Kokkos::deep_copy(exec, m_m, Kokkos::subview(m, std::make_pair(lo, lo + m_shard)));
    Kokkos::deep_copy(exec, m_v, Kokkos::subview(v, std::make_pair(lo, lo + m_shard)));
  }

 private:
  template <class Member>
  void pack(const Exec& exec, Member member, const Tensor<T, 1, Exec>& flat) const {
    std::size_t offset = 0;
    for (auto* p : m_params) {
      Kokkos::deep_copy(exec, Kokkos::subview(flat, std::make_pair(offset, offset + p->size())), (p->*member));
      offset += p->size();
    }
  }
  void unpack(const Exec& exec, const Tensor<T, 1, Exec>& flat) const {
    std::size_t offset = 0;
    for (auto* p : m_params) {
      Kokkos::deep_copy(exec, p->value, Kokkos::subview(flat, std::make_pair(offset, offset + p->size())));
      offset += p->size();
    }
  }

  std::vector<Parameter<T, Exec>*> m_params;
  AdamWOptions m_h;
  comm::Communicator<Backend> m_dp, m_tp;
  std::optional<comm::Communicator<Backend>> m_pp;
  std::size_t m_shard = 0;
  std::int64_t m_step = 0;
  Tensor<T, 1, Exec> m_flat_g, m_g, m_w, m_m, m_v;
  Kokkos::View<std::uint8_t*, Kokkos::LayoutRight, typename Exec::memory_space> m_replicated;
};

}  // namespace pmt::optim
