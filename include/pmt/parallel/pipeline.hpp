// SPDX-License-Identifier: Apache-2.0
#pragma once
// PipelineRunner: executes a checked schedule table (parallel/schedule.hpp) on this rank's
// pipeline stage of a model. Per action of the table, in order:
//   RecvAct i / RecvGrad i  wait for the message; its receive was posted one receive ahead
//                           (a receive of each kind is always in flight, overlapping compute),
//                           unless point-to-point is stream-ordered (below)
//   Forward i               model.forward_chunk in activation slot k (a free slot, taken now),
//                           with the random keys' first row set to microbatch i's global row
//   Backward i              model.backward_chunk in the slot of i, which is then free again
// Without gradients (the step context's grad off: evaluation) the runner takes the forward-only
// table (parallel::forward_only) instead of the schedule asked for, and frees each slot as soon
// as its forward has run.
//   SendAct i / SendGrad i  non-blocking send from one of the runner's send buffers (the tensor
//                           copied there; they stay from step to step); completed sends are
//                           reaped as the run goes and all are waited for at the end
// Stream-ordered point-to-point (the communicator's stream_ordered<Exec>(): NCCL on a GPU, where
// a receive holds the stream until its message came and a send until its receiver took it; the
// MPI backend under PMT_COMM_RULES=nccl models it on the CPU): nothing is posted ahead; each run
// of consecutive send/receive actions of the table is issued as one group (comm::group, as
// Megatron's send_forward_recv_backward pairs them) and its receives are waited for at once.
// check() proves every table it accepts free of deadlock under that rule too.
// While a forward or backward computes, the model's calls to pmt::progress() poll the pending
// sends and receives, so a large message (MPI's rendezvous protocol) moves during the compute
// instead of after it.
// Activations go to stage s+1 (tag 11), their gradients to s-1 (tag 12) on the pp communicator;
// with model chunks (interleaved schedules) round the ring: the last stage's chunk c feeds the
// first stage's chunk c+1. Messages of one kind between two stages are matched in table order,
// which check() proved consistent and free of deadlock for every stage together before the
// first run. Each live (chunk, microbatch) has its own activation slot.
// The model is a stage module (parallel/stage_module.hpp): forward_chunk / backward_chunk run
// one chunk of one microbatch, input_extent / output_extent size the receive buffers. Stats: wall time, compute time
// (forward + backward, fenced), time waiting in receives, the peak of live (chunk, microbatch) pairs (forward done,
// backward not) and each action's timing.

#include "pmt/comm/collectives.hpp"
#include "pmt/comm/communicator.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/comm/progress.hpp"
#include "pmt/comm/request.hpp"
#include "pmt/core/activation_slot.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/instrument.hpp"
#include "pmt/core/step_context.hpp"
#include "pmt/core/workspace.hpp"
#include "pmt/parallel/schedule.hpp"
#include "pmt/parallel/stage_module.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace pmt::parallel {

/// \brief One executed action: seconds since the run started.
struct StageEvent {
  Action action;
  double start = 0, end = 0;
};

/// \brief What the last run of a PipelineRunner measured on this rank.
struct PipelineStats {
  double wall = 0, compute = 0, recv_wait = 0;  ///< seconds
  int peak_live = 0;  ///< most (chunk, microbatch) pairs alive at once (forward done, backward not)
  std::vector<StageEvent> events;
  /// \brief The idle fraction of this stage: 1 - compute / wall.
  double idle() const { return wall > 0 ? 1.0 - compute / wall : 0.0; }
};

/// \brief Runs one stage's part of a pipeline schedule (see the file comment) for any stage module:
/// run() takes the step's microbatches and returns this stage's loss sum; stats() says what the
/// last run measured. \throws pmt::ConfigError for no microbatch or a schedule the model's
/// chunks cannot run.
template <class Model, class Exec, class Backend>
class PipelineRunner {
  static_assert(check_stage_module<Model, Exec>());

