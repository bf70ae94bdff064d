// SPDX-License-Identifier: Apache-2.0
// Time of one training step (forward + loss + backward + dp sync + clipping + AdamW) of pmt's Gpt,
// fp32 (PMT_BENCH_PRECISION=bf16: bf16 products, fp32 masters), on the host execution space, with every rank in data
// parallelism (dp = world size; run under mpiexec for weak scaling: each rank processes its own batch). Usage:
// bench_train_step LAYERS WIDTH HEADS CONTEXT BATCH VOCAB STEPS   (or: bench_train_step peak;
//        bench_train_step products LAYERS WIDTH HEADS CONTEXT BATCH VOCAB STEPS: the step's matmuls alone)
// Prints one machine-readable line: "pmt_step ms=.. tokens_per_s=.. flops_per_step=.. ranks=..".
// With PMT_BENCH_DP_PAIRED=1 (under mpiexec -n N, STEPS = rounds) it measures data-parallel weak
// scaling as paired rounds instead (dp_paired below): "pmt_dp_paired one_ms=.. dp_ms=.. efficiency=..".
// FLOPs per step (per rank): tokens * (6 P + 6 L T C) with P the weights of every matmul (the
// blocks' 12 C^2 per layer and the tied head's V C) and 6 L T C the attention's QK^T and AV products
// (forward 2 x 2 T C per token per layer with the causal half skipped only in the softmax, times
// 3 for forward + backward): the usual 6N rule plus attention.
#include "bench_common.hpp"

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

using Exec = Kokkos::DefaultHostExecutionSpace;

