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

/// \brief What the planner knows of the machine (per rank, while all ranks work at once).
struct Machine {
  int ranks           = 1;
  double memory_bytes = 0;   ///< usable per rank (0: unlimited)
  double gemm_gflops  = 50;  ///< GEMM rate per rank alone in the problem's precision (blocks not measured)
  /// bytes per rank the runtime keeps for the portable matmul kernel once it ran (its team
  /// scratch: plan::portable_matmul_scratch_bytes); 0 where it never runs or keeps nothing
  double matmul_scratch_bytes = 0;
  /// Bytes per operand element that bf16 products copy (Problem::precision bf16): 4 where they
  /// take the rounded path (op(A) and op(B) rounded into fp32 Workspace copies), 2 for cuBLAS's
  /// bf16 copies and the host BLAS's bf16 GEMM where pinned, 0 for in-register kernels (AMX;
  /// AVX512-BF16 where pinned). calibrate() sets it from the host's kernel.
  double bf16_copy_bytes = 0;
  /// seconds of one transformer block's forward and backward for a microbatch of b sequences on a
  /// tp group, measured with every rank of the machine doing the same at once, the tp all-reduces
  /// included (plan/calibrate.hpp runs pmt's GptBlock; sequence-parallel or not); empty: from the
  /// GEMMs, the memory traffic and the links
  std::function<std::pair<double, double>(std::size_t b, int tp, bool sequence_parallel)> block_seconds;
  /// seconds of the rest of a microbatch: the embeddings, final norm, LM head, loss and their
  /// backward with their tp all-reduces, measured like block_seconds (with every rank at once;
  /// counted on the last stage); empty: from the GEMMs, memory traffic and links
  std::function<double(std::size_t b, int tp, bool sequence_parallel)> head_seconds;
  double optimizer_seconds_per_value = 0;     ///< zero_grad + norm + AdamW per parameter; 0: from memory_gbps
  double memory_gbps                 = 10;    ///< bandwidth of memory-bound kernels per rank, GB/s
  double kernel_seconds              = 3e-6;  ///< launch cost of one kernel
  double link_gbps                   = 5;     ///< point-to-point and collective bandwidth per rank, GB/s
  double link_latency                = 5e-6;  ///< seconds per message step
  /// measured links by group size: an all-reduce among g ranks amid compute (every group at
  /// once) costs latency + 2 (g - 1) / g bytes / bandwidth; the entry of the largest size <= g
  /// is used (empty: link_gbps and link_latency with the ring model)
  struct Link {
    int ranks;
    double latency, gbps;
    /// the bandwidth of the all-reduce's bytes beyond 256 KiB (measured at 4 MiB: shared-memory
    /// all-reduces slow down once a buffer leaves the caches); 0: gbps for every size
    double big_gbps = 0;
    /// a reduce-scatter and an all-gather of the same buffer, back to back (ZeRO's pair), as the
    /// bandwidth of one ring all-reduce of it (measured at 4 MiB); 0: an all-reduce's cost
    double sharded_gbps = 0;
  };
  std::vector<Link> links;
  /// Nodes: with ranks_per_node > 0 the ranks sit on nodes of that many (in the Mesh's order, tp
  /// fastest, then dp, then pp), and every collective and send is costed on the links it crosses:
  /// `intra` inside a node (NVLink, shared memory), `inter` between nodes (the network, per rank).
  /// An all-reduce over a group that spans nodes is hierarchical: reduce-scatter inside each node,
  /// all-reduce of the node's part between the nodes, all-gather inside (see all_reduce_on).
  /// 0: one link model for every pair (links, or link_gbps and link_latency).
  int ranks_per_node = 0;
  Link intra{0, 5e-6, 5}, inter{0, 5e-6, 5};
  /// the share of its speed alone a rank keeps when every rank computes at once (cores / (ranks x
  /// threads), at most 1): with less than 1 the simulation places rank r on core r mod cores
  /// (`mpiexec --map-by core`; of its node's cores with ranks_per_node) and a rank waiting in a
  /// pipeline bubble lends its core to the other ranks on it
  double core_share  = 1;
  std::string source = "given";  ///< "given", or how it was calibrated
  std::string details;           ///< calibration: what each measured piece took
  std::string matmul;            ///< calibration: the matmul paths its products took ("" if not calibrated)
  std::string advice;            ///< calibration: what to change in how the ranks run ("" if nothing)

