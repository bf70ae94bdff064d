// SPDX-License-Identifier: Apache-2.0
#pragma once
// The planner's model of one training step of a Gpt (nn/gpt.hpp) with the Trainer
// (train/trainer.hpp) on a dp x tp x pp layout, m microbatches, a schedule, model chunks per stage
// (interleaved 1F1B: the plan and the costs below are per virtual stage, a rank adds up its
// chunks) and ZeRO-1 on or off:
// predicted step time (compute, tp / pp / dp communication, pipeline bubble) and peak memory per
// rank, from a Machine (compute, memory and link rates: measured by plan/calibrate.hpp or given).
// It counts what pmt's code allocates and runs, layer by layer (legend: s bytes per value,
// b sequences per microbatch, N = b T tokens, C width, Cl = C / tp, Hl = heads / tp, Vl = V / tp):
//   parameters  per block 12 C Cl + 6 Cl + 6 C (LayerNorms and Row biases are replicated over tp;
//   the key projection has no bias);
//               first stage + V C / tp + T C; last stage + 2 C (+ V C / tp, the tied head's copy,
//               pp > 1)
//   gradients   as many; optimizer AdamW 2 P; ZeRO-1 P (flat buffer) + 4 P / dp + P / dp bytes
//   dp buckets  P with dp > 1 and no ZeRO (parallel/grad_sync.hpp); by data-parallel mode (DpMode):
//               bf16 2 P bytes of wire + P residual, local SGD none, DiLoCo 2 P (anchor and
//               momentum), bounded staleness (S + 1) P
//   activations per block and live microbatch s (4 N C + 4 N + 13 N Cl + b Hl T^2: one T x T
//               matrix per head, the softmax output); the stage's input N C; the last stage's
//               LM-head gradient N C; live microbatches: the schedule's count per stage
//               (parallel::check: 1F1B p - s, GPipe m; pp = 1: 1)
//   sequence    (Layout::sequence_parallel, nn::GptOptions::sequence_parallel; tp > 1) the values
//   parallel    outside the tp regions are split over tp: a block keeps 4 N C / tp + 4 N / tp
//               + 13 N Cl + b Hl T^2; the stage's input, the LM-head gradient and the pipeline's
//               messages are N C / tp; the norms and residual adds move 1 / tp of the bytes; two
//               gathered (N, C) buffers join the transient (a shape the split activations do not
//               reuse); per block the forward all-gathers and reduce-scatters twice (as much as 2
//               all-reduces), the backward all-gathers 4 times (the Col layers' inputs again) and
//               reduce-scatters twice (3 all-reduces)
//   attention   (Layout::recompute_attention, nn::GptOptions::recompute_attention: selective)
//   recompute   a block keeps [q | k | v] instead of the attention's buffers: 12 N Cl in place of
//               13 N Cl + b Hl T^2; the attention's buffers (4 N Cl + b Hl T^2) and output (N Cl),
//               computed in the forward and again in the backward, join the transient (the
//               workspace holds their shapes through the step) with the last stage's logits and
//               their gradient beside the score gradient; the backward runs the core again
//               (from the GEMM rate and the memory bandwidth, also when the blocks are measured)
//   per stage   (Layout::recompute_stages) only the first stages recompute; each stage is
//               counted as it runs
//   recompute   (Layout::recompute, nn::GptOptions::recompute) a block keeps N C instead, one
//               block's activations join the transient, and the blocks' forward with its tp
//               all-reduces is paid again in the backward; a ModelSpec's chunk keeps its input
//               and its saved values join the transient
//   transient   a block's backward (4 N Cl + 2 N C: the incoming gradient, one MLP-sized
//               gradient and a residual's), its attention's score gradient (b Hl T^2, allocated
//               by the backward only) and the last stage's logits and their gradient
//               (2 N Vl + N C), times s, summed: the workspace keeps per shape the most a step
//               holds at once, and these are shapes of their own (with full recomputation the
//               largest of them: the recomputed block's buffers, freed as its layers' backward
//               returns, take the rest); the pipeline's receives, one of each kind posted ahead
//   sends       the pipeline's send buffers, two per stage with pp > 1 (Memory::sends: a run
//               holds one per send in flight, as many as the receivers' timing leaves)
//   scratch     Machine::matmul_scratch_bytes: what the host's Kokkos keeps for the portable
//               matmul kernel's packed panels once it ran (per thread, for the process; calibrate()
//               fills it)
//   time        per microbatch and stage: its blocks' forward and backward (measured: pmt's
//               GptBlock over tp with every rank at once, tp all-reduces included; or from the
//               GEMMs at the machine's rate for each shape, the memory-bound kernels' bytes and a
//               launch cost per kernel, and the tp all-reduces: latency + 2 (g - 1) / g bytes /
//               bandwidth), the first stage's embeddings, the last stage's head and loss.
//               The step's microbatches are simulated on the schedule's table with processor
//               sharing (simulate(): rank r on core r mod cores, of its node's cores where
//               the ranks span nodes, computes at 1 / (ranks computing on its core), so on
//               shared cores a rank waiting in the bubble lends its core to its neighbour on
//               the node; with a core per rank it is the usual critical path),
//               activations and gradients one
//               p2p hop apart; then the dp gradient all-reduce (overlapping the last backward when
//               it has more than one bucket) or ZeRO's reduce-scatter + all-gather, and the
//               optimizer (zero_grad, norm, AdamW on what the rank updates). The dp modes: bf16
//               all-reduces half the bytes (plus packing with the residual); local SGD and DiLoCo
//               all-reduce the parameters every H steps, blocking (DiLoCo's outer step reads and
//               writes three copies); bounded staleness exposes what its all-reduce does not fit
//               into S steps.
// Any other model: a Problem with a ModelSpec (plan/model_spec.hpp; a Chain reports one,
// plan/describe.hpp) is counted from its layers' own figures instead of the Gpt's formulas above:
// per stage the sum of its layers' parameters, saved values and forward FLOPs (at the GEMM rate,
// each layer's input and output through memory, the backward twice the forward), its layers'
// tp all-reduces; per live microbatch its layers' saved values and its output (in flight to the
// next stage, or the loss gradient); as transient the widest layer's input gradient and the
// pipeline's receive buffers posted ahead and send copy; its stages are balanced as StagedModel
// balances a Chain. The schedule's simulation, the dp / ZeRO tail and the optimizer are the same.
// Every number is a prediction for the heaviest stage (memory) or the critical path (time); the
// planner (plan/planner.hpp) ranks layouts by it, and bench/plan_check.py measures how well.