 public:
  using Batch      = typename Model::Batch;
  using Activation = typename Model::Activation;
  /// \brief Called before each Backward action with the microbatch and whether it is the last
  /// backward of its chunk in the run (its gradients are then final: data-parallel sync arms there).
  using BackwardHook = std::function<void(int mb, bool last)>;

  PipelineRunner(const Mesh<Backend>& mesh, Model& model)
      : m_pp(mesh.comm(Axis::pp)),
        m_model(model),
        m_root(mesh.is_root()),
        m_world(mesh.world().size()),
        m_me(mesh.world().rank()),
        m_stride(mesh.degree(Axis::dp) * mesh.degree(Axis::tp)),
        m_chunks(model.chunks()) {
    pmt::detail::require<ConfigError>(
        model.stages() == m_pp.size() && model.stage() == m_pp.rank(), "pmt::parallel::PipelineRunner", [&] {
          return pmt::detail::str("the model is stage ", model.stage(), " of ", model.stages(), " but this rank is pp ",
                                  m_pp.rank(), " of ", m_pp.size());
        });
  }

  /// \brief The table of `kind` for m microbatches on this model's stages and chunks, checked by
  /// check() when first asked for (cached). 1F1B with m < stages warns once on the world root:
  /// it runs correctly but with GPipe's bubble and memory.
  /// \throws pmt::ConfigError from the builders (interleaved 1F1B: m a multiple of the stages)
  /// or the checker.
  const Schedule& schedule(ScheduleKind kind, int m) { return table(static_cast<int>(kind), m); }
  /// \brief The forward-only table for m microbatches (evaluation), checked and cached likewise.
  const Schedule& forward_schedule(int m) { return table(forward_key, m); }

 private:
  static constexpr int forward_key = -1;  // the tables' key of the forward-only pass
  const Schedule& table(int kind_key, int m) {
    const auto key = std::make_pair(kind_key, m);
    auto it        = m_tables.find(key);
    if (it == m_tables.end()) {
      const auto kind = static_cast<ScheduleKind>(kind_key);
      Schedule sc     = kind_key == forward_key ? forward_only(m_model.stages(), m, m_chunks)
                                                : make_schedule(kind, m_model.stages(), m, m_chunks);
      m_reports[key]  = check(sc);
      if (kind_key != forward_key && kind == ScheduleKind::OneFOneB && m < m_model.stages() && m_root)
        std::fprintf(stderr,
                     "pmt: warning: 1F1B with %d microbatches on %d pipeline stages has no steady phase: it runs "
                     "like GPipe (bubble %.0f%%); use at least %d microbatches\n",
                     m, m_model.stages(), 100.0 * ScheduleReport::theory(m_model.stages(), m), m_model.stages());
      it = m_tables.emplace(key, std::move(sc)).first;
    }
    return it->second;
  }

 public:
  /// \brief The checker's report for a schedule built by schedule().
  const ScheduleReport& report(ScheduleKind kind, int m) {
    return (schedule(kind, m), m_reports.at({static_cast<int>(kind), m}));
  }

