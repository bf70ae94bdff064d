// SPDX-License-Identifier: Apache-2.0
// Sequence parallelism on the tp axis: the peak of the Kokkos allocations a training step adds
// above the model, the step time and the losses, with and without it, on tp = every rank (dp 1,
// pp 1), next to what the planner predicts for the same layouts. nn::Gpt, float: 4 layers,
// width 256, 4 heads, context 128, 4 microbatches of 2 sequences per step.
// Run on 2 or 4 ranks:
//   mpiexec -n 2 ./bench_sequence [steps]
// Targets: sequence_peak_ratio (the step peak with / without, goal <= 0.9), sequence_step_ratio
// (the step time with / without, goal <= 1.1), sequence_loss_difference (the largest relative
// difference of a step's loss, goal <= 1e-5: float rounding only), sequence_planner_error (the
// largest |predicted - measured| / measured of the two peaks, goal <= 0.1).
#include "bench_common.hpp"

#include <pmt/obs/memory.hpp>
#include <pmt/plan/model.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using T       = float;
using Exec    = Kokkos::DefaultHostExecutionSpace;
using Backend = pmt::comm::default_backend_t<Exec>;
using Model   = pmt::nn::Gpt<T, Exec, Backend>;
using Opt     = pmt::optim::AdamW<T, Exec>;
using Policy  = pmt::Hybrid<pmt::DataParallel<>, pmt::TensorSplit<>, pmt::Pipeline<>>;
const pmt::nn::GptConfig gpt{/*vocab=*/256, /*context=*/128, /*layers=*/4,
                             /*width=*/256, /*heads=*/4,     /*seed=*/5};
constexpr std::size_t sequences = 2, microbatches = 4;

Model::Batch batch(int step, std::size_t i) {
  return pmt::bench::synthetic_token_batch<Model::Batch>(step, i, sequences, gpt.context, gpt.vocab);
}

struct Result {
  double peak_mib = 0, seconds = 0;
  std::vector<double> losses;
};

/// `steps` steps: the peak of each step's Kokkos allocations above what is held before it (each
/// step's memory allocated afresh), the median step time and the losses.
Result run(const pmt::comm::Communicator<Backend>& world, bool seq, int steps) {
  pmt::Mesh<Backend> mesh(world, pmt::MeshShape{1, world.size(), 1});
  Model model(mesh, gpt, pmt::nn::GptOptions{{}, 1, false, seq});
  Opt opt(model.parameters(), {0.9, 0.95, 1e-8, 0.0});
  pmt::train::Trainer<Model, Opt, Exec, Backend, Policy> trainer(mesh, model, opt);
  Result r;
  std::vector<double> times;
  for (int step = 0; step < steps; ++step) {
    std::vector<Model::Batch> mbs;
    for (std::size_t i = 0; i < microbatches; ++i) mbs.push_back(batch(step, i));
    const auto [peak, seconds] = pmt::bench::measured_step([&] {
      r.losses.push_back(trainer.step(mbs, {double(microbatches * sequences * gpt.context), 1e-3, 1.0}));
    });
    times.push_back(seconds);
    r.peak_mib = std::max(r.peak_mib, peak);
  }
  r.seconds = pmt::bench::median(times);
  return r;
}

/// The planner's step peak above the model (activations, transient, data, the matmul kernel's
/// scratch) for the layout, in MiB.
double predicted_mib(int tp, bool seq) {
  pmt::plan::Problem pr;
  pr.model = gpt;
  pr.batch = sequences * microbatches;
  pmt::plan::Machine mc;
  mc.ranks = tp;
  pmt::plan::Layout l{1, tp, 1, int(microbatches), pmt::parallel::ScheduleKind::OneFOneB, false};
  l.sequence_parallel = seq;
  const auto m        = pmt::plan::estimate(pr, mc, l).memory[0];
  return (m.activations + m.transient + m.data) / (1 << 20);
}

}  // namespace

int main(int argc, char* argv[]) {
  pmt::ScopeGuard guard(argc, argv);
  pmt::comm::Communicator<Backend> world(MPI_COMM_WORLD);
  const int steps = argc > 1 ? std::max(2, std::atoi(argv[1])) : 5;
  if (world.size() < 2) {
    std::fprintf(stderr, "bench_sequence: run on 2 or more ranks (tp = ranks)\n");
    return 1;
  }
  pmt::ops::set_matmul_path(pmt::ops::MatmulPath::Vendor);  // no first-use measurement in the peaks
  run(world, false, 1);                                     // warm-up
  const Result plain = run(world, false, steps), seq = run(world, true, steps);
  const Result plain2 = run(world, false, steps), seq2 = run(world, true, steps);  // alternated: drift hits both
  const double t_plain = std::min(plain.seconds, plain2.seconds), t_seq = std::min(seq.seconds, seq2.seconds);
  double worst = 0;
  for (std::size_t i = 0; i < plain.losses.size(); ++i)
    worst = std::max(worst, std::abs(seq.losses[i] - plain.losses[i]) / std::abs(plain.losses[i]));
  if (world.rank() == 0) {
    const int tp         = world.size();
    const double p_plain = predicted_mib(tp, false), p_seq = predicted_mib(tp, true);
    const std::string core = pmt::detail::blas_core_name();
    std::printf("bench_sequence on %s, %d ranks = tp %d%s\n", pmt::bench::cpu_name().c_str(), tp, tp,
                core.empty() ? "" : (", OpenBLAS core " + core).c_str());
    std::printf(
        "GPT %zu layers, width %zu, %zu heads, context %zu; %zu microbatches of %zu sequences; float, %d steps\n",
        gpt.layers, gpt.width, gpt.heads, gpt.context, microbatches, sequences, steps);
    std::printf("%-24s %16s %18s %14s\n", "rank 0", "step peak (MiB)", "predicted (MiB)", "step (ms)");
    std::printf("%-24s %16.2f %18.2f %14.2f\n", "tp", plain.peak_mib, p_plain, 1e3 * t_plain);
    std::printf("%-24s %16.2f %18.2f %14.2f\n", "tp, sequence-parallel", seq.peak_mib, p_seq, 1e3 * t_seq);
    const double err =
        std::max(std::abs(p_plain - plain.peak_mib) / plain.peak_mib, std::abs(p_seq - seq.peak_mib) / seq.peak_mib);
    pmt::bench::target_line("sequence_peak_ratio", seq.peak_mib / plain.peak_mib, 0.9, /*higher_is_better=*/false);
    pmt::bench::target_line("sequence_step_ratio", t_seq / t_plain, 1.1, /*higher_is_better=*/false);
    pmt::bench::target_line("sequence_loss_difference", worst, 1e-5, /*higher_is_better=*/false);
    pmt::bench::target_line("sequence_planner_error", err, 0.1, /*higher_is_better=*/false);
  }
  return 0;
}