#if PMT_ENABLE_MPI
namespace {

using Backend = pmt::comm::default_backend_t<Exec>;
using Model   = pmt::nn::Gpt<float, Exec, Backend>;
using Opt     = pmt::optim::AdamW<float, Exec>;
using Train   = pmt::train::Trainer<Model, Opt, Exec, Backend>;

/// A barrier whose waiting ranks sleep (50 us naps) instead of spinning in MPI, so that a rank
/// that computes alone has the machine to itself.
void quiet_barrier(const pmt::comm::Communicator<Backend>& c) {
  MPI_Request r = MPI_REQUEST_NULL;
  MPI_Ibarrier(c.native(), &r);
  for (int done = 0;;) {
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

/// Weak-scaling efficiency as paired measurements (PMT_BENCH_DP_PAIRED=1 under mpiexec -n N).
/// Each round times one step of rank 0 alone (a one-rank model on a communicator of its own, the
/// other ranks asleep), one data-parallel step of all N ranks, each rank with its own batch, and
/// (a diagnostic) every rank's one-rank step at once with no communication, in rotating order.
/// The efficiency is the median of the rounds' ratios: the steps of a round are a fraction of a
/// second apart, so a slow phase of a shared machine (seconds long on the VMs pmt is measured on)
/// weighs on both sides of each ratio instead of on one of two separate runs.
int dp_paired(const pmt::comm::Communicator<Backend>& world, const pmt::nn::GptConfig& cfg,
              const pmt::train::Microbatch<Model::Ids>& mb, const pmt::train::StepOptions& o, std::size_t bucket,
              int rounds) {
  const pmt::optim::AdamWOptions adam{0.9, 0.95, 1e-8, 0.1};
  pmt::Mesh<Backend> mesh(world, pmt::MeshShape{world.size(), 1, 1});
  Model model(mesh, cfg);
  Opt opt(model.parameters(), adam);
  Train dp(mesh, model, opt, Exec(), bucket);
  pmt::Mesh<Backend> alone_mesh(world.split(world.rank(), 0), pmt::MeshShape{1, 1, 1});
  Model alone_model(alone_mesh, cfg);
  Opt alone_opt(alone_model.parameters(), adam);
  Train alone(alone_mesh, alone_model, alone_opt, Exec(), bucket);
  const pmt::train::StepOptions alone_o{o.normaliser / world.size(), o.lr, o.max_norm};
  // 0: rank 0 alone; 1: all ranks in data parallelism; 2: every rank its one-rank step at the same
  // time, without communicating (what the machine's shared memory and cores cost, apart from the
  // gradient all-reduce and the waits at the step's collectives). Seconds of the slowest rank.
  auto timed = [&](int mode) {
    quiet_barrier(world);
    const auto t0 = std::chrono::steady_clock::now();
    if (mode == 1) {
      dp.step({mb}, o);
    } else if (mode == 2 || world.rank() == 0) {
      alone.step({mb}, alone_o);
    }
    Kokkos::fence();
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, world.native());
    return t;
  };
  for (int mode = 0; mode < 3; ++mode) timed(mode);  // warm-up
  std::vector<double> t[3], ratio, contention;
  for (int r = 0; r < rounds; ++r) {
    double round[3];
    for (int i = 0; i < 3; ++i) round[(i + r) % 3] = timed((i + r) % 3);  // rotating order
    for (int m = 0; m < 3; ++m) t[m].push_back(round[m]);
    ratio.push_back(round[0] / round[1]);
    contention.push_back(round[0] / round[2]);
  }
  if (world.rank() == 0) {
    using pmt::bench::median;
    std::printf(
        "pmt_dp_paired one_ms=%.3f dp_ms=%.3f efficiency=%.4f concurrent_ms=%.3f concurrent_efficiency=%.4f "
        "ranks=%d rounds=%d per_round=",
        median(t[0]) * 1e3, median(t[1]) * 1e3, median(ratio), median(t[2]) * 1e3, median(contention), world.size(),
        rounds);
    for (std::size_t i = 0; i < ratio.size(); ++i) std::printf("%s%.3f", i ? "," : "", ratio[i]);
    std::printf("\n");
  }
  return 0;
}

}  // namespace
#endif

/// The step's Linear and LM-head products alone (`bench_train_step products L C H T B V STEPS`):
/// the same pmt::ops::matmul calls as the model's forward and backward make (shapes, transposes,
/// beta), in the same order, on buffers of the same sizes (a separate set per layer, as the model
/// keeps every layer's activations for backward), and nothing else: no bias, attention, GELU,
/// LayerNorm, loss or optimizer. Its time is what this BLAS needs for 6 P tokens FLOPs of the step,
/// a floor for the whole step that no framework on this BLAS goes below.
int products(std::size_t L, std::size_t C, std::size_t T, std::size_t B, std::size_t V, int steps) {
  using pmt::ops::Trans;
  const std::size_t N = B * T;
  Exec exec;
  auto tensor = [&](const char* name, std::size_t r, std::size_t c, std::uint64_t key) {
    auto t = pmt::make_tensor<float, Exec>(name, r, c);
    pmt::fill_uniform(exec, t, {key, 0}, -0.1f, 0.1f);
    return t;
  };
  using Tensor2 = decltype(tensor("", 1, 1, 0));
  struct Lin {
    Tensor2 w, dw, x, y, dy, dx;
  };
  std::vector<Lin> lins;
  const std::size_t shapes[4][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}};  // qkv, proj, fc, fc2
  for (std::size_t l = 0; l < L; ++l)
    for (const auto& io : shapes) {
      const std::uint64_t k = 10 * lins.size();
      lins.push_back({tensor("w", io[0], io[1], k), tensor("dw", io[0], io[1], k + 1), tensor("x", N, io[0], k + 2),
                      tensor("y", N, io[1], k + 3), tensor("dy", N, io[1], k + 4), tensor("dx", N, io[0], k + 5)});
    }
  auto emb = tensor("E", V, C, 1), demb = tensor("dE", V, C, 2), xf = tensor("xf", N, C, 3),
       logits = tensor("logits", N, V, 4), dxf = tensor("dxf", N, C, 5);
  const double t     = pmt::bench::median_seconds(steps, [&] {
    for (auto& l : lins) pmt::ops::matmul(exec, Trans::N, Trans::N, 1.0f, l.x, l.w, 1.0f, l.y);  // y = bias + x W
    pmt::ops::matmul(exec, Trans::N, Trans::T, 1.0f, xf, emb, 0.0f, logits);                     // x E^T
    pmt::ops::matmul(exec, Trans::N, Trans::N, 1.0f, logits, emb, 0.0f, dxf);                    // dlogits E
    pmt::ops::matmul(exec, Trans::T, Trans::N, 1.0f, logits, xf, 1.0f, demb);  // dE += dlogits^T x
    for (auto l = lins.rbegin(); l != lins.rend(); ++l) {
      pmt::ops::matmul(exec, Trans::T, Trans::N, 1.0f, l->x, l->dy, 1.0f, l->dw);  // dW += x^T dy
      pmt::ops::matmul(exec, Trans::N, Trans::T, 1.0f, l->dy, l->w, 0.0f, l->dx);  // dx = dy W^T
    }
    Kokkos::fence();
  });
  const double flops = 6.0 * double(N) * (double(L) * 12 * C * C + double(V) * C);
  std::printf("pmt_products ms=%.3f flops=%.6e gflops=%.1f threads=%d\n", t * 1e3, flops, flops / t / 1e9,
              exec.concurrency());
  return 0;
}