  /// \brief Runs this stage's part of one step over the microbatches (every stage gets the same
  /// list: the first reads the input, the last the targets). Returns the sum of this
  /// stage's microbatch losses in microbatch order (non-zero on the last stage only).
  /// `first_row` is the global index of the first microbatch's first row (rows_of numbers the
  /// rest); without gradients (evaluation) it runs the forward-only table instead of `kind`'s.
  double run(const Exec& exec, ScheduleKind kind, const std::vector<Batch>& mbs, double normaliser,
             const BackwardHook& before_backward = {}, std::uint64_t first_row = 0) {
    m_started   = false;
    const int m = static_cast<int>(mbs.size());
    pmt::detail::require<ConfigError>(m >= 1, "pmt::parallel::PipelineRunner::run",
                                      [&] { return std::string("no microbatch"); });
    // every microbatch's activation shapes on every stage before any message: a model that cannot
    // take one raises here on all ranks alike, not on one stage while the others wait for it
    for (const auto& mb : mbs)
      for (int k = 0; k < m_chunks; ++k) (void)m_model.input_extent(k, mb), (void)m_model.output_extent(k, mb);
    const bool forward_only_pass = !step_context().grad;
    const auto& actions          = (forward_only_pass ? forward_schedule(m) : schedule(kind, m))
                              .per_stage[static_cast<std::size_t>(m_model.stage())];
    std::vector<std::uint64_t> row0(mbs.size(), first_row);  // each microbatch's first global row
    for (std::size_t i = 1; i < mbs.size(); ++i) row0[i] = row0[i - 1] + rows_of(m_model, mbs[i - 1]);
    const auto M = static_cast<std::size_t>(m);
    const int s = m_model.stage(), p = m_model.stages();
    const int prev = (s + p - 1) % p, next = (s + 1) % p;  // the ring of stages (chunks wrap round)
    // buffers and slots per (chunk, microbatch): index chunk * M + mb
    const auto at = [M](const Action& a_) {
      return static_cast<std::size_t>(a_.chunk) * M + static_cast<std::size_t>(a_.mb);
    };
    const std::size_t n = M * static_cast<std::size_t>(m_chunks);
    std::vector<Activation> in_act(n), out(n), in_grad(n);
    std::vector<double> losses(n, 0.0);
    std::vector<std::size_t> slot_of(n, 0), free_slots;
    std::size_t slots = 0;
    int live          = 0;
    std::vector<std::size_t> last_backward(static_cast<std::size_t>(m_chunks),
                                           0);  // per chunk: its last backward's index
    for (std::size_t k = 0; k < actions.size(); ++k)
      if (actions[k].kind == Action::Backward) last_backward[static_cast<std::size_t>(actions[k].chunk)] = k;
    // One receive in flight per peer stage, posted in table order. With two stages (prev == next)
    // activations and gradients come from the same peer, and one receive serves both kinds: NCCL
    // matches the messages between a pair in issue order whatever their tags, and check() proved
    // that each stage receives from a peer in the order the peer sends.
    struct Pending {
      std::size_t at = static_cast<std::size_t>(-1);
      comm::Request rq;
    } next_act, next_grad;
    const bool one_peer = prev == next;
    const auto takes    = [&](Action::Kind kind_, bool act_slot) {
      return (kind_ == Action::RecvAct && (act_slot || one_peer)) ||
             (kind_ == Action::RecvGrad && (!act_slot || one_peer));
    };
    const auto post = [&](Pending& p, std::size_t from, bool act_slot) {
      p.at = static_cast<std::size_t>(-1);
      for (std::size_t k = from; k < actions.size(); ++k)
        if (takes(actions[k].kind, act_slot)) {
          const Action& a_ = actions[k];
          p.rq             = issue_recv(exec, a_, mbs[static_cast<std::size_t>(a_.mb)],
                            a_.kind == Action::RecvAct ? in_act[at(a_)] : in_grad[at(a_)]);
          p.at             = k;
          return;
        }
    };
    // Stream-ordered point-to-point (NCCL on a GPU; MPI under PMT_COMM_RULES=nccl): a receive
    // holds the stream until its message came and a send until its receiver took it, so nothing
    // is posted ahead; each run of consecutive send/receive actions of the table is one group,
    // issued at its first action (check() proved the tables free of deadlock under that rule).
    const bool ordered = m_pp.template stream_ordered<Exec>();
    m_started          = true;  // from here on an error may leave other stages waiting
    if (!ordered) {
      post(next_act, 0, /*act_slot=*/true);
      if (!one_peer) post(next_grad, 0, /*act_slot=*/false);
    }
    comm::ProgressScope progress([&] {
      for (auto& b : m_send_buffers)
        if (b.busy && b.rq.test()) b.busy = false;
      next_act.rq.test();
      next_grad.rq.test();
    });
    m_stats        = PipelineStats{};
    const auto t0  = clock::now();
    const auto now = [&] { return std::chrono::duration<double>(clock::now() - t0).count(); };
    ++m_runs;
    // Trace flow ids: the same on the sending and the receiving rank (run, kind, sender, the
    // sender's chunk and microbatch).
    const auto flow = [&](bool act, std::int64_t sender, int chunk, int mb_) {
      return ((m_runs * 2 + (act ? 0 : 1)) * m_world + sender) * 1000003 + chunk * m + mb_;
    };
    const auto world_rank = [&](int stage) { return m_me + (stage - s) * m_stride; };  // mesh: pp varies slowest
    const auto label      = [&](const Action& a_) {
      return [a_, v = m_chunks] {
        return std::string(kind_name(a_.kind)) + " " + std::to_string(a_.mb) +
               (v > 1 ? " chunk " + std::to_string(a_.chunk) : "");
      };
    };
    m_failed_at.clear();
    for (std::size_t k = 0; k < actions.size(); ++k) {
      const Action a     = actions[k];
      const auto i       = at(a);
      const auto& mb     = mbs[static_cast<std::size_t>(a.mb)];
      const double start = now();
      // an error raised by this action names it (pmt::Error's context), and failed_at() keeps it
      const ErrorContext where(where_is(a));
      try {
        if (ordered && is_message(a.kind)) {
          k = run_group(exec, actions, k, mbs, in_act, in_grad, out, flow, world_rank, label, now);
          continue;
        }
        switch (a.kind) {
          case Action::RecvAct:
          case Action::RecvGrad: {
            // the sender of an activation is stage s-1, of a gradient stage s+1 (its chunk: sender_chunk)
            const bool act = a.kind == Action::RecvAct;
            const Instrument instrument("pmt::parallel::pipeline::recv", Track::P2P, label(a), -1,
                                        flow(act, world_rank(act ? prev : next), sender_chunk(a), a.mb));
            auto& p = act || one_peer ? next_act : next_grad;
            pmt::detail::require<CommError>(p.at == k, "pmt::parallel::PipelineRunner::run", [&] {
              return std::string("the receive in flight is not this action's (a schedule the checker should refuse)");
            });
            p.rq.wait();
            post(p, k + 1, act || one_peer);
            m_stats.recv_wait += now() - start;
            break;
          }
          case Action::Forward: {
            const Instrument instrument("pmt::parallel::pipeline::forward", Track::Compute, label(a));
            if (free_slots.empty()) free_slots.push_back(slots++);
            slot_of[i] = free_slots.back();
            free_slots.pop_back();
            m_stats.peak_live = std::max(m_stats.peak_live, ++live);
            {
              ActivationSlot slot(slot_of[i]);
              const RandomRowScope rows(row0[static_cast<std::size_t>(a.mb)]);
              out[i] = m_model.forward_chunk(exec, a.chunk, mb, in_act[i], normaliser, &losses[i]);
            }
            exec.fence();
            in_act[i] = Activation();  // the stage's layers keep what they need in the slot
            if (forward_only_pass) free_slots.push_back(slot_of[i]), --live;  // nothing kept for a backward
            m_stats.compute += now() - start;
            break;
          }
          case Action::Backward: {
            const Instrument instrument("pmt::parallel::pipeline::backward", Track::Compute, label(a));
            if (before_backward) before_backward(a.mb, k == last_backward[static_cast<std::size_t>(a.chunk)]);
            {
              ActivationSlot slot(slot_of[i]);
              out[i] = m_model.backward_chunk(exec, a.chunk, in_grad[i]);
            }
            exec.fence();
            in_grad[i] = Activation();
            free_slots.push_back(slot_of[i]);
            --live;
            m_stats.compute += now() - start;
            break;
          }
          case Action::SendAct:
          case Action::SendGrad: {
            const Instrument instrument("pmt::parallel::pipeline::send", Track::P2P, label(a),
                                        flow(a.kind == Action::SendAct, m_me, a.chunk, a.mb));
            issue_send(exec, a, out[i]);
            break;
          }
        }
      } catch (...) {
        m_failed_at = where_is(a);
        throw;
      }
      m_stats.events.push_back({a, start, now()});
      reap_sends();  // completed sends' buffers serve again as the run goes
    }
    for (auto& b : m_send_buffers)
      if (b.busy) b.rq.wait(), b.busy = false;
    m_stats.wall = now();
    double loss  = 0;
    for (double l : losses) loss += l;
    return loss;
  }

