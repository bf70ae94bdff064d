// SPDX-License-Identifier: Apache-2.0
// ZeRO-3 (optim::Zero3AdamW: the parameters sharded over dp, gathered block by block) against
// plain data parallelism and ZeRO-1, on the width-768 GPT (nn::Gpt, float: 12 layers, width 768,
// 12 heads, context 64, byte vocabulary), dp = every rank (tp 1, pp 1).
//   memory  (run on 4 ranks): what a rank holds for weights, gradients and Adam's moments: plain
//           AdamW's 4 P values against ZeRO-3's shard (4 P / dp) and the most it held gathered at
//           once (values of the block in use and the one prefetched, the gradients written and
//           those being reduce-scattered), measured over 2 steps, next to what the planner
//           predicts (plan::estimate: parameters + gradients + optimizer); and each run's peak of
//           Kokkos allocations during the steps (activations included) and at construction (the
//           model is built whole on every rank, then ZeRO-3 keeps its part).
//   time    (run on 2 ranks): the step time of ZeRO-1, of ZeRO-3 with prefetch (1 block ahead) and
//           without it, 2 sequences per rank, steps alternated between the three.
//   mpiexec -n 4 ./bench_zero3 memory
//   mpiexec -n 2 ./bench_zero3 time [steps]
// Targets: zero3_memory_ratio (ZeRO-3's / plain's per rank at dp 4, goal <= 0.35),
// zero3_planner_error (|predicted - measured| / measured of ZeRO-3's, goal <= 0.1),
// zero3_step_ratio (ZeRO-3 with prefetch / ZeRO-1 at dp 2, goal <= 1.15), and, printed beside
// it, the same without prefetch (zero3_no_prefetch_step_ratio, goal <= 1.15: what prefetch buys).
#include "bench_common.hpp"

#include <pmt/obs/memory.hpp>
#include <pmt/optim/zero.hpp>
#include <pmt/optim/zero3.hpp>
#include <pmt/plan/model.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using T       = float;
using Exec    = Kokkos::DefaultHostExecutionSpace;
using Backend = pmt::comm::default_backend_t<Exec>;
using Model   = pmt::nn::Gpt<T, Exec, Backend>;
using Policy  = pmt::Hybrid<pmt::DataParallel<>, pmt::TensorSplit<>, pmt::Pipeline<>>;
using Zero3   = pmt::optim::Zero3AdamW<T, Exec, Backend>;
using Zero1   = pmt::optim::ZeroAdamW<T, Exec, Backend>;
const pmt::nn::GptConfig gpt{/*vocab=*/256, /*context=*/64, /*layers=*/12,
                             /*width=*/768, /*heads=*/12,   /*seed=*/5};
const pmt::optim::AdamWOptions hyper{0.9, 0.95, 1e-8, 0.0};

/// `steps` steps of `opt` on `model`, `sequences` per rank in one microbatch: the step times.
template <class Opt>
std::vector<double> train(const pmt::Mesh<Backend>& mesh, Model& model, Opt& opt, int steps, std::size_t sequences,
                          std::vector<double>* losses = nullptr) {
  pmt::train::Trainer<Model, Opt, Exec, Backend, Policy> trainer(mesh, model, opt);
  const std::size_t first = sequences * std::size_t(mesh.coord(pmt::Axis::dp));
  std::vector<double> times;
  for (int step = 0; step < steps; ++step) {
    std::vector<Model::Batch> mbs{
        pmt::bench::synthetic_token_batch<Model::Batch>(step, first, sequences, gpt.context, gpt.vocab)};
    const double normaliser = double(sequences * std::size_t(mesh.degree(pmt::Axis::dp)) * gpt.context);
    pmt::comm::barrier(mesh.world());
    const auto t0     = std::chrono::steady_clock::now();
    const double loss = trainer.step(mbs, {normaliser, 1e-3, 1.0});
    pmt::comm::barrier(mesh.world());
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (losses) losses->push_back(loss);
  }
  return times;
}

