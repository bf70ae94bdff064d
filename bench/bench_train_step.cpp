// SPDX-License-Identifier: Apache-2.0
// Time of one training step (forward + loss + backward + dp sync + clipping + AdamW) of pmt's Gpt,
// fp32, on the host execution space, with every rank in data parallelism (dp = world size; run
// under mpiexec for weak scaling: each rank processes its own batch).
// Usage: bench_train_step LAYERS WIDTH HEADS CONTEXT BATCH VOCAB STEPS   (or: bench_train_step peak)
// Prints one machine-readable line: "pmt_step ms=.. tokens_per_s=.. flops_per_step=.. ranks=..".
// FLOPs per step (per rank): tokens * (6 P + 6 L T C) with P the weights of every matmul (the
// blocks' 12 C^2 per layer and the tied head's V C) and 6 L T C the attention's QK^T and AV products
// (forward 2 x 2 T C per token per layer with the causal half skipped only in the softmax, times
// 3 for forward + backward): the usual 6N rule plus attention.
#include "bench_common.hpp"

#include <cstdlib>
#include <string>
#include <vector>

using Exec = Kokkos::DefaultHostExecutionSpace;

int main(int argc, char* argv[]) {
  pmt::ScopeGuard guard(argc, argv);
  // Keep freed activation memory for the next step (pmt/core/host_memory.hpp; printed below);
  // PMT_KEEP_FREED_HOST_MEMORY=0 measures glibc's default instead.
  const char* keep_env = std::getenv("PMT_KEEP_FREED_HOST_MEMORY");
  const bool kept = (keep_env == nullptr || std::string(keep_env) != "0") && pmt::keep_freed_host_memory();
  if (argc == 2 && std::string(argv[1]) == "peak") {
    std::printf("peak gflops=%.1f threads=%d\n", pmt::bench::measured_fp32_peak_gflops(), Exec().concurrency());
    return 0;
  }
  if (argc == 2 && std::string(argv[1]) == "instrument") {  // ns per Instrument with no tool and the recorder off
    const long n = 20'000'000;
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
  Opt opt(model.parameters(), pmt::ops::AdamWParams{3e-4, 0.9, 0.95, 1e-8, 0.1, 1});
  const char* bucket_env = std::getenv("PMT_BUCKET_KIB");  // dp bucket size (default: GradSync's)
  const std::size_t bucket = bucket_env ? std::size_t(std::atol(bucket_env)) << 10
                                        : pmt::parallel::GradSync<float, Exec, Backend>::default_bucket_bytes;
  pmt::train::Trainer<Model, Opt, Exec, Backend> trainer(mesh, model, opt, Exec(), bucket);
  pmt::train::Microbatch<Model::Ids> mb{Model::Ids("ids", B * T), Model::Ids("targets", B * T), B, T};
  auto ids = Kokkos::create_mirror_view(mb.ids), tgt = Kokkos::create_mirror_view(mb.targets);
  for (std::size_t n = 0; n < B * T; ++n) {
    ids(n) = static_cast<std::int32_t>((n * 7 + world.rank() * 13) % V);
    tgt(n) = static_cast<std::int32_t>((n * 7 + 5 + world.rank() * 13) % V);
  }
  Kokkos::deep_copy(mb.ids, ids);
  Kokkos::deep_copy(mb.targets, tgt);
  const pmt::train::StepOptions o{double(B * T) * world.size(), 3e-4, 1.0};
  double loss = 0;
  const double t = pmt::bench::median_seconds(steps, [&] {
    loss = trainer.step({mb}, o);
    Kokkos::fence();
  });
  const double P = double(L) * 12 * C * C + double(V) * C;
  const double flops = double(B * T) * (6 * P + 6 * double(L) * T * C);
  if (world.rank() == 0)
    std::printf("pmt_step ms=%.3f tokens_per_s=%.1f flops_per_step=%.6e ranks=%d threads=%d loss=%.4f "
                "host_memory_kept=%d\n",
                t * 1e3, double(B * T) * world.size() / t, flops, world.size(), Exec().concurrency(), loss, kept ? 1 : 0);
  return 0;
}
