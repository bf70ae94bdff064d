// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the planner reasons about (plan/model.hpp describes the model of a step): the Machine
// (rates per rank), the Problem (the model and batch), a Layout (dp x tp x pp, microbatches,
// schedule, chunks, ZeRO, data-parallel mode, recomputation), the parts of an Estimate (Memory,
// Time, bytes per axis) and why_invalid(), the one source of a layout's validity rules.

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
  std::snprintf(
      line, sizeof line,
      "%d ranks; per rank alone: GEMM %.1f GFLOP/s, bandwidth %.1f GB/s, kernel "
      "launch %.1f us; "
      "core share %.2f; all-reduce %.2f GB/s + %.1f us (2 ranks), %.2f GB/s + %.1f us (all); "
      "memory %s (%s)",
      m.ranks, m.gemm_gflops, m.memory_gbps, 1e6 * m.kernel_seconds, m.core_share,
      m.link(2) ? m.link(2)->gbps : m.link_gbps, 1e6 * (m.link(2) ? m.link(2)->latency : 2 * m.link_latency),
      m.link(m.ranks) ? m.link(m.ranks)->gbps : m.link_gbps,
      1e6 * (m.link(m.ranks) ? m.link(m.ranks)->latency : 2 * (m.ranks - 1) * m.link_latency),
      m.memory_bytes > 0 ? pmt::detail::str(std::round(m.memory_bytes / 1048576.0), " MiB").c_str() : "unlimited",
      m.source.c_str());
  std::string out(line);
  if (m.ranks_per_node > 0)
    out += pmt::detail::str("; nodes of ", m.ranks_per_node, " ranks: inside ", m.intra.gbps, " GB/s + ",
                            1e6 * m.intra.latency, " us, between ", m.inter.gbps, " GB/s + ", 1e6 * m.inter.latency,
                            " us per rank");
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
        return pmt::detail::str("local ", period);
      case DpMode::DiLoCo:
        return pmt::detail::str("diloco ", period);
      case DpMode::Stale:
        return pmt::detail::str("stale ", period);
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
        pmt::detail::str(
            "'", text,
            "' is not a data-parallel mode; expected sync, bf16, local:H, diloco:H (H >= 1) or stale:S (S >= 0)"));
  return c;
}

/// \brief One way to run it.
struct Layout {
  int dp = 1, tp = 1, pp = 1, microbatches = 1;
  parallel::ScheduleKind schedule = parallel::ScheduleKind::OneFOneB;
  /// ZeRO stage: 0 AdamW, 1 its state sharded over dp (optim::ZeroAdamW), 2 the gradients too
  /// (optim::Zero2AdamW), 3 the parameters too (optim::Zero3AdamW).
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
  /// ZeRO-3: the dp ranks a parameter is sharded over (optim::Zero3Options::shard_size; 0: all of
  /// dp; a divisor of dp: hybrid sharding, replicated across the groups), and the units whose
  /// values are gathered ahead of their use (Zero3Options::prefetch).
  int shard_size = 0;
  int prefetch   = 1;
  /// \brief The ranks a ZeRO-3 parameter is cut over: shard_size, or dp.
  int shard_group() const noexcept { return shard_size > 0 ? shard_size : dp; }
  /// \brief Whether pipeline stage s recomputes (recompute_stages).
  bool recomputes_on(int s) const noexcept { return recompute_stages <= 0 || s < recompute_stages; }
  /// \brief "dp 2 x tp 1 x pp 2, m 4, 1f1b, zero" (", zero2" for ZeRO-2, ", zero3 shard 2" for
  /// ZeRO-3 sharded in groups of 2; "1f1b x2" with 2 chunks per stage; ", bf16",
  /// ", local 8" ... for a data-parallel mode other than sync; ", recompute"; ", recompute
  /// attention"; ", seq" with sequence parallelism)
  std::string describe() const {
    return pmt::detail::str(
        "dp ", dp, " x tp ", tp, " x pp ", pp, ", m ", microbatches,
        pp > 1 ? std::string(", ") + parallel::schedule_name(schedule) : std::string(),
        chunks > 1 ? pmt::detail::str(" x", chunks) : std::string(),
        zero == 1   ? ", zero"
        : zero == 2 ? ", zero2"
        : zero == 3 ? pmt::detail::str(
                          ", zero3",
                          shard_size > 0 && shard_size < dp ? pmt::detail::str(" shard ", shard_size) : std::string(),
                          prefetch == 0 ? " no prefetch" : "")
                    : "",
        sync.mode != DpMode::Sync ? ", " + sync.describe() : std::string(), recompute ? ", recompute" : "",
        recompute_attention ? ", recompute attention" : "",
        recompute_stages > 0 && (recompute || recompute_attention) ? pmt::detail::str(" on stages < ", recompute_stages)
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
          add(pmt::detail::str("pmt::DataParallel<pmt::LocalSgd<", sync.period, ">>"));
          break;
        case DpMode::DiLoCo:
          add(pmt::detail::str("pmt::DataParallel<pmt::DiLoCo<", sync.period, ">>"));
          break;
        case DpMode::Stale:
          add(pmt::detail::str("pmt::DataParallel<pmt::BoundedStaleness<", sync.period, ">>"));
          break;
      }
    }
    if (tp > 1) add(sequence_parallel ? "pmt::TensorSplit<pmt::Sequence>" : "pmt::TensorSplit<>");
    if (pp > 1)
      add(pmt::detail::str("pmt::Pipeline<", pp,
                           schedule == parallel::ScheduleKind::GPipe ? std::string(", pmt::GPipe")
                           : chunks > 1 ? pmt::detail::str(", pmt::Interleaved<", chunks, ">")
                                        : std::string(),
                           ">"));
    if (recompute || recompute_attention)
      add(pmt::detail::str("pmt::Recompute<", recompute ? "pmt::Full" : "pmt::Selective",
                           recompute_stages > 0 ? pmt::detail::str(", ", recompute_stages) : std::string(), ">"));
    return "pmt::Hybrid<" + parts + ">";
  }
};