  /// seconds of C (M x N) += A (M x K) B (K x N) on one rank alone
  double gemm(std::size_t M, std::size_t N, std::size_t K) const {
    return 2.0 * double(M) * double(N) * double(K) / (gemm_gflops * 1e9);
  }
  double memory(double bytes) const { return bytes / (memory_gbps * 1e9); }
  /// ring all-reduce of `bytes` over g ranks (reduce-scatter + all-gather: the same cost)
  double all_reduce(double bytes, int g) const {
    if (g <= 1) return 0;
    const Link* l = link(g);
    if (l) {
      // the first 256 KiB at the small-buffer rate, the rest at the large-buffer one
      const double small = std::min(bytes, 262144.0), rest = bytes - small;
      return l->latency +
             2.0 * (g - 1) / g * (small / (l->gbps * 1e9) + rest / ((l->big_gbps > 0 ? l->big_gbps : l->gbps) * 1e9));
    }
    return 2.0 * (g - 1) / g * bytes / (link_gbps * 1e9) + 2.0 * (g - 1) * link_latency;
  }
  /// A reduce-scatter of `bytes` over a group of g ranks `stride` apart, then an all-gather of the
  /// result (ZeRO): the measured pair where the calibration timed it, else an all-reduce's cost.
  double reduce_scatter_all_gather_on(double bytes, int g, int stride) const {
    if (g <= 1) return 0;
    const Link* l = ranks_per_node <= 0 ? link(g) : nullptr;
    if (l && l->sharded_gbps > 0) return 2 * l->latency + 2.0 * (g - 1) / g * bytes / (l->sharded_gbps * 1e9);
    return all_reduce_on(bytes, g, stride);
  }
  /// How a group of g ranks, `stride` apart in the Mesh's order (tp 1, dp tp, pp tp dp), sits on
  /// the nodes: {ranks per node in the group, nodes it spans}; {g, 1} without a topology.
  std::pair<int, int> placement(int g, int stride) const {
    if (ranks_per_node <= 0 || g <= 1) return {g, 1};
    const int per_node = stride >= ranks_per_node ? 1 : std::max(1, std::min(g, ranks_per_node / std::max(stride, 1)));
    return {per_node, (g + per_node - 1) / per_node};
  }
  /// An all-reduce of `bytes` over a group of g ranks `stride` apart: all_reduce() without a
  /// topology; with one, a ring inside a node, or hierarchical over nodes (each rank's share of the
  /// inter-node all-reduce at the per-rank network rate).
  double all_reduce_on(double bytes, int g, int stride) const {
    if (g <= 1) return 0;
    if (ranks_per_node <= 0) return all_reduce(bytes, g);
    const auto [in, nodes] = placement(g, stride);
    const auto ring        = [](const Link& l, double b, int n) {
      return n <= 1 ? 0.0 : 2.0 * (n - 1) * l.latency + 2.0 * (n - 1) / n * b / (l.gbps * 1e9);
    };
    if (nodes == 1) return ring(intra, bytes, g);
    // reduce-scatter + all-gather inside the node (one ring's worth), the node's 1/in of the
    // buffer all-reduced between the nodes by each of its ranks at once
    return ring(intra, bytes, in) + ring(inter, bytes / in, nodes);
  }
  /// A send between neighbours of a group of g ranks `stride` apart and its receive (pipeline
  /// stages: stride tp dp, g = pp): on the network when the group spans nodes (some hop of the
  /// ring crosses them, and the pipeline waits for its slowest hop), else inside the node.
  double p2p_on(double bytes, int g, int stride) const {
    if (ranks_per_node <= 0) return p2p(bytes);
    const Link& l = placement(g, stride).second > 1 ? inter : intra;
    return l.latency + bytes / (l.gbps * 1e9);
  }
  /// a send to the next stage and its receive (as an exchange between 2 ranks)
  double p2p(double bytes) const {
    const Link* l = link(2);
    return l ? l->latency + bytes / (l->gbps * 1e9) : bytes / (link_gbps * 1e9) + link_latency;
  }
  const Link* link(int g) const {
    const Link* best = nullptr;
    for (const auto& l : links)
      if (l.ranks <= g && (!best || l.ranks > best->ranks)) best = &l;
    return best;
  }
};