  /// \brief What the last run measured on this rank.
  const PipelineStats& stats() const noexcept { return m_stats; }

 private:
  static bool is_message(Action::Kind k) {
    return k == Action::SendAct || k == Action::SendGrad || k == Action::RecvAct || k == Action::RecvGrad;
  }
  void reap_sends() {
    for (auto& b : m_send_buffers)
      if (b.busy && b.rq.test()) b.busy = false;
  }
  /// The ring of stages: the previous stage and the next (chunks wrap round).
  std::pair<int, int> neighbours() const {
    const int s = m_model.stage(), p = m_model.stages();
    return {(s + p - 1) % p, (s + 1) % p};
  }
  /// The chunk a received message was sent from: an activation comes from stage s-1's chunk, a
  /// gradient from stage s+1's; round the ring the last stage's chunk c feeds the first's c+1.
  int sender_chunk(const Action& a) const {
    const int next = neighbours().second;
    return a.kind == Action::RecvAct ? a.chunk - (m_model.stage() == 0 ? 1 : 0) : a.chunk + (next == 0 ? 1 : 0);
  }
  /// Sends `x` for action `a` (an activation to the next stage, a gradient to the previous) from a
  /// send buffer of the runner's (see send_buffer); x's own memory returns to the workspace at
  /// once, whenever the receiver takes the message.
  void issue_send(const Exec& exec, const Action& a, Activation& x) {
    const auto [prev, next] = neighbours();
    SendBuffer& sb          = send_buffer(x);
    Kokkos::deep_copy(exec, sb.buf, x);
    exec.fence();
    sb.rq   = a.kind == Action::SendAct ? comm::isend(m_pp, exec, sb.buf, next, tag_act)
                                        : comm::isend(m_pp, exec, sb.buf, prev, tag_grad);
    sb.busy = true;
    x       = Activation();
  }
  /// Posts the receive of action `a` (an activation from the previous stage, a gradient from the
  /// next) into `buf`, a workspace buffer of the message's shape for microbatch `mb`.
  comm::Request issue_recv(const Exec& exec, const Action& a, const Batch& mb, Activation& buf) {
    const auto [prev, next] = neighbours();
    const bool act          = a.kind == Action::RecvAct;
    const auto e            = act ? m_model.input_extent(a.chunk, mb) : m_model.output_extent(a.chunk, mb);
    buf                     = workspace_view<Activation>("pmt::parallel::pipeline::recv", e[0], e[1]);
    return act ? comm::irecv(m_pp, exec, buf, prev, tag_act) : comm::irecv(m_pp, exec, buf, next, tag_grad);
  }
  /// Stream-ordered point-to-point: the run of send/receive actions from `first` on, issued as
  /// one group (comm::group), then its receives waited for. Returns the run's last index.
  template <class Flow, class WorldRank, class Label, class Now>
  std::size_t run_group(const Exec& exec, const std::vector<Action>& actions, std::size_t first,
                        const std::vector<Batch>& mbs, std::vector<Activation>& in_act,
                        std::vector<Activation>& in_grad, std::vector<Activation>& out, const Flow& flow,
                        const WorldRank& world_rank, const Label& label, const Now& now) {
    const auto [prev, next] = neighbours();
    const auto M            = mbs.size();
    const auto at           = [M](const Action& a_) {
      return static_cast<std::size_t>(a_.chunk) * M + static_cast<std::size_t>(a_.mb);
    };
    std::size_t last = first;
    while (last + 1 < actions.size() && is_message(actions[last + 1].kind)) ++last;
    const double start = now();
    std::vector<std::pair<std::size_t, comm::Request>> receives;  // (action index, its receive)
    comm::group(m_pp, exec, [&] {
      for (std::size_t k = first; k <= last; ++k) {
        const Action& a = actions[k];
        const auto i    = at(a);
        if (a.kind == Action::SendAct || a.kind == Action::SendGrad) {
          const Instrument instrument("pmt::parallel::pipeline::send", Track::P2P, label(a),
                                      flow(a.kind == Action::SendAct, m_me, a.chunk, a.mb));
          issue_send(exec, a, out[i]);
        } else {
          receives.emplace_back(k, issue_recv(exec, a, mbs[static_cast<std::size_t>(a.mb)],
                                              a.kind == Action::RecvAct ? in_act[i] : in_grad[i]));
        }
      }
    });
    for (auto& [k, rq] : receives) {
      const Action& a = actions[k];
      const bool act  = a.kind == Action::RecvAct;
      const Instrument instrument("pmt::parallel::pipeline::recv", Track::P2P, label(a), -1,
                                  flow(act, world_rank(act ? prev : next), sender_chunk(a), a.mb));
      rq.wait();
    }
    const double end = now();
    m_stats.recv_wait += receives.empty() ? 0.0 : end - start;
    for (std::size_t k = first; k <= last; ++k) m_stats.events.push_back({actions[k], start, end});
    reap_sends();
    return last;
  }

