// SPDX-License-Identifier: Apache-2.0
// The planner against published large training runs (docs/planner.md, "Published runs"): given
// each run's model, batch and GPU count and the rates of its cluster (A100 80 GB, nodes of 8), it
//   * predicts the published layout's per-GPU throughput within 25 % of the published figure for
//     the six Megatron-LM and BLOOM runs, the layout run as published (its dp x tp x pp,
//     microbatch size, schedule, full activation recomputation, bf16 activations beside fp32
//     master weights, ZeRO-1 where the run had it), and fits it in memory. MT-NLG misses: the
//     planner predicts it 36 % faster than published; it runs the same model on nearly the
//     layout of Megatron-LM's 529.6B row, which published 163 against MT-NLG's 126 TFLOP/s per
//     GPU, so the planner must at least put MT-NLG below that row;
//   * chooses, searching freely, a layout of the same class (tp inside a node, pp and dp across
//     nodes), predicted at least as fast as the published layout, and plans 3,072 ranks within a
//     minute on 2 cores;
//   * names each layout's C++ policy type, spelled so that it compiles;
//   * predicts the speed-up of sequence parallelism with the attention's recomputation over full
//     recomputation on the 530B model within 10 % of the published one (Korthikanti et al.).
// The throughput is counted as the publications count it (plan::gpt_step_flops: the products,
// the recomputed forward included) over the predicted step.
#include <catch2/catch_test_macros.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <string>
#include <type_traits>
#include <vector>

#include "pmt/plan/planner.hpp"
#include "pmt/policy/hybrid.hpp"

namespace {

/// One published run: the model, the batch, the GPUs and the layout the authors ran, and the
/// throughput they report (TFLOP/s per GPU).
struct Published {
  const char* name;
  std::size_t layers, width, heads, vocab, batch;
  int gpus, tp, pp;
  std::size_t microbatch;  // sequences per microbatch
  int chunks;              // model chunks per stage (> 1: interleaved 1F1B, a chunk's layers equal)
  double tflops;           // published, per GPU
  double inter_gbps;       // the network per GPU: the cluster's links per node / 8
  bool zero   = false;     // the optimizer state sharded over dp (ZeRO-1)
  bool within = true;      // held to the 25 % (MT-NLG is not; see above)
};

// The cluster: A100 80 GB SXM (bf16 tensor-core peak 312 TFLOP/s, HBM2e 2039 GB/s), NVSwitch
// inside a node of 8. kGemm is the rate the planner is given for the products: 80 % of the
// peak, what cuBLAS sustains on GEMMs of these sizes.
constexpr double kGemm = 250000, kHbm = 2039 * 0.8, kNvlink = 230, kMemoryMiB = 81920;

// Sources (docs/planner.md cites them): Narayanan et al. 2021, "Efficient Large-Scale Language
// Model Training on GPU Clusters Using Megatron-LM", Table 1 and §5.1 (Selene: 8 HDR InfiniBand
// links of 200 Gb/s per node); Smith et al. 2022, "Using DeepSpeed and Megatron to Train
// Megatron-Turing NLG 530B", §2.4 (Selene); the BigScience Workshop 2022, "BLOOM: A 176B-Parameter
// Open-Access Multilingual Language Model", §3.4 (Jean Zay: 4 Omni-Path links of 100 Gb/s per
// node).
const std::vector<Published> kRuns = {
    // the layout of this run is not published: taken as the 145.6B row's, the same width
    {"GPT-3 175B, Megatron-LM (1024 GPUs)", 96, 12288, 96, 51200, 1536, 1024, 8, 8, 1, 2, 140, 25},
    {"145.6B, Megatron-LM Table 1", 80, 12288, 96, 51200, 2304, 1536, 8, 8, 1, 2, 148, 25},
    {"310.1B, Megatron-LM Table 1", 96, 16384, 128, 51200, 2160, 1920, 8, 16, 1, 2, 155, 25},
    {"1T, Megatron-LM Table 1", 128, 25600, 160, 51200, 3072, 3072, 8, 64, 1, 2, 163, 25},
    {"529.6B, Megatron-LM Table 1", 105, 20480, 128, 51200, 2520, 2520, 8, 35, 1, 3, 163, 25},
    {"MT-NLG 530B (280 nodes)", 105, 20480, 128, 50272, 1920, 2240, 8, 35, 1, 1, 126, 25, false, false},
    {"BLOOM 176B", 70, 14336, 112, 250880, 2048, 384, 4, 12, 2, 1, 150, 6.25, true},
};

pmt::plan::Problem problem_of(const Published& r) {
  pmt::plan::Problem p;
  p.model            = {r.vocab, /*context=*/2048, r.layers, r.width, r.heads, 1};
  p.batch            = r.batch;
  p.precision        = pmt::Precision::bf16;
  p.activation_bytes = 2;
  return p;
}

pmt::plan::Machine machine_of(const Published& r) {
  pmt::plan::Machine m;
  m.ranks          = r.gpus;
  m.gemm_gflops    = kGemm;
  m.memory_gbps    = kHbm;
  m.kernel_seconds = 5e-6;
  m.memory_bytes   = kMemoryMiB * 1048576.0;
  m.ranks_per_node = 8;
  m.intra          = {0, 5e-6, kNvlink};
  m.inter          = {0, 10e-6, r.inter_gbps};
  return m;
}

double tflops_per_gpu(const Published& r, const pmt::plan::Estimate& e) {
  return pmt::plan::gpt_step_flops(problem_of(r).model, r.batch, e.layout.recompute) / e.step_seconds() / r.gpus / 1e12;
}

pmt::plan::Estimate as_published(const Published& r) {
  const int dp = r.gpus / r.tp / r.pp;
  pmt::plan::Layout l{
      dp,     r.tp,    r.pp, int(r.batch / std::size_t(dp) / r.microbatch), pmt::parallel::ScheduleKind::OneFOneB,
      r.zero, r.chunks};
  l.recompute = true;
  return pmt::plan::estimate(problem_of(r), machine_of(r), l);
}

}  // namespace