/// \brief One line describing a machine's rates.
inline std::string describe(const Machine& m) {
  char line[512];
  std::snprintf(line, sizeof line,
                "%d ranks; per rank alone: GEMM %.1f GFLOP/s, bandwidth %.1f GB/s, kernel "
                "launch %.1f us; "
                "core share %.2f; all-reduce %.2f GB/s + %.1f us (2 ranks), %.2f GB/s + %.1f us (all); "
                "memory %s (%s)",
                m.ranks, m.gemm_gflops, m.memory_gbps, 1e6 * m.kernel_seconds, m.core_share,
                m.link(2) ? m.link(2)->gbps : m.link_gbps, 1e6 * (m.link(2) ? m.link(2)->latency : 2 * m.link_latency),
                m.link(m.ranks) ? m.link(m.ranks)->gbps : m.link_gbps,
                1e6 * (m.link(m.ranks) ? m.link(m.ranks)->latency : 2 * (m.ranks - 1) * m.link_latency),
                m.memory_bytes > 0 ? detail::str(std::round(m.memory_bytes / 1048576.0), " MiB").c_str() : "unlimited",
                m.source.c_str());
  std::string out(line);
  if (m.ranks_per_node > 0)
    out +=
        detail::str("; nodes of ", m.ranks_per_node, " ranks: inside ", m.intra.gbps, " GB/s + ", 1e6 * m.intra.latency,
                    " us, between ", m.inter.gbps, " GB/s + ", 1e6 * m.inter.latency, " us per rank");
  return m.matmul.empty() ? out : out + "; " + m.matmul;
}

/// \brief The training problem: a Gpt (`model`) or any other model (`spec`, when it has layers),
/// the global batch (sequences, or samples, per step) and the value size.
struct Problem {
  nn::GptConfig model;
  ModelSpec spec;  ///< when not empty, the model planned (and `model` is not used)
  std::size_t batch        = 8;
  std::size_t value_bytes  = 4;                      ///< float
  std::size_t bucket_bytes = std::size_t(25) << 20;  ///< the dp gradient bucket size (GradSync)
  /// the precision of the model's products (train::TrainerOptions::precision): calibrate() and
  /// measure() run them in it; by hand, Machine::gemm_gflops is the rate in it. pmt's bf16 keeps
  /// activations, parameters, gradients and optimizer state in fp32: the memory model is the same
  Precision precision = Precision::fp32;
  /// bytes of an activation value: what a microbatch saves and sends (tp all-reduces, pipeline
  /// hops) and what its memory-bound kernels move. 0: value_bytes, as pmt's runtime keeps them
  /// (fp32 in either precision). 2 plans for a runtime that keeps bf16 activations beside fp32
  /// masters, gradients and optimizer state (Megatron-LM, DeepSpeed: the published runs of
  /// docs/planner.md); parameters, gradients, optimizer state and dp traffic stay value_bytes.
  std::size_t activation_bytes = 0;
  double activation_value_bytes() const { return double(activation_bytes > 0 ? activation_bytes : value_bytes); }
};

/// \brief FLOPs of one training step of a Gpt's products (the count published large runs report
/// their per-GPU throughput in: Narayanan et al. 2021, eq. 3): per block and token 24 C^2 for
/// q, k, v, the projection and the MLP and 4 T C for the scores and the weighted sum in the
/// forward, the backward twice that, and with `recompute` the blocks' forward once more; the LM
/// head's 2 C V per token, forward and backward (never recomputed). The embeddings, norms and
/// elementwise kernels are not counted.
inline double gpt_step_flops(const nn::GptConfig& c, std::size_t batch, bool recompute) {
  const double tokens = double(batch) * double(c.context), C = double(c.width);
  const double block = tokens * (24.0 * C * C + 4.0 * double(c.context) * C);
  return (recompute ? 4.0 : 3.0) * double(c.layers) * block + 6.0 * tokens * C * double(c.vocab);
}

/// \brief How the dp replicas communicate (train::Trainer's data-parallel modes): the gradients'
/// sum every step (Sync; Bf16: as bf16 with error feedback; Stale: applied `period` steps late,
/// its all-reduce overlapping those steps), or the parameters' average every `period` steps
/// (LocalSgd; DiLoCo: with the outer step). Only Sync is exact (equal to one rank); the others
/// trade how the model trains for communication, so a search considers them only when asked.
enum class DpMode { Sync, Bf16, LocalSgd, DiLoCo, Stale };

/// \brief A data-parallel mode and its period (LocalSgd, DiLoCo: steps between averages; Stale:
/// the bound S; otherwise unused).
struct DpChoice {
  DpMode mode = DpMode::Sync;
  int period  = 1;
  /// \brief "sync", "bf16", "local 8", "diloco 8", "stale 1".
  std::string describe() const {
    switch (mode) {
      case DpMode::Sync:
        return "sync";
      case DpMode::Bf16:
        return "bf16";
      case DpMode::LocalSgd:
        return detail::str("local ", period);
      case DpMode::DiLoCo:
        return detail::str("diloco ", period);
      case DpMode::Stale:
        return detail::str("stale ", period);
    }
    return "?";
  }
};