/// \brief Bytes one rank holds, by kind.
struct Memory {
  double parameters = 0, gradients = 0, optimizer = 0, buckets = 0, data = 0, activations = 0, transient = 0;
  double scratch  = 0;  ///< the portable matmul kernel's team scratch (Machine::matmul_scratch_bytes)
  double products = 0;  ///< bf16 products' operand copies (Machine::bf16_copy_bytes), one per shape
  /// The pipeline's send buffers. A run holds one per send in flight, as many as the receivers'
  /// timing leaves: this counts what the runs measured hold (the Gpt: detail::pipeline_sends
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
    return pmt::detail::str("dp ", l.dp, ", tp ", l.tp, ", pp ", l.pp, ", microbatches ", l.microbatches, ", chunks ",
                            l.chunks, " must all be >= 1");
  if (l.chunks > 1 && l.pp == 1) return pmt::detail::str(l.chunks, " model chunks per stage need pp > 1");
  if (static_cast<long>(l.dp) * l.tp * l.pp != ranks)
    return pmt::detail::str("dp ", l.dp, " x tp ", l.tp, " x pp ", l.pp, " = ", static_cast<long>(l.dp) * l.tp * l.pp,
                            " is not ", ranks, " ranks");
  if (pr.spec.empty()) {
    if (c.heads == 0 || c.width % c.heads != 0)
      return pmt::detail::str("width ", c.width, " is not divisible by heads ", c.heads);
    if (c.heads % tp != 0) return pmt::detail::str("heads ", c.heads, " are not divisible by tp ", l.tp);
    if (c.vocab % tp != 0) return pmt::detail::str("vocabulary ", c.vocab, " is not divisible by tp ", l.tp);
  } else {
    for (const auto& y : pr.spec.layers)
      for (std::size_t d : y.divides)
        if (d % tp != 0) return pmt::detail::str("layer ", y.name, ": ", d, " features are not divisible by tp ", l.tp);
  }
  const std::size_t layers = pr.spec.empty() ? c.layers : pr.spec.layers.size();
  if (layers < static_cast<std::size_t>(l.pp))
    return pmt::detail::str(layers, " layers cannot fill pp ", l.pp, " stages (every stage needs a layer)");
  if (layers < static_cast<std::size_t>(l.pp) * static_cast<std::size_t>(l.chunks))
    return pmt::detail::str(layers, " layers cannot fill pp ", l.pp, " x ", l.chunks,
                            " chunks (every chunk needs a layer)");
  if (pr.batch % static_cast<std::size_t>(l.dp) != 0)
    return pmt::detail::str("batch ", pr.batch, " is not divisible by dp ", l.dp);
  const std::size_t local = pr.batch / static_cast<std::size_t>(l.dp);
  if (local % static_cast<std::size_t>(l.microbatches) != 0)
    return pmt::detail::str(l.microbatches, " microbatches do not divide the ", local, " sequences per dp rank (batch ",
                            pr.batch, " / dp ", l.dp, ")");
  if (l.zero < 0 || l.zero > 3) return pmt::detail::str("ZeRO stage ", l.zero, " is not 0, 1, 2 or 3");
  if (l.shard_size != 0 && (l.zero != 3 || l.shard_size < 0 || l.dp % l.shard_size != 0))
    return l.zero != 3 ? pmt::detail::str("a shard size (", l.shard_size, ") is ZeRO-3's hybrid sharding; this is ",
                                          l.zero ? pmt::detail::str("ZeRO-", l.zero) : std::string("no ZeRO"))
                       : pmt::detail::str("shard size ", l.shard_size, " does not divide dp ", l.dp);
  if (l.prefetch < 0) return pmt::detail::str("prefetch ", l.prefetch, " is negative");
  if (l.zero && l.dp == 1) return pmt::detail::str("ZeRO-", l.zero, " shards over dp, and dp is 1");
  if (l.recompute_stages < 0 || l.recompute_stages > l.pp)
    return pmt::detail::str("recompute_stages ", l.recompute_stages, " is not in [0, pp ", l.pp, "]");
  if (l.recompute_stages > 0 && !l.recompute && !l.recompute_attention)
    return pmt::detail::str("recompute_stages ", l.recompute_stages,
                            " names stages that recompute, and nothing recomputes");
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
      return pmt::detail::str("sequence parallelism splits a microbatch's ", tokens, " tokens over tp ", l.tp,
                              ", which does not divide them");
  }
  if (l.sync.mode != DpMode::Sync && l.dp == 1) return pmt::detail::str("dp mode ", l.sync.describe(), " needs dp > 1");
  if (l.sync.mode != DpMode::Sync && l.zero)
    return pmt::detail::str("dp mode ", l.sync.describe(), " does not combine with ZeRO-", l.zero);
  if (l.chunks > 1 && l.schedule == parallel::ScheduleKind::OneFOneB && l.microbatches % l.pp != 0)
    return pmt::detail::str("interleaved 1F1B needs microbatches (", l.microbatches, ") a multiple of pp ", l.pp);
  return "";
}

}  // namespace pmt::plan