/// The planner's weights + gradients + optimizer bytes per rank for dp ranks at ZeRO stage `zero`.
double predicted_bytes(int dp, int zero, std::size_t sequences) {
  pmt::plan::Problem pr;
  pr.model = gpt;
  pr.batch = sequences * std::size_t(dp);
  pmt::plan::Machine mc;
  mc.ranks = dp;
  pmt::plan::Layout l;
  l.dp = dp, l.zero = zero;
  const auto m = pmt::plan::estimate(pr, mc, l).memory.at(0);
  return m.parameters + m.gradients + m.optimizer;
}

int memory(const pmt::comm::Communicator<Backend>& world) {
  auto& mem = pmt::obs::MemoryTracker::instance();
  mem.enable();
  const int dp               = world.size();
  constexpr std::size_t seqs = 1;
  double plain_bytes = 0, zero3_bytes = 0, gathered = 0;
  double plain_peak = 0, zero3_peak = 0, plain_built = 0, zero3_built = 0;  // during the steps; at construction
  std::size_t P = 0;
  for (int zero : {0, 3}) {
    pmt::Workspace::instance().release();
    mem.reset_peak();
    const double base = double(mem.current_bytes());
    {
      pmt::Mesh<Backend> mesh(world, pmt::MeshShape{dp, 1, 1});
      Model model(mesh, gpt);
      if (zero == 0) {
        pmt::optim::AdamW<T, Exec> opt(model.parameters(), hyper);
        for (auto* p : model.parameters()) P += p->size(), plain_bytes += double(p->value.size() + p->grad.size());
        plain_bytes = (plain_bytes + 2.0 * double(P)) * sizeof(T);  // values, gradients, m, v
        plain_built = double(mem.peak_bytes()) - base;
        mem.reset_peak();
        train(mesh, model, opt, 2, seqs);
        plain_peak = double(mem.peak_bytes()) - base;
      } else {
        Zero3 opt(model.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp));
        zero3_built = double(mem.peak_bytes()) - base;  // the model is built whole, then sharded
        mem.reset_peak();
        train(mesh, model, opt, 2, seqs);
        gathered    = double(opt.peak_gathered_bytes());
        zero3_bytes = double(opt.state_bytes()) + gathered;
        zero3_peak  = double(mem.peak_bytes()) - base;
      }
    }
  }
  if (world.rank() == 0) {
    const double predicted = predicted_bytes(dp, 3, seqs), ratio = zero3_bytes / plain_bytes;
    const double MiB = 1048576.0;
    std::printf("bench_zero3 memory on %s, %d ranks = dp %d\n", pmt::bench::cpu_name().c_str(), dp, dp);
    std::printf("GPT %zu layers, width %zu (%zu parameters, %.1f MiB); float; %zu sequence per rank\n", gpt.layers,
                gpt.width, P, double(P) * sizeof(T) / MiB, seqs);
    std::printf("%-8s %26s %15s %22s %22s\n", "rank 0", "weights+grads+Adam (MiB)", "planner (MiB)",
                "steps' peak (MiB)", "construction (MiB)");
    std::printf("%-8s %26.1f %15.1f %22.1f %22.1f\n", "plain", plain_bytes / MiB, predicted_bytes(dp, 0, seqs) / MiB,
                plain_peak / MiB, plain_built / MiB);
    std::printf("%-8s %26.1f %15.1f %22.1f %22.1f\n", "ZeRO-3", zero3_bytes / MiB, predicted / MiB, zero3_peak / MiB,
                zero3_built / MiB);
    std::printf(
        "ZeRO-3: the shard %.1f MiB + at most %.1f MiB gathered (values of the block in use and the next, "
        "gradients written and reduce-scattered); the steps' peak adds the activations\n",
        (zero3_bytes - gathered) / MiB, gathered / MiB);
    pmt::bench::target_line("zero3_memory_ratio", ratio, 0.35, /*higher_is_better=*/false);
    pmt::bench::target_line("zero3_planner_error", std::abs(predicted - zero3_bytes) / zero3_bytes, 0.1,
                            /*higher_is_better=*/false);
  }
  return 0;
}