TEST_CASE("published runs: the published layout's throughput within 25 %", "[plan][published]") {
  double mtnlg = 0, megatron530 = 0;
  for (const auto& r : kRuns) {
    const auto e           = as_published(r);
    const double predicted = tflops_per_gpu(r, e);
    std::printf("%-36s %s: predicted %.1f TFLOP/s per GPU (%.2f s a step), published %.0f: %+.1f %%; peak %.1f GiB\n",
                r.name, e.layout.describe().c_str(), predicted, e.step_seconds(), r.tflops,
                100 * (predicted / r.tflops - 1), e.peak_bytes() / 1073741824.0);
    INFO(r.name << ": predicted " << predicted << " TFLOP/s per GPU, published " << r.tflops);
    if (r.within) CHECK(std::abs(predicted / r.tflops - 1) <= 0.25);
    CHECK(e.peak_bytes() <= kMemoryMiB * 1048576.0);
    if (std::string(r.name).rfind("MT-NLG", 0) == 0) mtnlg = predicted;
    if (std::string(r.name).rfind("529.6B", 0) == 0) megatron530 = predicted;
  }
  CHECK(mtnlg > 0);
  CHECK(mtnlg < megatron530);
}

TEST_CASE("published runs: the planner's own choice keeps tp inside a node", "[plan][published]") {
  // three sizes of machine: 384, 1024 and 3072 ranks (the other runs plan alike, in seconds each)
  for (const char* name : {"GPT-3 175B", "1T", "BLOOM"}) {
    const Published* run = nullptr;
    for (const auto& r : kRuns)
      if (std::string(r.name).rfind(name, 0) == 0) run = &r;
    REQUIRE(run);
    const auto& r = *run;
    // the bound is on the search's own processor time: with ctest -j the other tests share the
    // cores, which stretches the wall time but not the work (the search runs on one thread)
    const auto start     = std::chrono::steady_clock::now();
    const std::clock_t c = std::clock();
    const auto plan      = pmt::plan::search(problem_of(r), machine_of(r));
    const double cpu     = double(std::clock() - c) / CLOCKS_PER_SEC;
    const double s       = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const auto& best     = plan.best();
    std::printf("%-36s chose %s: %.1f TFLOP/s per GPU (%.2f s a step; searched in %.1f s, %.1f s of processor time)\n",
                r.name, best.layout.describe().c_str(), tflops_per_gpu(r, best), best.step_seconds(), s, cpu);
    INFO(r.name << ": " << best.layout.describe());
    CHECK(8 % best.layout.tp == 0);  // a tp group never spans nodes
    CHECK(best.layout.pp * best.layout.dp > 1);
    CHECK(best.step_seconds() <= 1.01 * as_published(r).step_seconds());
    CHECK(cpu < 20);  // 0.4-4 s on 2 cores of an AMD EPYC
  }
}