/// \brief Parses "sync", "bf16", "local:H", "diloco:H" or "stale:S".
/// \throws pmt::ConfigError for anything else, naming it.
inline DpChoice parse_dp_choice(const std::string& text) {
  const auto colon       = text.find(':');
  const std::string name = text.substr(0, colon);
  int period             = 1;
  bool ok                = true;
  if (colon != std::string::npos) {
    char* end    = nullptr;
    const long v = std::strtol(text.c_str() + colon + 1, &end, 10);
    ok     = end && *end == '\0' && end != text.c_str() + colon + 1 && v >= (name == "stale" ? 0 : 1) && v <= 1000000;
    period = static_cast<int>(v);
  }
  DpChoice c;
  if (name == "sync" && colon == std::string::npos)
    c = {DpMode::Sync, 1};
  else if (name == "bf16" && colon == std::string::npos)
    c = {DpMode::Bf16, 1};
  else if (name == "local" && colon != std::string::npos && ok)
    c = {DpMode::LocalSgd, period};
  else if (name == "diloco" && colon != std::string::npos && ok)
    c = {DpMode::DiLoCo, period};
  else if (name == "stale" && colon != std::string::npos && ok)
    c = {DpMode::Stale, period};
  else
    throw ConfigError(
        "pmt::plan::parse_dp_choice",
        detail::str(
            "'", text,
            "' is not a data-parallel mode; expected sync, bf16, local:H, diloco:H (H >= 1) or stale:S (S >= 0)"));
  return c;
}

/// \brief One way to run it.
struct Layout {
  int dp = 1, tp = 1, pp = 1, microbatches = 1;
  parallel::ScheduleKind schedule = parallel::ScheduleKind::OneFOneB;
  /// ZeRO stage: 0 AdamW, 1 its state sharded over dp (optim::ZeroAdamW), 2 the gradients too
  /// (optim::Zero2AdamW).
  int zero   = 0;
  int chunks = 1;   ///< model chunks per stage (with 1F1B: interleaved)
  DpChoice sync{};  ///< how the dp replicas communicate
  /// Activation recomputation: a Gpt's blocks (nn::GptOptions::recompute), a ModelSpec's chunks
  /// (nn::StagedOptions::recompute) keep only their input and run their forward again in backward.
  bool recompute = false;
  /// Sequence parallelism of a Gpt with tp > 1 (nn::GptOptions::sequence_parallel).
  bool sequence_parallel = false;
  /// Selective recomputation of a Gpt's attention (nn::GptOptions::recompute_attention); not with
  /// `recompute`, which recomputes the whole block.
  bool recompute_attention = false;
  /// With `recompute` or `recompute_attention`: only the first this many pipeline stages
  /// recompute (each rank sets its model's options by its stage); 0: every stage. Under 1F1B the
  /// first stages hold the most live microbatches, so they may need it where the last do not.
  int recompute_stages = 0;
  /// \brief Whether pipeline stage s recomputes (recompute_stages).
  bool recomputes_on(int s) const noexcept { return recompute_stages <= 0 || s < recompute_stages; }
  /// \brief "dp 2 x tp 1 x pp 2, m 4, 1f1b, zero" (", zero2" for ZeRO-2; "1f1b x2" with 2 chunks per stage; ", bf16",
  /// ", local 8" ... for a data-parallel mode other than sync; ", recompute"; ", recompute
  /// attention"; ", seq" with sequence parallelism)
  std::string describe() const {
    return detail::str("dp ", dp, " x tp ", tp, " x pp ", pp, ", m ", microbatches,
                       pp > 1 ? std::string(", ") + parallel::schedule_name(schedule) : std::string(),
                       chunks > 1 ? detail::str(" x", chunks) : std::string(),
                       zero == 1   ? ", zero"
                       : zero == 2 ? ", zero2"
                                   : "",
                       sync.mode != DpMode::Sync ? ", " + sync.describe() : std::string(),
                       recompute ? ", recompute" : "", recompute_attention ? ", recompute attention" : "",
                       recompute_stages > 0 && (recompute || recompute_attention)
                           ? detail::str(" on stages < ", recompute_stages)
                           : std::string(),
                       sequence_parallel ? ", seq" : "");
  }
  /// \brief The C++ policy type that fixes this layout's axes, data-parallel mode, schedule,
  /// sequence parallelism and recomputation, as a Trainer takes it (build the model with
  /// nn::gpt_options<Policy> or nn::staged_options<Policy>), e.g.
  /// "pmt::Hybrid<pmt::DataParallel<>, pmt::TensorSplit<pmt::Sequence>, pmt::Pipeline<8>,
  /// pmt::Recompute<pmt::Selective>>". Degrees of 1 have no policy. The optimizer (zero), bf16 compression and the
  /// precision are not policies: they are the optimizer's type and TrainerOptions.
  std::string policy_type() const {
    std::string parts;
    const auto add = [&](const std::string& p) { parts += (parts.empty() ? "" : ", ") + p; };
    if (dp > 1) {
      switch (sync.mode) {
        case DpMode::Sync:
        case DpMode::Bf16:
          add("pmt::DataParallel<>");
          break;
        case DpMode::LocalSgd:
          add(detail::str("pmt::DataParallel<pmt::LocalSgd<", sync.period, ">>"));
          break;
        case DpMode::DiLoCo:
          add(detail::str("pmt::DataParallel<pmt::DiLoCo<", sync.period, ">>"));
          break;
        case DpMode::Stale:
          add(detail::str("pmt::DataParallel<pmt::BoundedStaleness<", sync.period, ">>"));
          break;
      }
    }
    if (tp > 1) add(sequence_parallel ? "pmt::TensorSplit<pmt::Sequence>" : "pmt::TensorSplit<>");
    if (pp > 1)
      add(detail::str("pmt::Pipeline<", pp,
                      schedule == parallel::ScheduleKind::GPipe ? std::string(", pmt::GPipe")
                      : chunks > 1                              ? detail::str(", pmt::Interleaved<", chunks, ">")
                                                                : std::string(),
                      ">"));
    if (recompute || recompute_attention)
      add(detail::str("pmt::Recompute<", recompute ? "pmt::Full" : "pmt::Selective",
                      recompute_stages > 0 ? detail::str(", ", recompute_stages) : std::string(), ">"));
    return "pmt::Hybrid<" + parts + ">";
  }
};