#include "pmt/plan/cost.hpp"
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
#include "pmt/train/dp_all_reduce.hpp"
#include "pmt/train/dp_local.hpp"
#include "pmt/train/dp_stale.hpp"
#include "pmt/train/dp_zero.hpp"

namespace pmt::plan {

/// \brief The stage plan a layout runs: the problem's layers balanced by forward FLOPs over
/// pp * chunks virtual stages (a Gpt's as Gpt::balanced_plan, a ModelSpec's as StagedModel's).
inline parallel::StagePlan stage_plan(const Problem& pr, int virtual_stages) {
  if (pr.spec.empty()) return nn::gpt_balanced_plan(pr.model, virtual_stages);
  std::vector<parallel::LayerCost> costs;
  for (const auto& y : pr.spec.layers) {
    const double n = y.parameters + y.replicated_parameters;
    costs.push_back({n, n > 0 ? 2 * n : 1.0});  // as nn::StagedModel balances a Chain
  }
  return parallel::balanced_stages(costs, virtual_stages);
}

/// \brief What the strategy the Trainer runs for layout `l` says it does over dp
/// (train::DpCharge, declared beside each strategy): the costs below branch on it. Compression
/// (bf16), DiLoCo's outer state and the period are the mode's own figures on top.
inline train::DpCharge charge_of(const Layout& l) {
  if (l.dp <= 1) return {};  // one replica: nothing over dp
  if (l.zero == 3) return train::zero3_charge;
  if (l.zero == 2) return train::zero2_charge;
  if (l.zero == 1) return train::zero1_charge;
  switch (l.sync.mode) {
    case DpMode::LocalSgd:
    case DpMode::DiLoCo:
      return train::averaging_charge;
    case DpMode::Stale:
      return train::stale_charge;
    case DpMode::Sync:
    case DpMode::Bf16:
      break;
  }
  return train::all_reduce_charge;
}

namespace detail {

/// optim::Zero2AdamW::max_in_flight and optim::Zero3AdamW::max_in_flight (plan/measure.hpp
/// checks that they agree).
inline constexpr int zero2_in_flight = 2;
inline constexpr int zero3_in_flight = 1;

/// What one rank of pipeline stage s holds (estimate()'s memory): its chunks' parameters,
/// gradients, optimizer state, dp buffers, the step's data, the matmul scratch, `live` live
/// microbatches' activations and the largest transient of its chunks.
inline Memory stage_memory(const Problem& pr, const Machine& mc, const Layout& l, const std::vector<StageInputs>& in,
                           int s, int live) {
  const double sb = double(pr.value_bytes);
  const int p = l.pp, v = l.chunks;
  double P = 0;
  for (int k = 0; k < v; ++k) P += in[static_cast<std::size_t>(k * p + s)].parameters;
  const double rows = double(pr.batch / static_cast<std::size_t>(l.dp)) *
                      (pr.spec.empty() ? double(pr.model.context) : pr.spec.rows_per_sample);
  const double data_per_row = pr.spec.empty() ? 8.0 : pr.spec.data_bytes_per_row;  // ids and targets, int32
  Memory mem;
  mem.parameters = mem.gradients = sb * P;
  const double shard             = std::ceil(P / l.dp);
  const train::DpCharge ch       = charge_of(l);
  using G                        = train::DpCharge::Gradients;
  mem.optimizer                  = !ch.shards_optimizer_state ? 2 * sb * P              // AdamW's m and v
                                   : ch.shards_gradients      ? 4 * sb * shard + shard  // ZeRO-2: the shard's
                                                              : sb * P + 4 * sb * shard + shard;
  if (ch.shards_parameters) {
    // ZeRO-3 keeps the shard of values, gradients, m and v, and for the time of a unit (a
    // block, the embeddings: what nn::Gpt names at once) its values gathered, with `prefetch`
    // units ahead; a backward writes one unit's gradients while the unit before is
    // reduce-scattered (Zero3AdamW::max_in_flight) with the part it receives, and the gradients
    // held from their first write to the step
    const double S = l.shard_group(), own = std::ceil(P / S);
    double unit = 0, held = 0;
    for (int k = 0; k < v; ++k) {
      const auto& x = in[static_cast<std::size_t>(k * p + s)];
      unit          = std::max(unit, x.written_at_once), held += x.held_to_step;
    }
    unit           = std::min(unit, P);
    mem.parameters = sb * (own + std::min(P, (1.0 + l.prefetch) * unit));
    mem.gradients  = sb * (own + std::min(P, unit + held + zero3_in_flight * unit * (1.0 + 1.0 / S)));
    mem.optimizer  = 2 * sb * own;
  } else if (ch.shards_gradients) {
    // ZeRO-2 holds what a backward writes at once, what stays to the step, and up to
    // Zero2AdamW::max_in_flight buckets being reduce-scattered with the parts they receive
    double at_once = 0, held = 0, largest = 0;
    for (int k = 0; k < v; ++k) {
      const auto& x = in[static_cast<std::size_t>(k * p + s)];
      at_once       = std::max(at_once, x.written_at_once), held += x.held_to_step,
      largest       = std::max(largest, x.largest_parameter);
    }
    // a bucket: bucket_bytes or a whole parameter beyond it. Buckets in flight while a backward
    // writes: those of earlier layers and microbatches, up to Zero2AdamW::max_in_flight, each
    // with the 1/dp part it receives; one bucket more is held, begun by the layer before (buckets
    // straddle layers); at the step's end the buckets still held go into flight themselves
    const double bucket  = std::min(P, std::max(double(pr.bucket_bytes) / sb, largest));
    const double per_mb  = std::ceil(P / std::max(bucket, 1.0));
    const double flights = std::min(double(zero2_in_flight), l.microbatches * per_mb - 1);
    const double at_end  = std::min(double(zero2_in_flight), l.microbatches * per_mb);
    mem.gradients =
        sb * std::max(std::min(P, at_once + held + (per_mb > 1 ? bucket : 0.0)) + flights * bucket * (1.0 + 1.0 / l.dp),
                      std::max(at_end * bucket, std::min(P, held + bucket)) * (1.0 + 1.0 / l.dp));
  }
  mem.buckets = 0;  // what the strategy keeps beside the gradients
  if (ch.gradients == G::all_reduce && ch.delayed)
    mem.buckets = (l.sync.period + 1) * sb * P;  // S + 1 sums
  else if (ch.gradients == G::all_reduce)
    mem.buckets = l.sync.mode == DpMode::Bf16 ? (2 + sb) * P : sb * P;  // GradSync's buckets (bf16: wire + residual)
  else if (ch.averages_parameters && l.sync.mode == DpMode::DiLoCo)
    mem.buckets = 2 * sb * P;  // DiLoCo's anchor + momentum; local SGD keeps nothing in flight
  mem.data    = data_per_row * rows;
  mem.scratch = mc.matmul_scratch_bytes;
  if (pr.precision == Precision::bf16 && mc.bf16_copy_bytes > 0) {  // the chunks' blocks share shapes
    // fp32 copies (4 bytes: the rounded path) share blocks with the activations' temporaries;
    // bf16 copies (2 bytes) share none
    const bool typed = mc.bf16_copy_bytes < 4;
    double weights = 0, activations = 0;
    for (int k = 0; k < v; ++k) {
      const auto& x = in[static_cast<std::size_t>(k * p + s)];
      weights       = std::max(weights, x.weight_copies);
      activations   = std::max(activations, typed ? x.activation_copies : x.largest_product);
    }
    mem.products = mc.bf16_copy_bytes * (weights + activations);
  }
  // one live microbatch of a chunk; with several chunks the live (chunk, microbatch) pairs
  // count at their chunks' mean
  double per_mb = 0;
  for (int k = 0; k < v; ++k) {
    const auto vs = static_cast<std::size_t>(k * p + s);
    per_mb += in[vs].activations / v;
    mem.transient = std::max(mem.transient, in[vs].transient);
    mem.sends     = std::max(mem.sends, in[vs].sends);
  }
  mem.live_microbatches = live;
  mem.activations       = mem.live_microbatches * per_mb;
  return mem;
}

/// peak_bytes() on the layout's stage plan (stage_plan(pr, l.pp * l.chunks)), the layout checked.
inline double peak_bytes_on(const Problem& pr, const Machine& mc, const Layout& l, const parallel::StagePlan& stages,
                            const std::vector<int>& live, int* heaviest) {
  const std::size_t b = pr.batch / static_cast<std::size_t>(l.dp) / static_cast<std::size_t>(l.microbatches);
  const auto in =
      pr.spec.empty() ? detail::gpt_stages(pr, mc, l, stages, b) : detail::spec_stages(pr, mc, l, stages, b);
  double most = 0;
  for (int s = 0; s < l.pp; ++s) {
    const double here = detail::stage_memory(pr, mc, l, in, s, live[static_cast<std::size_t>(s)]).total();
    if (here > most || s == 0) {
      most = here;
      if (heaviest) *heaviest = s;
    }
  }
  return most;
}

/// estimate() on the layout's stage plan (stage_plan(pr, l.pp * l.chunks)), the layout checked.
inline Estimate estimate_on(const Problem& pr, const Machine& mc, const Layout& l, const parallel::StagePlan& stages) {
  Estimate e;
  e.layout    = l;
  const int p = l.pp, m = l.microbatches, v = l.chunks;
  e.stages            = stages;  // per virtual stage c p + s
  const std::size_t b = pr.batch / static_cast<std::size_t>(l.dp) / static_cast<std::size_t>(m);
  const auto P_ = static_cast<std::size_t>(p), VS = static_cast<std::size_t>(p * v);
  const auto vstage = [p](int s, int k) { return static_cast<std::size_t>(k * p + s); };
  // messages a virtual stage receives and sends per microbatch and direction
  const auto hops_of = [VS](std::size_t vs) { return double(vs > 0) + double(vs + 1 < VS); };
  const std::vector<detail::StageInputs> in =
      pr.spec.empty() ? detail::gpt_stages(pr, mc, l, e.stages, b) : detail::spec_stages(pr, mc, l, e.stages, b);
  const double sb        = double(pr.value_bytes);
  const double hop_bytes = detail::hop_bytes(pr, l, e.stages, b);

  // --- time: per-stage forward / backward of one microbatch, the schedule simulated -----------
  std::vector<double> tf(P_, 0.0), tb(P_, 0.0);  // per rank, its chunks together
  const double hop = p > 1 ? mc.p2p_on(hop_bytes, p, l.tp * l.dp) : 0.0;
  for (int s = 0; s < p; ++s)
    for (int k = 0; k < v; ++k) {
      const auto vs = vstage(s, k);
      tf[std::size_t(s)] += in[vs].cost.forward + in[vs].cost.tp_comm + (vs > 0 ? hop : 0.0);
      tb[std::size_t(s)] += in[vs].cost.backward + in[vs].cost.tp_comm + (vs + 1 < VS ? hop : 0.0);
    }
  std::vector<int> live(P_, 1);
  if (p > 1)
    live = parallel::check(parallel::make_schedule(l.schedule, p, m, v), tf, tb).peak_live;  // proves the table too
  std::vector<double> work_f(VS), work_b(VS), wait(VS);
  for (std::size_t vs = 0; vs < VS; ++vs)
    work_f[vs] = in[vs].cost.forward, work_b[vs] = in[vs].cost.backward, wait[vs] = in[vs].cost.tp_comm;
  const double share    = std::clamp(mc.core_share, 1e-3, 1.0);
  const double makespan = detail::simulate(l.schedule, p, m, work_f, work_b, wait, hop, share * mc.ranks, l.dp * l.tp,
                                           v, mc.ranks_per_node);
  // the parts: the busiest stage's compute (at the cores' share when all ranks compute), its
  // communication; the rest of the simulated makespan is the bubble
  int busiest = 0;
  for (int s = 1; s < p; ++s)
    if (tf[std::size_t(s)] + tb[std::size_t(s)] > tf[std::size_t(busiest)] + tb[std::size_t(busiest)]) busiest = s;
  double hops = 0;
  for (int k = 0; k < v; ++k) {
    const auto vs = vstage(busiest, k);
    e.time.compute += m * (in[vs].cost.forward + in[vs].cost.backward) / share;
    e.time.tp_comm += 2.0 * m * in[vs].cost.tp_comm;
    e.bytes.tp += m * in[vs].tp_bytes;
    hops += hops_of(vs);
  }
  e.time.pp_comm             = p > 1 ? m * hop * hops : 0.0;
  e.time.bubble              = makespan - e.time.compute - e.time.tp_comm - e.time.pp_comm;
  e.bytes.pp                 = m * 2.0 * hop_bytes * hops;
  const auto rank_parameters = [&](int s) {
    double P = 0;
    for (int k = 0; k < v; ++k) P += in[vstage(s, k)].parameters;
    return P;
  };
  if (const train::DpCharge ch = charge_of(l); l.dp > 1) {
    using G        = train::DpCharge::Gradients;
    const double P = rank_parameters(busiest);
    if (ch.shards_parameters)
      e.bytes.dp = sb * P * 3 * m;  // ZeRO-3: per microbatch two gathers (forward, backward), a reduce-scatter
    else if (ch.gradients == G::reduce_scatter)
      e.bytes.dp = sb * P * (ch.shards_gradients ? m + 1 : 2);  // ZeRO-2: a reduce-scatter per microbatch
    else if (ch.gradients == G::all_reduce)
      e.bytes.dp = l.sync.mode == DpMode::Bf16 ? 2 * P : sb * P;
    else if (ch.averages_parameters)
      e.bytes.dp = sb * P / l.sync.period;  // per step, amortised
  }
  if (e.time.bubble < 0) {  // ranks waiting elsewhere left the busiest more than its share
    e.time.compute += e.time.bubble;
    e.time.bubble = 0;
  }

  // --- memory and the step's tail per stage --------------------------------------------------
  double tail = 0, tail_dp = 0, tail_opt = 0;
  const train::DpCharge ch = charge_of(l);  // what the strategy does over dp
  using G                  = train::DpCharge::Gradients;
  for (int s = 0; s < p; ++s) {
    const double P = rank_parameters(s);
    e.memory.push_back(detail::stage_memory(pr, mc, l, in, s, live[static_cast<std::size_t>(s)]));
    const double shard = std::ceil(P / l.dp);
    // dp: the buckets' all-reduce overlaps the last backward except its last bucket; ZeRO's
    // reduce-scatter + all-gather (the same volume) do not overlap, and pack / unpack the values
    double dp               = 0;
    const double grad_bytes = sb * P;
    if (ch.shards_parameters) {
      // ZeRO-3: per microbatch the values gathered in forward and again in backward, unit by
      // unit, and the gradients reduce-scattered during backward, all on the dp link. With
      // prefetch the three run while the microbatch computes: what exceeds its compute is
      // exposed, and the first unit's gather and the last unit's reduce-scatter; without it each
      // gather is waited for and the reduce-scatters go as ZeRO-2's. Gradients zeroed per
      // microbatch; with hybrid sharding the shard is then summed over the replica groups
      const double S    = l.shard_group();
      const double half = 0.5 * mc.reduce_scatter_all_gather_on(grad_bytes, int(S), l.tp);
      double unit       = 0;
      for (int k = 0; k < v; ++k) unit = std::max(unit, in[vstage(s, k)].written_at_once);
      const double units   = std::max(1.0, std::ceil(P / std::max(unit, 1.0)));
      const double compute = tf[std::size_t(s)] + tb[std::size_t(s)];
      const double per_mb =
          l.prefetch > 0 ? std::max(0.0, 3 * half - compute) + 2 * half / units
                         : 2 * half + half / units + std::max(0.0, half * (units - 1) / units - tb[std::size_t(s)]);
      dp = m * per_mb + (S < l.dp ? mc.all_reduce_on(grad_bytes / S, l.dp / int(S), l.tp * int(S)) : 0.0) +
           mc.memory(m * grad_bytes) / share;
    } else if (ch.shards_gradients) {
      // ZeRO-2: each microbatch's buckets reduce-scattered during its backward (the last bucket
      // exposed, the rest beyond the backward's time), the values all-gathered after the update;
      // buckets zeroed per microbatch, the values unpacked
      const double half    = 0.5 * mc.reduce_scatter_all_gather_on(grad_bytes, l.dp, l.tp);
      const double buckets = std::max(1.0, std::ceil(grad_bytes / double(pr.bucket_bytes)));
      dp = m * (half / buckets + std::max(0.0, half * (buckets - 1) / buckets - tb[std::size_t(s)])) + half +
           mc.memory((m + 2) * grad_bytes) / share;
    } else if (ch.gradients == G::reduce_scatter) {  // ZeRO-1
      dp = mc.reduce_scatter_all_gather_on(grad_bytes, l.dp, l.tp) + mc.memory(4 * grad_bytes) / share;
    } else if (ch.gradients == G::all_reduce && !ch.delayed) {
      // bf16: half the bytes on the wire; packing reads g and r and writes the wire and r,
      // unpacking reads the wire and writes g
      const bool half      = l.sync.mode == DpMode::Bf16;
      const double wire    = half ? 2 * P : grad_bytes;
      const double buckets = std::max(1.0, std::ceil(grad_bytes / double(pr.bucket_bytes)));
      const double ar      = mc.all_reduce_on(wire, l.dp, l.tp);
      dp                   = ar / buckets + std::max(0.0, ar * (buckets - 1) / buckets - tb[std::size_t(s)]) +
           mc.memory(half ? 4 * grad_bytes + 4 * P : 2 * grad_bytes) / share;
    } else if (ch.gradients == G::all_reduce) {  // delayed: bounded staleness
      // the sum overlaps the S steps before it is applied (all of a step's compute and
      // communication but its own); what it does not fit into is exposed
      const double ar   = mc.all_reduce_on(grad_bytes, l.dp, l.tp);
      const double step = makespan + mc.memory(2 * grad_bytes) / share;
      dp                = std::max(0.0, ar - l.sync.period * step) + mc.memory(2 * grad_bytes) / share;
    } else if (ch.averages_parameters) {
      // LocalSgd / DiLoCo: the parameters' average (blocking) every `period` steps, DiLoCo's
      // outer step reading x, anchor, momentum and writing them
      const double avg = mc.all_reduce_on(grad_bytes, l.dp, l.tp) +
                         (l.sync.mode == DpMode::DiLoCo ? mc.memory(6 * grad_bytes) / share : 0.0);
      dp = avg / l.sync.period;
    }
    // zero_grad (write G), norm (read G), AdamW (read p g m v, write p m v) on what this rank
    // updates
    // (ZeRO-3: all on its shard)
    const double own     = ch.shards_parameters ? std::ceil(P / l.shard_group()) : shard;
    const double updated = ch.shards_optimizer_state ? own : P, zeroed = ch.shards_parameters ? own : P;
    const double opt =
        (mc.optimizer_seconds_per_value > 0 ? mc.optimizer_seconds_per_value * (2 * zeroed + 7 * updated) / 9
                                            : mc.memory(sb * (2 * zeroed + 7 * updated))) /
            share +
        mc.all_reduce_on(16, l.tp, 1) + mc.all_reduce_on(16, l.pp, l.tp * l.dp) +
        (ch.shards_optimizer_state ? mc.all_reduce_on(16, ch.shards_parameters ? int(l.shard_group()) : l.dp, l.tp)
                                   : 0.0) +
        2 * double(P > 0) * 20 * mc.kernel_seconds;
    if (dp + opt > tail) tail = dp + opt, tail_dp = dp, tail_opt = opt;
  }
  e.time.dp_comm   = tail_dp;
  e.time.optimizer = tail_opt;
  return e;
}

/// The stage plans of one problem by virtual stage count, each balanced once: a search asks for
/// the same few counts for thousands of layouts.
class StagePlans {
 public:
  explicit StagePlans(const Problem& pr) : m_problem(pr) {}
  const parallel::StagePlan& operator()(int virtual_stages) {
    auto it = m_plans.find(virtual_stages);
    if (it == m_plans.end()) it = m_plans.emplace(virtual_stages, stage_plan(m_problem, virtual_stages)).first;
    return it->second;
  }