TEST_CASE("published runs: sequence parallelism and the attention's recomputation against full recomputation",
          "[plan][published]") {
  // Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
  // (arXiv:2205.05198), abstract: the 530B model on 2,240 A100 GPUs reaches a model FLOPs
  // utilization of 54.2 % with sequence parallelism and selective recomputation against 42.1 %
  // with full recomputation, 1.29x. The planner gets the same model, GPUs and layout (tp 8 x
  // pp 35; the batch and microbatches of the MT-NLG run above, which the abstract does not give)
  // both ways; MFU counts the same model FLOPs, so the ratio of step times is the ratio of MFUs.
  const Published& r = kRuns[5];
  REQUIRE(std::string(r.name).rfind("MT-NLG", 0) == 0);
  const auto full     = as_published(r);
  pmt::plan::Layout l = full.layout;
  l.recompute = false, l.recompute_attention = true, l.sequence_parallel = true;
  const auto split   = pmt::plan::estimate(problem_of(r), machine_of(r), l);
  const double ratio = full.step_seconds() / split.step_seconds(), published = 54.2 / 42.1;
  std::printf(
      "530B on 2240 GPUs: %.2f s a step with full recomputation, %.2f s with sequence parallelism and the "
      "attention's recomputation (peak %.1f GiB): %.3fx, published %.3fx\n",
      full.step_seconds(), split.step_seconds(), split.peak_bytes() / 1073741824.0, ratio, published);
  CHECK(split.peak_bytes() <= kMemoryMiB * 1048576.0);
  CHECK(std::abs(ratio / published - 1) <= 0.10);
}

// The spelling Layout::policy_type gives is a type: each case below declares it and keeps its text.
#define PMT_SPELLED(name, ...)                   \
  [[maybe_unused]] constexpr __VA_ARGS__ name{}; \
  [[maybe_unused]] const std::string name##_text = #__VA_ARGS__

TEST_CASE("a layout names its C++ policy type, spelled so that it compiles", "[plan][policy]") {
  pmt::plan::Layout l;
  PMT_SPELLED(None, pmt::Hybrid<>);
  CHECK(l.policy_type() == None_text);
  l.dp = 24, l.tp = 8, l.pp = 8, l.sequence_parallel = true, l.recompute_attention = true;
  PMT_SPELLED(Megatron, pmt::Hybrid<pmt::DataParallel<>, pmt::TensorSplit<pmt::Sequence>, pmt::Pipeline<8>,
                                    pmt::Recompute<pmt::Selective>>);
  CHECK(l.policy_type() == Megatron_text);
  static_assert(pmt::activation_policy<std::decay_t<decltype(Megatron)>>::selective && Megatron.sequence_parallel);
  l.sync = {pmt::plan::DpMode::LocalSgd, 8}, l.chunks = 2, l.sequence_parallel = false, l.recompute_attention = false;
  l.recompute = true, l.recompute_stages = 3;
  PMT_SPELLED(Local, pmt::Hybrid<pmt::DataParallel<pmt::LocalSgd<8>>, pmt::TensorSplit<>,
                                 pmt::Pipeline<8, pmt::Interleaved<2>>, pmt::Recompute<pmt::Full, 3>>);
  CHECK(l.policy_type() == Local_text);
  l.sync = {pmt::plan::DpMode::Stale, 1}, l.tp = 1, l.schedule = pmt::parallel::ScheduleKind::GPipe,
  l.recompute = false;
  PMT_SPELLED(Stale, pmt::Hybrid<pmt::DataParallel<pmt::BoundedStaleness<1>>, pmt::Pipeline<8, pmt::GPipe>>);
  CHECK(l.policy_type() == Stale_text);
  l.sync = {pmt::plan::DpMode::DiLoCo, 4}, l.pp = 1;
  PMT_SPELLED(Outer, pmt::Hybrid<pmt::DataParallel<pmt::DiLoCo<4>>>);
  CHECK(l.policy_type() == Outer_text);
}