/// \brief Bytes one rank holds, by kind.
struct Memory {
  double parameters = 0, gradients = 0, optimizer = 0, buckets = 0, data = 0, activations = 0, transient = 0;
  double scratch  = 0;  ///< the portable matmul kernel's team scratch (Machine::matmul_scratch_bytes)
  double products = 0;  ///< bf16 products' operand copies (Machine::bf16_copy_bytes), one per shape
  /// The pipeline's send buffers. A run holds one per send in flight, as many as the receivers'
  /// timing leaves: this counts what the runs measured hold (the Gpt: plan_detail::pipeline_sends
  /// per stage with pp > 1; a ModelSpec: one output on every stage but the last).
  double sends          = 0;
  int live_microbatches = 0;  ///< (chunk, microbatch) pairs with several chunks per stage
  double total() const {
    return parameters + gradients + optimizer + buckets + data + activations + transient + scratch + products + sends;
  }
};

/// \brief Seconds of one step, by part (the critical path's share of each).
struct StepTime {
  double compute   = 0;  ///< forward + backward of the stage on the critical path, all microbatches
  double tp_comm   = 0;  ///< its tp all-reduces
  double pp_comm   = 0;  ///< its activation / gradient transfers
  double bubble    = 0;  ///< pipeline idle time on the critical path
  double dp_comm   = 0;  ///< exposed dp gradient communication (or ZeRO's collectives)
  double optimizer = 0;  ///< zero_grad, clipping and the update
  double total() const { return compute + tp_comm + pp_comm + bubble + dp_comm + optimizer; }
};

/// \brief Bytes one rank sends per step on each axis (all-reduces counted by their buffer).
struct Volume {
  double tp = 0;  ///< the tp all-reduces of all microbatches (forward and backward)
  double pp = 0;  ///< activations and gradients to and from the neighbouring stages
  double dp = 0;  ///< the gradients (all-reduced, or reduce-scattered and the values all-gathered)
};

/// \brief A layout's prediction.
struct Estimate {
  Layout layout;
  StepTime time;
  Volume bytes;                ///< of the busiest stage's ranks
  std::vector<Memory> memory;  ///< per pipeline stage (every rank of a stage holds the same)
  parallel::StagePlan stages;
  double step_seconds() const { return time.total(); }
  /// \brief The most any rank holds (the heaviest stage).
  double peak_bytes() const {
    double m = 0;
    for (const auto& s : memory) m = std::max(m, s.total());
    return m;
  }
  int heaviest_stage() const {
    int h = 0;
    for (std::size_t s = 0; s < memory.size(); ++s)
      if (memory[s].total() > memory[static_cast<std::size_t>(h)].total()) h = static_cast<int>(s);
    return h;
  }
};