int time(const pmt::comm::Communicator<Backend>& world, int steps) {
  const int dp               = world.size();
  constexpr std::size_t seqs = 2;
  pmt::Mesh<Backend> mesh(world, pmt::MeshShape{dp, 1, 1});
  struct Row {
    const char* name;
    int stage;
    std::size_t prefetch;
    std::vector<double> times, losses;
    double waited = 0;  // ZeRO-3: seconds per step a use waited for its gather
  };
  std::vector<Row> rows{
      {"ZeRO-1", 1, 0, {}, {}, 0}, {"ZeRO-3, prefetch 1", 3, 1, {}, {}, 0}, {"ZeRO-3, no prefetch", 3, 0, {}, {}, 0}};
  for (int round = 0; round < 2; ++round)  // alternated: drift hits all three
    for (auto& row : rows) {
      Model model(mesh, gpt);
      std::vector<double> losses, t;
      if (row.stage == 1) {
        Zero1 opt(model.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp));
        t = train(mesh, model, opt, steps, seqs, &losses);
      } else {
        Zero3 opt(model.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp), std::nullopt, {},
                  pmt::optim::Zero3Options{row.prefetch, 0});
        t = train(mesh, model, opt, steps, seqs, &losses);
        row.waited += opt.gather_wait_seconds() / (2.0 * steps);
      }
      row.times.insert(row.times.end(), t.begin() + 1, t.end());  // the first step plans the workspace
      row.losses = losses;
    }
  double worst = 0;
  for (const auto& row : rows)
    for (std::size_t i = 0; i < row.losses.size(); ++i)
      worst = std::max(worst, std::abs(row.losses[i] - rows[0].losses[i]) / rows[0].losses[i]);
  if (world.rank() == 0) {
    std::printf("bench_zero3 time on %s, %d ranks = dp %d; GPT %zu layers, width %zu; %zu sequences per rank\n",
                pmt::bench::cpu_name().c_str(), dp, dp, gpt.layers, gpt.width, seqs);
    std::printf("%-22s %14s %30s\n", "", "step (ms)", "waiting for gathers (ms/step)");
    for (const auto& row : rows)
      std::printf("%-22s %14.1f %30s\n", row.name, 1e3 * pmt::bench::median(row.times),
                  row.stage == 3 ? pmt::detail::str(1e3 * row.waited).c_str() : "");
    std::printf("largest relative loss difference to ZeRO-1: %.2e\n", worst);
    const double base = pmt::bench::median(rows[0].times);
    pmt::bench::target_line("zero3_step_ratio", pmt::bench::median(rows[1].times) / base, 1.15,
                            /*higher_is_better=*/false);
    pmt::bench::target_line("zero3_no_prefetch_step_ratio", pmt::bench::median(rows[2].times) / base, 1.15,
                            /*higher_is_better=*/false);
    pmt::bench::target_line("zero3_loss_difference", worst, 1e-5, /*higher_is_better=*/false);
  }
  return 0;
}

}  // namespace

int main(int argc, char* argv[]) {
  pmt::ScopeGuard guard(argc, argv);
  pmt::comm::Communicator<Backend> world(MPI_COMM_WORLD);
  const std::string what = argc > 1 ? argv[1] : "time";
  if (world.size() < 2 || (what != "memory" && what != "time")) {
    std::fprintf(stderr, "bench_zero3: mpiexec -n 4 bench_zero3 memory, or mpiexec -n 2 bench_zero3 time [steps]\n");
    return 1;
  }
  pmt::ops::set_matmul_path(pmt::ops::MatmulPath::Vendor);  // no first-use measurement in the timings
  if (what == "memory") return memory(world);
  return time(world, argc > 2 ? std::max(3, std::atoi(argv[2])) : 4);
}