int main(int argc, char* argv[]) {
  pmt::ScopeGuard guard(argc, argv);
  if (argc == 2 && std::string(argv[1]) == "peak") {
    std::printf("peak gflops=%.1f threads=%d isa=%s\n", pmt::bench::measured_fp32_peak_gflops(), Exec().concurrency(),
                pmt::obs::peak_isa().name);
    return 0;
  }
  if (argc == 2 && std::string(argv[1]) == "instrument") {  // ns per Instrument with no tool and the recorder off
    const long n       = 20'000'000;
    volatile long sink = 0;
    Kokkos::Timer t;
    for (long i = 0; i < n; ++i) {
      const pmt::Instrument in("pmt::bench::region");
      sink = sink + 1;
    }
    const double region = t.seconds() / n * 1e9;
    t.reset();
    for (long i = 0; i < n; ++i) {
      const pmt::Instrument in("pmt::bench::event", pmt::Track::Compute, [] { return std::string("event"); });
      sink = sink + 1;
    }
    const double event = t.seconds() / n * 1e9;
    std::printf("instrument region_ns=%.2f region_and_event_ns=%.2f\n", region, event);
    return 0;
  }
  if (argc >= 2 && std::string(argv[1]) == "products") {
    if (argc != 9) {
      std::fprintf(stderr,
                   "usage: %s products LAYERS WIDTH HEADS CONTEXT BATCH VOCAB STEPS (got %d arguments after "
                   "'products', need 7)\n",
                   argv[0], argc - 2);
      return 2;
    }
    auto arg = [&](int i) { return std::size_t(std::strtoul(argv[i], nullptr, 10)); };
    return products(arg(2), arg(3), arg(5), arg(6), arg(7), std::atoi(argv[8]));
  }
  if (argc < 8) {
    std::fprintf(stderr, "usage: %s LAYERS WIDTH HEADS CONTEXT BATCH VOCAB STEPS\n", argv[0]);
    return 2;
  }
  const std::size_t L = std::strtoul(argv[1], nullptr, 10), C = std::strtoul(argv[2], nullptr, 10),
                    H = std::strtoul(argv[3], nullptr, 10), T = std::strtoul(argv[4], nullptr, 10),
                    B = std::strtoul(argv[5], nullptr, 10), V = std::strtoul(argv[6], nullptr, 10);
  const int steps = std::atoi(argv[7]);
  if (std::getenv("PMT_BENCH_TRACE") != nullptr) pmt::TraceRecorder::instance().enable();  // bench/trace_overhead.py
  using Backend = pmt::comm::default_backend_t<Exec>;
#if PMT_ENABLE_MPI
  pmt::comm::Communicator<Backend> world(MPI_COMM_WORLD);
#else
  pmt::comm::Communicator<Backend> world;
#endif
  pmt::Mesh<Backend> mesh(world, pmt::MeshShape{world.size(), 1, 1});
  using Model = pmt::nn::Gpt<float, Exec, Backend>;
  using Opt   = pmt::optim::AdamW<float, Exec>;
  Model model(mesh, pmt::nn::GptConfig{V, T, L, C, H, 7});
  Opt opt(model.parameters(), pmt::optim::AdamWOptions{0.9, 0.95, 1e-8, 0.1});
  const char* bucket_env   = std::getenv("PMT_BUCKET_KIB");  // dp bucket size (default: GradSync's)
  const std::size_t bucket = bucket_env ? std::size_t(std::atol(bucket_env)) << 10
                                        : pmt::parallel::GradSync<float, Exec, Backend>::default_bucket_bytes;
  pmt::train::TrainerOptions topts(bucket);
  const char* precision_env = std::getenv("PMT_BENCH_PRECISION");  // fp32 (default) or bf16
  topts.precision           = pmt::parse_precision(precision_env ? precision_env : "fp32", "PMT_BENCH_PRECISION");
  pmt::train::Trainer<Model, Opt, Exec, Backend> trainer(mesh, model, opt, Exec(), topts);
  pmt::train::Microbatch<Model::Ids> mb{Model::Ids("ids", B * T), Model::Ids("targets", B * T), B, T};
  auto ids = Kokkos::create_mirror_view(mb.ids), tgt = Kokkos::create_mirror_view(mb.targets);
  for (std::size_t n = 0; n < B * T; ++n) {
    ids(n) = static_cast<std::int32_t>((n * 7 + world.rank() * 13) % V);
    tgt(n) = static_cast<std::int32_t>((n * 7 + 5 + world.rank() * 13) % V);
  }
  Kokkos::deep_copy(mb.ids, ids);
  Kokkos::deep_copy(mb.targets, tgt);
  const pmt::train::StepOptions o{double(B * T) * world.size(), 3e-4, 1.0};
#if PMT_ENABLE_MPI
  if (const char* paired = std::getenv("PMT_BENCH_DP_PAIRED"); paired != nullptr && std::string(paired) == "1")
    return dp_paired(world, pmt::nn::GptConfig{V, T, L, C, H, 7}, mb, o, bucket, steps);
#else
  if (std::getenv("PMT_BENCH_DP_PAIRED") != nullptr) {
    std::fprintf(stderr, "bench_train_step: PMT_BENCH_DP_PAIRED needs a build with MPI (PMT_ENABLE_MPI)\n");
    return 2;
  }
#endif
  double loss        = 0;
  const double t     = pmt::bench::median_seconds(steps, [&] {
    loss = trainer.step({mb}, o);
    Kokkos::fence();
  });
  const double P     = double(L) * 12 * C * C + double(V) * C;
  const double flops = double(B * T) * (6 * P + 6 * double(L) * T * C);
  if (world.rank() == 0)
    std::printf(
        "pmt_step ms=%.3f tokens_per_s=%.1f flops_per_step=%.6e ranks=%d threads=%d loss=%.4f "
        "matmul=%s blas_core=%s precision=%s\n",
        t * 1e3, double(B * T) * world.size() / t, flops, world.size(), Exec().concurrency(), loss,
        pmt::ops::matmul_path_label().c_str(),
        pmt::detail::blas_core_name().empty() ? "-" : pmt::detail::blas_core_name().c_str(),
        topts.precision == pmt::Precision::bf16 ? pmt::ops::bf16_matmul_isa<Exec>() : "fp32");
  return 0;
}