/// \brief Why a layout cannot run the problem on `ranks` ranks ("" when it can). Names every
/// factor.
inline std::string why_invalid(const Problem& pr, const Layout& l, int ranks) {
  const auto& c = pr.model;
  const auto tp = static_cast<std::size_t>(l.tp);
  if (l.dp < 1 || l.tp < 1 || l.pp < 1 || l.microbatches < 1 || l.chunks < 1)
    return detail::str("dp ", l.dp, ", tp ", l.tp, ", pp ", l.pp, ", microbatches ", l.microbatches, ", chunks ",
                       l.chunks, " must all be >= 1");
  if (l.chunks > 1 && l.pp == 1) return detail::str(l.chunks, " model chunks per stage need pp > 1");
  if (static_cast<long>(l.dp) * l.tp * l.pp != ranks)
    return detail::str("dp ", l.dp, " x tp ", l.tp, " x pp ", l.pp, " = ", static_cast<long>(l.dp) * l.tp * l.pp,
                       " is not ", ranks, " ranks");
  if (pr.spec.empty()) {
    if (c.heads == 0 || c.width % c.heads != 0)
      return detail::str("width ", c.width, " is not divisible by heads ", c.heads);
    if (c.heads % tp != 0) return detail::str("heads ", c.heads, " are not divisible by tp ", l.tp);
    if (c.vocab % tp != 0) return detail::str("vocabulary ", c.vocab, " is not divisible by tp ", l.tp);
  } else {
    for (const auto& y : pr.spec.layers)
      for (std::size_t d : y.divides)
        if (d % tp != 0) return detail::str("layer ", y.name, ": ", d, " features are not divisible by tp ", l.tp);
  }
  const std::size_t layers = pr.spec.empty() ? c.layers : pr.spec.layers.size();
  if (layers < static_cast<std::size_t>(l.pp))
    return detail::str(layers, " layers cannot fill pp ", l.pp, " stages (every stage needs a layer)");
  if (layers < static_cast<std::size_t>(l.pp) * static_cast<std::size_t>(l.chunks))
    return detail::str(layers, " layers cannot fill pp ", l.pp, " x ", l.chunks, " chunks (every chunk needs a layer)");
  if (pr.batch % static_cast<std::size_t>(l.dp) != 0)
    return detail::str("batch ", pr.batch, " is not divisible by dp ", l.dp);
  const std::size_t local = pr.batch / static_cast<std::size_t>(l.dp);
  if (local % static_cast<std::size_t>(l.microbatches) != 0)
    return detail::str(l.microbatches, " microbatches do not divide the ", local, " sequences per dp rank (batch ",
                       pr.batch, " / dp ", l.dp, ")");
  if (l.zero < 0 || l.zero > 2) return detail::str("ZeRO stage ", l.zero, " is not 0, 1 or 2");
  if (l.zero && l.dp == 1) return detail::str("ZeRO-", l.zero, " shards over dp, and dp is 1");
  if (l.recompute_stages < 0 || l.recompute_stages > l.pp)
    return detail::str("recompute_stages ", l.recompute_stages, " is not in [0, pp ", l.pp, "]");
  if (l.recompute_stages > 0 && !l.recompute && !l.recompute_attention)
    return detail::str("recompute_stages ", l.recompute_stages, " names stages that recompute, and nothing recomputes");
  if (l.recompute_attention) {
    if (!pr.spec.empty())
      return "the attention's recomputation is the Gpt's (nn::GptOptions); a ModelSpec recomputes whole chunks";
    if (l.recompute)
      return "the attention's recomputation and the whole block's do not combine: the block recomputes it anyway";
  }
  if (l.sequence_parallel) {
    if (!pr.spec.empty())
      return "sequence parallelism is the Gpt's (nn::GptOptions); a ModelSpec's layers do not split rows";
    if (l.tp == 1) return "sequence parallelism splits the tokens over tp, and tp is 1";
    const std::size_t tokens = local / static_cast<std::size_t>(l.microbatches) * c.context;
    if (tokens % tp != 0)
      return detail::str("sequence parallelism splits a microbatch's ", tokens, " tokens over tp ", l.tp,
                         ", which does not divide them");
  }
  if (l.sync.mode != DpMode::Sync && l.dp == 1) return detail::str("dp mode ", l.sync.describe(), " needs dp > 1");
  if (l.sync.mode != DpMode::Sync && l.zero)
    return detail::str("dp mode ", l.sync.describe(), " does not combine with ZeRO-", l.zero);
  if (l.chunks > 1 && l.schedule == parallel::ScheduleKind::OneFOneB && l.microbatches % l.pp != 0)
    return detail::str("interleaved 1F1B needs microbatches (", l.microbatches, ") a multiple of pp ", l.pp);
  return "";
}

