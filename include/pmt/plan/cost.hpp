// SPDX-License-Identifier: Apache-2.0
#pragma once
// The cost of one virtual stage for one microbatch (plan/model.hpp's model, its legend there):
// the parameters a rank of the stage holds, its forward and backward time from the machine's
// rates or measured blocks, the tp all-reduces, and what it keeps alive (StageInputs), from a
// Gpt's own count (gpt_stages) or a ModelSpec's layers (spec_stages).

#include "pmt/plan/problem.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "pmt/core/error.hpp"
#include "pmt/core/precision.hpp"
#include "pmt/nn/gpt_config.hpp"
#include "pmt/parallel/schedule.hpp"
#include "pmt/parallel/stages.hpp"
#include "pmt/plan/model_spec.hpp"

namespace pmt::plan {

namespace detail {

/// Parameters of one rank of stage s (elements).
inline double stage_parameters(const nn::GptConfig& c, const parallel::StagePlan& plan, int s, int tp) {
  const double C = double(c.width), Cl = C / tp, V = double(c.vocab), T = double(c.context);
  double p = double(plan.count(s)) * (12 * C * Cl + 6 * Cl + 6 * C);
  if (s == 0) p += V * C / tp + T * C;
  if (s + 1 == plan.stages()) p += 2 * C + (plan.stages() > 1 ? V * C / tp : 0.0);
  return p;
}

/// One microbatch on stage s: forward and backward work (seconds alone) and the communication
/// each of them waits for (tp all-reduces not inside measured blocks).
struct StageCost {
  double forward = 0, backward = 0, tp_comm = 0;  // tp_comm: forward's; backward's is as much
};

/// One GPT block on one microbatch of b sequences.
inline StageCost block_cost(const Problem& pr, const Machine& mc, const Layout& l, std::size_t b) {
  const auto& c        = pr.model;
  const std::size_t tp = static_cast<std::size_t>(l.tp), T = c.context, N = b * T, C = c.width, Cl = C / tp,
                    Hl = c.heads / tp, hs = C / c.heads;
  const double sb = pr.activation_value_bytes();
  StageCost k;
  if (mc.block_seconds) {  // measured with all ranks at once: as work alone, times the share
    const double share = std::clamp(mc.core_share, 1e-3, 1.0);
    const auto fb      = mc.block_seconds(b, l.tp, l.sequence_parallel);
    k.forward = fb.first * share, k.backward = fb.second * share;
    return k;
  }
  // q, k, v (Col), proj (Row), fc (Col), fc2 (Row); attention: scores and weighted sum per head
  const double gemms = 3 * mc.gemm(N, Cl, C) + mc.gemm(N, C, Cl) + mc.gemm(N, 4 * Cl, C) + mc.gemm(N, C, 4 * Cl) +
                       double(b * Hl) * (mc.gemm(T, T, hs) + mc.gemm(T, hs, T));
  // memory-bound kernels: 2 LayerNorms, 2 residual adds (on N / tp rows with sequence
  // parallelism), pack / merge of heads, mask + softmax, GELU
  const double rows  = l.sequence_parallel ? 1.0 / double(tp) : 1.0;
  const double bytes = sb * (10.0 * N * C * rows + 16.0 * N * Cl + 4.0 * double(b * Hl) * T * T);
  k.forward          = gemms + mc.memory(bytes) + 24 * mc.kernel_seconds;
  k.backward         = 2 * k.forward;
  // attention and MLP outputs (backward: their inputs); sequence parallelism: an all-gather and a
  // reduce-scatter cost an all-reduce, and the backward gathers the Col inputs again (the mean of
  // 2 and 3)
  k.tp_comm = (l.sequence_parallel ? 2.5 : 2.0) * mc.all_reduce_on(sb * N * C, l.tp, 1);
  return k;
}

/// One block's attention core (q k^T, the masked softmax, times v, and the head split) on b
/// sequences: what selective recomputation repeats in the backward, from the GEMM rate and the
/// memory bandwidth.
inline double attention_core_forward(const Problem& pr, const Machine& mc, const Layout& l, std::size_t b) {
  const auto& c        = pr.model;
  const std::size_t tp = static_cast<std::size_t>(l.tp), T = c.context, N = b * T, Cl = c.width / tp, Hl = c.heads / tp,
                    hs = c.width / c.heads;
  const double sb      = pr.activation_value_bytes();
  return double(b * Hl) * (mc.gemm(T, T, hs) + mc.gemm(T, hs, T)) +
         mc.memory(sb * (8.0 * double(N) * double(Cl) + 4.0 * double(b * Hl) * double(T) * double(T))) +
         6 * mc.kernel_seconds;
}

/// One block's forward with its tp all-reduces: what recomputation repeats in the backward.
inline double block_forward(const Problem& pr, const Machine& mc, const Layout& l, std::size_t b) {
  const auto k = block_cost(pr, mc, l, b);
  return k.forward + k.tp_comm;
}

inline StageCost stage_cost(const Problem& pr, const Machine& mc, const Layout& l, const parallel::StagePlan& plan,
                            int s, std::size_t b) {
  const auto& c        = pr.model;
  const std::size_t tp = static_cast<std::size_t>(l.tp), T = c.context, N = b * T, C = c.width, Vl = c.vocab / tp;
  const double sb     = pr.activation_value_bytes();
  const double L      = double(plan.count(s));
  const double share  = std::clamp(mc.core_share, 1e-3, 1.0);
  const StageCost one = block_cost(pr, mc, l, b);
  StageCost k{L * one.forward, L * one.backward, L * one.tp_comm};
  if (mc.head_seconds) {
    // measured with all ranks at once (the embeddings, final norm, LM head, loss and their tp
    // all-reduces): on the last stage, as work alone
    if (s + 1 == plan.stages()) k.forward += mc.head_seconds(b, l.tp, l.sequence_parallel) * share;
    return k;
  }
  if (s == 0) {  // token + position embeddings; the vocab-parallel lookup's all-reduce
    k.forward += mc.memory(sb * 3.0 * N * C) + 4 * mc.kernel_seconds;
    k.backward += mc.memory(sb * 4.0 * N * C) + 4 * mc.kernel_seconds;
    // (sequence parallelism: the backward all-gathers the rows' gradient, half an all-reduce)
    k.tp_comm += (l.sequence_parallel ? 0.75 : 1.0) * mc.all_reduce_on(sb * N * C, l.tp, 1);
  }
  if (s + 1 == plan.stages()) {
    // final LayerNorm, logits, cross-entropy, and the LM head's backward done right away
    k.forward += mc.gemm(N, Vl, C) + mc.gemm(N, C, Vl) + mc.gemm(Vl, C, N) +
                 mc.memory(sb * (2.0 * N * C + 4.0 * N * Vl)) + 10 * mc.kernel_seconds;
    k.tp_comm += mc.all_reduce_on(sb * N * C, l.tp, 1) + 3 * mc.all_reduce_on(8.0 * N, l.tp, 1);
  }
  return k;
}

/// The makespan of one step's microbatches on p stages (schedule `kind`; p = 1: forward and
/// backward of each microbatch in turn), each stage run by `per_stage` ranks: an action computes
/// its work (seconds alone), then waits its communication (`wait`, no CPU); an activation or
/// gradient reaches the next stage `hop` after its action ends. With cores >= ranks every rank
/// computes at full speed: the usual critical path. With fewer cores, rank r sits on core
/// r mod cores (`mpiexec --map-by core`; in the Mesh's order the ranks of one stage are
/// consecutive, so they spread over the cores and stages share them) and computes at 1 / (ranks
/// computing on its core): a rank waiting in the pipeline's bubble leaves its core to the rank of
/// another stage beside it. (It runs the
/// same tables as parallel::check, which proves them and counts live microbatches, but there an
/// action's time is fixed; here it depends on how many ranks compute at once.)
/// With v `chunks` per stage the work and wait vectors are per virtual stage (c p + s) and
/// messages go round the ring of stages. With `ranks_per_node` > 0 (and less than all ranks) the
/// ranks sit on nodes of that many, consecutive in the Mesh's order, and the cores are split
/// evenly over the nodes: rank r on node r / ranks_per_node, on core r mod its node's cores, so a
/// rank lends its core only to ranks of its own node.
inline double simulate(parallel::ScheduleKind kind, int p, int m, const std::vector<double>& work_f,
                       const std::vector<double>& work_b, const std::vector<double>& wait, double hop, double cores,
                       int per_stage, int chunks = 1, int ranks_per_node = 0) {
  struct Act {
    bool forward;
    int mb;
    std::size_t vs;  // the virtual stage
  };
  const auto VS = static_cast<std::size_t>(p * chunks);
  std::vector<std::vector<Act>> order(static_cast<std::size_t>(p));
  if (p == 1) {
    for (int i = 0; i < m; ++i) order[0].push_back({true, i, 0}), order[0].push_back({false, i, 0});
  } else {
    const auto sc = parallel::make_schedule(kind, p, m, chunks);
    for (int s = 0; s < p; ++s)
      for (const auto& a : sc.per_stage[static_cast<std::size_t>(s)])
        if (a.kind == parallel::Action::Forward || a.kind == parallel::Action::Backward)
          order[static_cast<std::size_t>(s)].push_back(
              {a.kind == parallel::Action::Forward, a.mb, static_cast<std::size_t>(a.chunk * p + s)});
  }
  const double never = 1e300;
  std::vector<std::vector<double>> done_f(VS, std::vector<double>(static_cast<std::size_t>(m), never)), done_b = done_f;
  std::vector<std::size_t> next(static_cast<std::size_t>(p), 0);
  const int ranks = p * per_stage;
  if (cores >= ranks) {
    // a core per rank: every action starts when its input has arrived and its stage is free, at
    // full speed, so the makespan is the critical path through the table, found in one pass over
    // the actions (a stage's run stops at an input not yet computed; the sweeps go on until
    // every stage is through, as the event loop below would)
    std::vector<double> free_at(static_cast<std::size_t>(p), 0.0);
    for (bool moved = true; moved;) {
      moved = false;
      for (std::size_t s = 0; s < static_cast<std::size_t>(p); ++s)
        for (; next[s] < order[s].size(); ++next[s], moved = true) {
          const Act a       = order[s][next[s]];
          const auto i      = static_cast<std::size_t>(a.mb);
          const bool first  = a.forward ? a.vs == 0 : a.vs + 1 == VS;  // needs no message
          const double from = a.forward ? (a.vs == 0 ? 0.0 : done_f[a.vs - 1][i])
                                        : (a.vs + 1 == VS ? done_f[a.vs][i] : done_b[a.vs + 1][i]);
          if (from == never) break;
          const double start = std::max(free_at[s], (a.forward && first) ? 0.0 : first ? from : from + hop);
          free_at[s]         = (a.forward ? done_f : done_b)[a.vs][i] =
              start + (a.forward ? work_f[a.vs] : work_b[a.vs]) + wait[a.vs];
        }
    }
    return *std::max_element(free_at.begin(), free_at.end());
  }
  std::vector<int> phase(static_cast<std::size_t>(p),
                         0);  // 0 waiting for its input, 1 computing, 2 communicating
  std::vector<double> left(static_cast<std::size_t>(p), 0.0), until(static_cast<std::size_t>(p), 0.0);
  // the ranks on the cores: rank r (stage r / per_stage, the Mesh's order) of node r / rpn on its
  // node's core r mod node_slots, as `mpiexec --map-by core` places them (fewer cores than
  // ranks here: with a core per rank every rate is 1, and the pass above has answered)
  const int rpn = ranks_per_node > 0 && ranks_per_node < ranks && ranks % ranks_per_node == 0 ? ranks_per_node : ranks;
  const double node_cores = cores / (ranks / rpn);
  const int node_slots    = node_cores >= rpn ? rpn : std::max(1, static_cast<int>(std::lround(node_cores)));
  const double slot_speed = node_cores >= rpn ? 1.0 : std::min(1.0, node_cores / node_slots);
  const auto slot = [&](int r) { return static_cast<std::size_t>((r / rpn) * node_slots + (r % rpn) % node_slots); };
  std::vector<int> load(static_cast<std::size_t>(node_slots * (ranks / rpn)), 0);
  std::vector<double> rate(static_cast<std::size_t>(p), 1.0);
  double now = 0;
  for (int guard = 0; guard < 64 * (m + 1) * (p + 1) * chunks; ++guard) {
    bool all_done   = true;
    double ready_at = never;
    for (std::size_t s = 0; s < static_cast<std::size_t>(p); ++s) {
      if (next[s] == order[s].size()) continue;
      all_done = false;
      if (phase[s] != 0) continue;
      const Act a    = order[s][next[s]];
      const auto i   = static_cast<std::size_t>(a.mb);
      const double r = a.forward ? (a.vs == 0 ? 0.0 : done_f[a.vs - 1][i] + hop)
                                 : (a.vs + 1 == VS ? done_f[a.vs][i] : done_b[a.vs + 1][i] + hop);
      if (r <= now) {
        phase[s] = 1;
        left[s]  = a.forward ? work_f[a.vs] : work_b[a.vs];
      } else {
        ready_at = std::min(ready_at, r);
      }
    }
    if (all_done) return now;
    // each stage's rate: its slowest rank's share of the core it sits on
    std::fill(load.begin(), load.end(), 0);
    for (int r = 0; r < ranks; ++r)
      if (phase[static_cast<std::size_t>(r / per_stage)] == 1) ++load[slot(r)];
    for (std::size_t s = 0; s < static_cast<std::size_t>(p); ++s) {
      rate[s] = 1.0;
      for (int r = int(s) * per_stage; r < (int(s) + 1) * per_stage; ++r)
        rate[s] = std::min(rate[s], slot_speed / std::max(1, load[slot(r)]));
    }
    double dt = ready_at - now;
    for (std::size_t s = 0; s < static_cast<std::size_t>(p); ++s) {
      if (phase[s] == 1) dt = std::min(dt, left[s] / rate[s]);
      if (phase[s] == 2) dt = std::min(dt, until[s] - now);
    }
    dt = std::max(dt, 0.0);
    now += dt;
    for (std::size_t s = 0; s < static_cast<std::size_t>(p); ++s) {
      if (phase[s] == 1) {
        left[s] -= dt * rate[s];
        if (left[s] <= 1e-15 * (1 + now)) phase[s] = 2, until[s] = now + wait[order[s][next[s]].vs];
      }
      if (phase[s] == 2 && until[s] <= now) {
        const Act a                                                         = order[s][next[s]];
        (a.forward ? done_f : done_b)[a.vs][static_cast<std::size_t>(a.mb)] = now;
        phase[s]                                                            = 0;
        ++next[s];
      }
    }
  }
  return now;  // not reached for a checked schedule
}

}  // namespace detail

namespace detail {

/// What one virtual stage costs and holds for one microbatch: the input of assemble(), from the
/// Gpt's own count (gpt_stages) or from a ModelSpec (spec_stages).
struct StageInputs {
  StageCost cost;          ///< forward, backward (seconds alone) and the forward's tp all-reduces
  double parameters  = 0;  ///< elements one rank holds
  double activations = 0;  ///< bytes of one live microbatch (its saved values and the stage's input)
  double transient   = 0;  ///< bytes a backward allocates beyond them, at most
  double sends       = 0;  ///< bytes of the pipeline's send buffers (Memory::sends)
  double tp_bytes    = 0;  ///< bytes all-reduced over tp per microbatch, forward and backward
  /// ZeRO-2's gradient storage: the most elements one backward writes at once (a layer, or the
  /// embeddings), and those held from their first write to the step (a Gpt's tied table on
  /// pp = 1, a last stage's LM-head copy and final norm).
  double written_at_once = 0, held_to_step = 0;
  double largest_parameter = 0;  ///< elements: a bucket holds at least one whole parameter
  /// bf16 products on a copying path, in elements: the weights' copies (one per distinct shape,
  /// kept by the Workspace), and the activation-shaped operands of the largest product (their
  /// copies share the Workspace's blocks with the activations' temporaries of the same shapes,
  /// free by then: measured, what the largest product holds at once is what stays); bf16 copies
  /// (cuBLAS, the host BLAS's bf16 GEMM) share no block with fp32 temporaries: each distinct
  /// activation shape keeps its own, as many as one product holds of it (activation_copies)
  double weight_copies = 0, largest_product = 0, activation_copies = 0;
};

/// The pipeline's send buffers a stage holds per shape it sends. parallel::PipelineRunner keeps
/// one per send in flight (a send completes when the receiver takes it) and allocates another only
/// when more are in flight than ever before, so the count depends on the receivers' timing: one,
/// two in the runs measured (tests/plan/test_plan.cpp), up to a stage's live microbatches.
inline constexpr int pipeline_sends = 2;

/// The Gpt's virtual stages (the count in the file comment).
inline std::vector<StageInputs> gpt_stages(const Problem& pr, const Machine& mc, const Layout& l,
                                           const parallel::StagePlan& stages, std::size_t b) {
  const auto& c        = pr.model;
  const std::size_t tp = static_cast<std::size_t>(l.tp), T = c.context, N = b * T, C = c.width, Cl = C / tp,
                    Hl = c.heads / tp, Vl = c.vocab / tp;
  const double sb = pr.activation_value_bytes(), dN = double(N), dC = double(C), dCl = double(Cl);
  // the rows outside the tp regions: all of them, or 1 / tp with sequence parallelism
  const double split = l.sequence_parallel ? double(tp) : 1.0, rN = dN / split;
  const double TT = double(b * Hl) * double(T) * double(T);  // one T x T matrix per local head
  std::vector<StageInputs> out(static_cast<std::size_t>(stages.stages()));
  for (int vs = 0; vs < stages.stages(); ++vs) {
    // what this virtual stage's rank recomputes (Layout::recompute_stages)
    const bool full    = l.recompute && l.recomputes_on(vs % l.pp),
               attn    = l.recompute_attention && l.recomputes_on(vs % l.pp);
    const double block = sb * (4 * rN * dC + 4 * rN + (attn ? 12 * dN * dCl : 13 * dN * dCl + TT));
    auto& in           = out[std::size_t(vs)];
    const bool head = vs == 0, tail = vs + 1 == stages.stages();
    const double L = double(stages.count(vs));
    in.cost        = stage_cost(pr, mc, l, stages, vs, b);
    in.parameters  = stage_parameters(c, stages, vs, l.tp);
    {  // what ZeRO-2 holds (nn::Gpt announces a block, the final norm, the embeddings at once)
      const double blk = 12 * dC * dCl + 6 * dCl + 6 * dC, table = double(c.vocab) * dC / double(tp);
      const bool one       = stages.stages() == 1;  // the tied table is the head too: held all the backward
      in.written_at_once   = L > 0 ? blk : 0.0;
      in.largest_parameter = std::max(L > 0 ? 4 * dC * dCl : 0.0, head || tail ? table : 0.0);
      if (head) in.written_at_once = std::max(in.written_at_once, (one ? 0.0 : table) + double(T) * dC);
      if (head && one) in.held_to_step += table;
      if (tail) in.held_to_step += 2 * dC + (one ? 0.0 : table);
    }
    {  // the rank-2 products' operands (Linear: x W, dy W^T, x^T dy; the head: h t^T, g t, g^T h):
       // the weights (C, 3 Cl), (Cl, C), (C, 4 Cl), (4 Cl, C), the table (Vl, C); the largest pair
       // of activations, x^T dy of the MLP (N C + 4 N Cl) or of the head (N Vl + N C)
      const double vl    = double(Vl);
      in.weight_copies   = (L > 0 ? 12 * dC * dCl : 0.0) + (tail ? vl * dC : 0.0);
      in.largest_product = std::max(L > 0 ? dN * (dC + 4 * dCl) : 0.0, tail ? dN * (vl + dC) : 0.0);
      // the activation operands' columns per product (x W and dy W^T hold one, x^T dy two); per
      // distinct width the most one product holds, summed
      std::map<std::size_t, int> most;
      const auto product = [&most](std::size_t a, std::size_t b) {  // b = 0: one activation operand
        most[a] = std::max(most[a], b == a ? 2 : 1);
        if (b != 0 && b != a) most[b] = std::max(most[b], 1);
      };
      const std::size_t widths[4][2] = {{C, 3 * Cl}, {Cl, C}, {C, 4 * Cl}, {4 * Cl, C}};  // QKV, proj, fc1, fc2
      for (int i = 0; L > 0 && i < 4; ++i) {
        product(widths[i][0], 0), product(widths[i][1], 0), product(widths[i][0], widths[i][1]);
      }
      if (tail) product(C, 0), product(Vl, 0), product(Vl, C);
      for (const auto& [w, k] : most) in.activation_copies += dN * double(w) * k;
    }
    // with recomputation a block keeps only its input (N C) and its backward first runs its
    // forward again: one block's activations live at a time, and the blocks' forward (with its
    // tp all-reduces) is paid twice
    in.activations = L * (full ? sb * rN * dC : block) + sb * rN * dC + (head ? 8.0 * dN : 0.0) +
                     (tail ? sb * (rN * dC + 2 * rN) : 0.0) +
                     (tail && full ? sb * rN * dC : 0.0);  // the final LayerNorm's input, not recomputed
    // a block's backward: its MLP part and its attention's score gradient (b Hl T x T), and the
    // last stage's logits and their gradient: each a shape of its own in the workspace, which
    // keeps the most of each shape a step holds at once, so they add (measured). With the block
    // recomputed for its backward, what its layers free as their backward returns takes the
    // others (measured): the largest counts.
    in.transient            = sb * (full ? std::max(4 * dN * dCl + 2 * rN * dC, TT) : 4 * dN * dCl + 2 * rN * dC + TT);
    const double head_grads = tail ? sb * (2 * dN * double(Vl) + rN * dC) : 0.0;
    // selective recomputation: the attention's buffers and output, computed in the forward and
    // again in the backward, are shapes of their own in the workspace, held through the step
    if (attn) in.transient += sb * (5 * dN * dCl + TT);
    if (full && !attn && !l.sequence_parallel)
      in.transient = std::max(in.transient, head_grads);
    else
      in.transient += head_grads;
    // sequence parallelism: the gathered rows (N, C), a shape of their own in the workspace that
    // the split activations do not reuse: two at once (a Col layer's input gathered again beside
    // its dx before the reduce-scatter; the LM head's gathered input beside its gradient)
    if (l.sequence_parallel) in.transient += 2 * sb * dN * dC;
    // the block recomputed for its backward, beside what the workspace keeps of the backward
    // before it (buffers of other shapes, such as the logits, stay cached for the next step)
    if (full && L > 0) in.transient += block;
    // the pipeline's buffers beside: a receive of each kind posted ahead, and apart the send
    // buffers (Memory::sends)
    if (vs + 1 < stages.stages()) in.transient += sb * rN * dC;
    if (vs > 0) in.transient += sb * rN * dC;
    if (stages.stages() > 1) in.sends = pipeline_sends * sb * rN * dC;
    if (full) in.cost.backward += block_forward(pr, mc, l, b) * L;
    if (attn) in.cost.backward += attention_core_forward(pr, mc, l, b) * L;
    if (l.tp > 1) {  // per block 4 all-reduces of (N, C); embedding 1; LM head 1 and 3 of N values
      // (sequence parallelism, counting an all-gather or a reduce-scatter as half: per block 5,
      // the embedding 1.5)
      in.tp_bytes =
          l.sequence_parallel ? sb * dN * dC * (5.0 * L + 1.5 * head + tail) : sb * dN * dC * (4.0 * L + head + tail);
      if (tail) in.tp_bytes += 3.0 * 8.0 * dN;
    }
  }
  return out;
}

/// A ModelSpec's virtual stages: its layers' sums (model_spec.hpp).
inline std::vector<StageInputs> spec_stages(const Problem& pr, const Machine& mc, const Layout& l,
                                            const parallel::StagePlan& stages, std::size_t b) {
  const auto& spec = pr.spec;
  const double sb = pr.activation_value_bytes(), R = double(b) * spec.rows_per_sample;
  std::vector<StageInputs> out(static_cast<std::size_t>(stages.stages()));
  for (int vs = 0; vs < stages.stages(); ++vs) {
    auto& in         = out[std::size_t(vs)];
    const auto first = stages.begin(vs), last = stages.end(vs);
    // the stage's input, unless its first layer keeps it anyway (always, with recomputation: the
    // chunk keeps only its input, and its backward runs its forward again, whose saved values
    // then live for the chunk's backward)
    const bool full = l.recompute && l.recomputes_on(vs % l.pp);
    in.activations  = spec.layers[first].saved > 0 && !full ? 0.0 : sb * R * spec.layers[first].input_local(l.tp);
    double saved = 0, forward = 0;
    for (std::size_t i = first; i < last; ++i) {
      const auto& y  = spec.layers[i];
      const double f = R * y.flops_local(l.tp);
      // the products at the GEMM rate, every layer's input and output through memory, 2 kernels
      const double fwd = f / (mc.gemm_gflops * 1e9) + mc.memory(sb * R * (y.input_local(l.tp) + y.output_local(l.tp))) +
                         2 * mc.kernel_seconds;
      in.cost.forward += fwd;
      in.cost.backward += 2 * fwd;
      forward += fwd;
      // estimate() waits tp_comm once in the forward and once in the backward: the mean of the two
      in.cost.tp_comm += 0.5 * (mc.all_reduce_on(sb * R * y.forward_reduce, l.tp, 1) +
                                mc.all_reduce_on(sb * R * y.backward_reduce, l.tp, 1));
      in.parameters += y.parameters_local(l.tp);
      in.written_at_once = std::max(in.written_at_once, y.parameters_local(l.tp));  // a Chain announces layer by layer
      in.largest_parameter = std::max(in.largest_parameter, y.parameters_local(l.tp));
      saved += sb * R * y.saved_local(l.tp);
      // a backward adds its dx (its dy is the next layer's dx, or a received or the loss gradient)
      in.transient = std::max(in.transient, sb * R * y.input_local(l.tp));
      if (l.tp > 1) in.tp_bytes += sb * R * (y.forward_reduce + y.backward_reduce);
    }
    if (full) {
      in.transient += saved;
      in.cost.backward += forward + in.cost.tp_comm;
    } else {
      in.activations += saved;
    }
    // the stage's output: sent to the next stage (in flight until the next stage takes it), or
    // on the last stage the loss gradient the backward starts from
    const double out_bytes = sb * R * spec.layers[last - 1].output_local(l.tp);
    in.activations += out_bytes;
    // the pipeline's buffers beside: a receive of each kind posted ahead (the next input, the
    // next output gradient) and the output's copy in a send buffer as it goes out
    if (vs + 1 < stages.stages()) in.transient += out_bytes, in.sends = out_bytes;
    if (vs > 0) in.transient += sb * R * spec.layers[first].input_local(l.tp);
  }
  return out;
}

/// Bytes a pipeline cut sends per microbatch (the largest of the cuts between virtual stages).
inline double hop_bytes(const Problem& pr, const Layout& l, const parallel::StagePlan& stages, std::size_t b) {
  if (pr.spec.empty())
    return pr.activation_value_bytes() * double(b * pr.model.context) * double(pr.model.width) /
           (l.sequence_parallel ? double(l.tp) : 1.0);
  double most = 0;
  for (int vs = 0; vs + 1 < stages.stages(); ++vs)
    most = std::max(most, pr.spec.layers[stages.end(vs) - 1].output_local(l.tp));
  return pr.activation_value_bytes() * double(b) * pr.spec.rows_per_sample * most;
}

}  // namespace detail

}  // namespace pmt::plan