 private:
  const Problem& m_problem;
  std::map<int, parallel::StagePlan> m_plans;
};

}  // namespace detail

/// \brief The peak bytes per rank of layout `l` (Estimate::peak_bytes) when its stages hold
/// `live` live microbatches each: the memory model alone, without simulating the schedule. The
/// planner's search sizes variants of a layout (sequence parallelism, recomputation) with the
/// live counts of the layout's own estimate, which the same schedule gives them. `heaviest`, when
/// given, receives the stage of the peak.
/// \throws pmt::ConfigError when the layout cannot run the problem, or `live` has not pp entries.
inline double peak_bytes(const Problem& pr, const Machine& mc, const Layout& l, const std::vector<int>& live,
                         int* heaviest = nullptr) {
  const std::string why = why_invalid(pr, l, mc.ranks);
  pmt::detail::require<ConfigError>(
      why.empty() && live.size() == static_cast<std::size_t>(l.pp), "pmt::plan::peak_bytes", [&] {
        return l.describe() + ": " + (why.empty() ? pmt::detail::str(live.size(), " live counts for pp ", l.pp) : why);
      });
  return detail::peak_bytes_on(pr, mc, l, stage_plan(pr, l.pp * l.chunks), live, heaviest);
}

/// \brief The prediction for one layout.
/// \throws pmt::ConfigError when the layout cannot run the problem (why_invalid).
inline Estimate estimate(const Problem& pr, const Machine& mc, const Layout& l) {
  const std::string why = why_invalid(pr, l, mc.ranks);
  pmt::detail::require<ConfigError>(why.empty(), "pmt::plan::estimate", [&] { return l.describe() + ": " + why; });
  return detail::estimate_on(pr, mc, l, stage_plan(pr, l.pp * l.chunks));
}

}  // namespace pmt::plan