namespace plan_detail {

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

}  // namespace plan_detail

namespace plan_detail {

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

}  // namespace plan_detail

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

namespace plan_detail {

/// optim::Zero2AdamW::max_in_flight (plan/measure.hpp checks that they agree).
inline constexpr int zero2_in_flight = 2;

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
  mem.optimizer = l.zero == 1 ? sb * P + 4 * sb * shard + shard : l.zero == 2 ? 4 * sb * shard + shard : 2 * sb * P;
  if (l.zero == 2) {
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
  mem.buckets = 0;
  if (l.dp > 1 && !l.zero) switch (l.sync.mode) {
      case DpMode::Sync:
        mem.buckets = sb * P;
        break;  // GradSync's buckets
      case DpMode::Bf16:
        mem.buckets = (2 + sb) * P;
        break;  // bf16 wire + residual
      case DpMode::LocalSgd:
        break;  // nothing in flight
      case DpMode::DiLoCo:
        mem.buckets = 2 * sb * P;
        break;  // anchor + momentum
      case DpMode::Stale:
        mem.buckets = (l.sync.period + 1) * sb * P;
        break;  // S + 1 sums
    }
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
      pr.spec.empty() ? plan_detail::gpt_stages(pr, mc, l, stages, b) : plan_detail::spec_stages(pr, mc, l, stages, b);
  double most = 0;
  for (int s = 0; s < l.pp; ++s) {
    const double here = plan_detail::stage_memory(pr, mc, l, in, s, live[static_cast<std::size_t>(s)]).total();
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
  const std::vector<plan_detail::StageInputs> in = pr.spec.empty() ? plan_detail::gpt_stages(pr, mc, l, e.stages, b)
                                                                   : plan_detail::spec_stages(pr, mc, l, e.stages, b);
  const double sb                                = double(pr.value_bytes);
  const double hop_bytes                         = plan_detail::hop_bytes(pr, l, e.stages, b);

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
  const double makespan = plan_detail::simulate(l.schedule, p, m, work_f, work_b, wait, hop, share * mc.ranks,
                                                l.dp * l.tp, v, mc.ranks_per_node);
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
  if (l.dp > 1) {
    const double P = rank_parameters(busiest);
    switch (l.sync.mode) {
      case DpMode::Sync:
        e.bytes.dp = sb * P * (l.zero == 2 ? m + 1 : l.zero ? 2 : 1);
        break;  // ZeRO-2: a reduce-scatter per microbatch
      case DpMode::Bf16:
        e.bytes.dp = 2 * P;
        break;
      case DpMode::LocalSgd:
      case DpMode::DiLoCo:
        e.bytes.dp = sb * P / l.sync.period;
        break;  // per step, amortised
      case DpMode::Stale:
        e.bytes.dp = sb * P;
        break;
    }
  }
  if (e.time.bubble < 0) {  // ranks waiting elsewhere left the busiest more than its share
    e.time.compute += e.time.bubble;
    e.time.bubble = 0;
  }

  // --- memory and the step's tail per stage --------------------------------------------------
  double tail = 0, tail_dp = 0, tail_opt = 0;
  for (int s = 0; s < p; ++s) {
    const double P = rank_parameters(s);
    e.memory.push_back(plan_detail::stage_memory(pr, mc, l, in, s, live[static_cast<std::size_t>(s)]));
    const double shard = std::ceil(P / l.dp);
    // dp: the buckets' all-reduce overlaps the last backward except its last bucket; ZeRO's
    // reduce-scatter + all-gather (the same volume) do not overlap, and pack / unpack the values
    double dp               = 0;
    const double grad_bytes = sb * P;
    if (l.zero == 2) {
      // ZeRO-2: each microbatch's buckets reduce-scattered during its backward (the last bucket
      // exposed, the rest beyond the backward's time), the values all-gathered after the update;
      // buckets zeroed per microbatch, the values unpacked
      const double half    = 0.5 * mc.reduce_scatter_all_gather_on(grad_bytes, l.dp, l.tp);
      const double buckets = std::max(1.0, std::ceil(grad_bytes / double(pr.bucket_bytes)));
      dp = m * (half / buckets + std::max(0.0, half * (buckets - 1) / buckets - tb[std::size_t(s)])) + half +
           mc.memory((m + 2) * grad_bytes) / share;
    } else if (l.zero) {
      dp = mc.reduce_scatter_all_gather_on(grad_bytes, l.dp, l.tp) + mc.memory(4 * grad_bytes) / share;
    } else if (l.dp > 1 && (l.sync.mode == DpMode::Sync || l.sync.mode == DpMode::Bf16)) {
      // bf16: half the bytes on the wire; packing reads g and r and writes the wire and r,
      // unpacking reads the wire and writes g
      const bool half      = l.sync.mode == DpMode::Bf16;
      const double wire    = half ? 2 * P : grad_bytes;
      const double buckets = std::max(1.0, std::ceil(grad_bytes / double(pr.bucket_bytes)));
      const double ar      = mc.all_reduce_on(wire, l.dp, l.tp);
      dp                   = ar / buckets + std::max(0.0, ar * (buckets - 1) / buckets - tb[std::size_t(s)]) +
           mc.memory(half ? 4 * grad_bytes + 4 * P : 2 * grad_bytes) / share;
    } else if (l.dp > 1 && l.sync.mode == DpMode::Stale) {
      // the sum overlaps the S steps before it is applied (all of a step's compute and
      // communication but its own); what it does not fit into is exposed
      const double ar   = mc.all_reduce_on(grad_bytes, l.dp, l.tp);
      const double step = makespan + mc.memory(2 * grad_bytes) / share;
      dp                = std::max(0.0, ar - l.sync.period * step) + mc.memory(2 * grad_bytes) / share;
    } else if (l.dp > 1) {
      // LocalSgd / DiLoCo: the parameters' average (blocking) every `period` steps, DiLoCo's
      // outer step reading x, anchor, momentum and writing them
      const double avg = mc.all_reduce_on(grad_bytes, l.dp, l.tp) +
                         (l.sync.mode == DpMode::DiLoCo ? mc.memory(6 * grad_bytes) / share : 0.0);
      dp = avg / l.sync.period;
    }
    // zero_grad (write G), norm (read G), AdamW (read p g m v, write p m v) on what this rank
    // updates
    const double updated = l.zero ? shard : P;
    const double opt = (mc.optimizer_seconds_per_value > 0 ? mc.optimizer_seconds_per_value * (2 * P + 7 * updated) / 9
                                                           : mc.memory(sb * (2 * P + 7 * updated))) /
                           share +
                       mc.all_reduce_on(16, l.tp, 1) + mc.all_reduce_on(16, l.pp, l.tp * l.dp) +
                       (l.zero ? mc.all_reduce_on(16, l.dp, l.tp) : 0.0) + 2 * double(P > 0) * 20 * mc.kernel_seconds;
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

}  // namespace plan_detail

/// \brief The peak bytes per rank of layout `l` (Estimate::peak_bytes) when its stages hold
/// `live` live microbatches each: the memory model alone, without simulating the schedule. The
/// planner's search sizes variants of a layout (sequence parallelism, recomputation) with the
/// live counts of the layout's own estimate, which the same schedule gives them. `heaviest`, when
/// given, receives the stage of the peak.
/// \throws pmt::ConfigError when the layout cannot run the problem, or `live` has not pp entries.
inline double peak_bytes(const Problem& pr, const Machine& mc, const Layout& l, const std::vector<int>& live,
                         int* heaviest = nullptr) {
  const std::string why = why_invalid(pr, l, mc.ranks);
  detail::require<ConfigError>(
      why.empty() && live.size() == static_cast<std::size_t>(l.pp), "pmt::plan::peak_bytes", [&] {
        return l.describe() + ": " + (why.empty() ? detail::str(live.size(), " live counts for pp ", l.pp) : why);
      });
  return plan_detail::peak_bytes_on(pr, mc, l, stage_plan(pr, l.pp * l.chunks), live, heaviest);
}

/// \brief The prediction for one layout.
/// \throws pmt::ConfigError when the layout cannot run the problem (why_invalid).
inline Estimate estimate(const Problem& pr, const Machine& mc, const Layout& l) {
  const std::string why = why_invalid(pr, l, mc.ranks);
  detail::require<ConfigError>(why.empty(), "pmt::plan::estimate", [&] { return l.describe() + ": " + why; });
  return plan_detail::estimate_on(pr, mc, l, stage_plan(pr, l.pp * l.chunks));
}

}  // namespace pmt::plan