 public:
  /// \brief The action the last run failed in ("pipeline stage 1/4, forward of microbatch 3"),
  /// "" when it did not fail.
  const std::string& failed_at() const noexcept { return m_failed_at; }
  /// \brief Whether the last run got past its checks (the extents of every microbatch, the
  /// schedule) to its first message: an error before that is raised on every stage alike.
  bool started() const noexcept { return m_started; }

 private:
  std::string where_is(const Action& a) const {
    return pmt::detail::str("pipeline stage ", m_model.stage(), "/", m_model.stages(), ", ", kind_name(a.kind),
                            " of microbatch ", a.mb, m_chunks > 1 ? pmt::detail::str(" in chunk ", a.chunk) : "");
  }
  std::string m_failed_at;
  bool m_started                = false;
  using clock                   = std::chrono::steady_clock;
  static constexpr int tag_act  = 11;
  static constexpr int tag_grad = 12;
  comm::Communicator<Backend> m_pp;
  Model& m_model;
  bool m_root;
  std::int64_t m_world, m_me, m_stride;  // world size, rank, and the world-rank distance between stages
  int m_chunks;
  std::int64_t m_runs = 0;
  std::map<std::pair<int, int>, Schedule> m_tables;
  std::map<std::pair<int, int>, ScheduleReport> m_reports;
  PipelineStats m_stats;
  /// A buffer a tensor is sent from, and its send (busy until the send completes).
  struct SendBuffer {
    Activation buf;
    comm::Request rq;
    bool busy = false;
  };
  /// The runner keeps its send buffers from step to step: how many sends are in flight at once
  /// depends on when the receivers take them, and that timing must not decide what the workspace
  /// holds. A new buffer is allocated only when more sends of a shape are in flight than ever before.
  SendBuffer& send_buffer(const Activation& x) {
    for (auto& b : m_send_buffers)
      if (!b.busy && b.buf.extent(0) == x.extent(0) && b.buf.extent(1) == x.extent(1)) return b;
    m_send_buffers.push_back(
        {Activation(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("pmt::parallel::pipeline::send")),
                    x.extent(0), x.extent(1)),
         comm::Request(), false});
    return m_send_buffers.back();
  }
  std::deque<SendBuffer> m_send_buffers;  // a deque: references stay valid as it grows
};

}  // namespace pmt::parallel
