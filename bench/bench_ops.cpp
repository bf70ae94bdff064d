// SPDX-License-Identifier: Apache-2.0
// Memory bandwidth of pmt's row-wise and elementwise ops (fp32) against a STREAM triad measured
// in the same run, on tensors far beyond the caches (64 MiB per tensor).
// GB/s counts the bytes an op must move at least once: layernorm forward reads x and writes y
// (weights and the saved mean/rstd are negligible); softmax reads x, writes y; GELU reads x, writes
// y; AdamW reads param, grad, m, v and writes param, m, v. Triad a = b + s c moves 3 arrays.
// Then causal attention forward + backward, pmt's fused host path against its generic one.
#include "bench_common.hpp"

#include <array>
#include <cstdlib>
#include <string>

using Exec = Kokkos::DefaultHostExecutionSpace;

int main(int argc, char* argv[]) {
  pmt::ScopeGuard guard(argc, argv);
  const int reps = argc > 1 ? std::atoi(argv[1]) : 15;
  Exec exec;
  const std::size_t rows = 16384, cols = 1024, n = rows * cols;  // 64 MiB of fp32
  auto a = pmt::make_tensor<float, Exec>("a", n), b = pmt::make_tensor<float, Exec>("b", n);
  auto c = pmt::make_tensor<float, Exec>("c", n), d = pmt::make_tensor<float, Exec>("d", n);
  pmt::fill_uniform(exec, b, {2, 0}, -1, 1);
  pmt::fill_uniform(exec, c, {2, 1}, -1, 1);
  const double mib = 1.0 / (1 << 20);
  std::printf("pmt bench_ops (fp32, %zu x %zu = %.0f MiB per tensor, %s with %d threads)\n\n", rows, cols,
              double(n) * 4 * mib, Exec::name(), exec.concurrency());

  auto x2 = Kokkos::View<float**, Kokkos::LayoutRight, Exec::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
      b.data(), rows, cols);
  auto y2 = Kokkos::View<float**, Kokkos::LayoutRight, Exec::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
      a.data(), rows, cols);
  auto w = pmt::make_tensor<float, Exec>("w", cols), bias = pmt::make_tensor<float, Exec>("bias", cols);
  auto mean = pmt::make_tensor<float, Exec>("mean", rows), rstd = pmt::make_tensor<float, Exec>("rstd", rows);
  Kokkos::deep_copy(w, 1.0f);
  auto m = pmt::make_tensor<float, Exec>("m", n), v = pmt::make_tensor<float, Exec>("v", n);
  // One run of each per round, in a shuffled order: the VM's slow phases hit the triad and the
  // ops alike, so the ratios hold up better than separately timed blocks.
  const std::vector<double> t =
      pmt::bench::interleaved_medians(reps, {[&] {
                                               Kokkos::parallel_for(
                                                   "stream::triad", Kokkos::RangePolicy<Exec>(exec, 0, n),
                                                   KOKKOS_LAMBDA(std::size_t i) { a(i) = b(i) + 0.5f * c(i); });
                                               exec.fence();
                                             },
                                             [&] {
                                               pmt::ops::layernorm_forward(exec, x2, w, bias, y2, mean, rstd);
                                               exec.fence();
                                             },
                                             [&] {
                                               pmt::ops::softmax(exec, x2, y2);
                                               exec.fence();
                                             },
                                             [&] {
                                               pmt::ops::gelu(exec, b, a);
                                               exec.fence();
                                             },
                                             [&] {
                                               pmt::ops::adamw_update(exec, d, c, m, v, pmt::ops::AdamWParams{});
                                               exec.fence();
                                             }});
  const double t_triad = t[0], t_ln = t[1], t_sm = t[2], t_gelu = t[3], t_adamw = t[4];
  const double stream = 3.0 * 4 * n / t_triad / 1e9;

  struct Row {
    const char* name;
    double bytes, t;
  };
  const Row table[] = {{"stream triad", 3.0 * 4 * n, t_triad},
                       {"layernorm_forward", 2.0 * 4 * n, t_ln},
                       {"softmax", 2.0 * 4 * n, t_sm},
                       {"gelu", 2.0 * 4 * n, t_gelu},
                       {"adamw_update", 7.0 * 4 * n, t_adamw}};
  std::printf("%-20s %10s %10s %12s\n", "op", "ms", "GB/s", "x STREAM");
  for (const Row& r : table)
    std::printf("%-20s %10.2f %10.1f %12.2f\n", r.name, r.t * 1e3, r.bytes / r.t / 1e9, r.bytes / r.t / 1e9 / stream);
  std::printf(
      "\n(median of %d interleaved rounds: one run of each per round; STREAM triad measured in the same rounds)\n",
      reps);

  // Causal attention, forward + backward, at bench/train_step's shapes: the fused host path (one
  // task per head, causal panels) against the generic one (batched products over all heads).
  std::printf("\n%-34s %12s %12s %9s\n", "attention fwd+bwd (B, T, C, H)", "fused ms", "generic ms", "speed-up");
  for (const auto& [B, T, C, H] : {std::array<int, 4>{8, 128, 256, 4}, std::array<int, 4>{8, 128, 768, 12}}) {
    auto qkv  = pmt::make_tensor<float, Exec>("qkv", B, T, 3 * C),
         dqkv = pmt::make_tensor<float, Exec>("dqkv", B, T, 3 * C);
    auto out = pmt::make_tensor<float, Exec>("out", B, T, C), dout = pmt::make_tensor<float, Exec>("dout", B, T, C);
    pmt::fill_uniform(exec, qkv, {3, 0}, -1, 1);
    pmt::fill_uniform(exec, dout, {3, 1}, -1, 1);
    auto cache = pmt::ops::make_attention_cache<float, Exec>(B, T, C, H);
    auto step  = [&](bool generic) {
      pmt::detail::attention_force_generic() = generic;
      pmt::ops::attention_forward(exec, qkv, out, cache);
      pmt::ops::attention_backward(exec, dout, dqkv, cache);
      exec.fence();
      pmt::detail::attention_force_generic() = false;
    };
    const std::vector<std::vector<double>> rounds =
        pmt::bench::interleaved_times(reps, {[&] { step(false); }, [&] { step(true); }});
    const std::string shape =
        "(" + std::to_string(B) + ", " + std::to_string(T) + ", " + std::to_string(C) + ", " + std::to_string(H) + ")";
    std::printf("%-34s %12.2f %12.2f %8.2fx\n", shape.c_str(), 1e3 * pmt::bench::median(rounds[0]),
                1e3 * pmt::bench::median(rounds[1]), pmt::bench::median_round_speedup(rounds[0], rounds[1]));
  }
  std::printf("(each: median of %d interleaved rounds; speed-up = the median of the rounds' generic / fused)\n", reps);
  pmt::bench::target_line("layernorm_vs_stream", 2.0 * 4 * n / t_ln / 1e9 / stream, 0.6);
  pmt::bench::target_line("softmax_vs_stream", 2.0 * 4 * n / t_sm / 1e9 / stream, 0.6);
  return 0;
}
