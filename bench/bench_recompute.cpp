// SPDX-License-Identifier: Apache-2.0
// Activation recomputation on a pipeline stage: the peak of the Kokkos allocations a training
// step adds above the model, and the step time, with and without recomputation, on pp 2 (GPipe,
// 8 microbatches, so stage 0 holds all 8 microbatches' activations without recomputation), and
// whether the trained parameters are equal bit for bit. Two models, float:
//   MLP  a Chain of 4 blocks Linear<Col> -> Gelu -> Linear<Row> -> Gelu (width 256, hidden 1024)
//        and a head, 8 x 256 rows per step (nn::StagedOptions::recompute: per chunk)
//   GPT  nn::Gpt of 4 layers, width 256, 4 heads, context 128, 8 x 2 sequences per step
//        (nn::GptOptions::recompute: per block)
// Run on 2 ranks:
//   mpiexec -n 2 ./bench_recompute [steps]
// Targets: recompute_peak_ratio and gpt_recompute_peak_ratio (stage 0's peak with / without,
// goal <= 0.5), recompute_same_parameters and gpt_recompute_same_parameters (1 when every
// parameter is equal bit for bit, goal 1).
#include "bench_common.hpp"

#include <pmt/obs/memory.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using T       = float;
using Exec    = Kokkos::DefaultHostExecutionSpace;
using Backend = pmt::comm::default_backend_t<Exec>;
template <class P>
using Linear = pmt::nn::Linear<T, P, Exec, Backend>;
using Col    = Linear<pmt::TensorSplit<pmt::Col>>;
using Row    = Linear<pmt::TensorSplit<pmt::Row>>;
using Gelu   = pmt::nn::Gelu<T, Exec>;
using Net    = pmt::nn::Chain<Col, Gelu, Row, Gelu, Col, Gelu, Row, Gelu, Col, Gelu, Row, Gelu, Col, Gelu, Row, Gelu,
                           Linear<pmt::Replicate>>;
using Model  = pmt::nn::StagedModel<Net, pmt::nn::MseLoss<T, Exec>>;
using Opt    = pmt::optim::AdamW<T, Exec>;
using Policy = pmt::Hybrid<pmt::DataParallel<>, pmt::TensorSplit<>, pmt::Pipeline<>>;
constexpr std::size_t d = 256, hidden = 1024, rows = 256, microbatches = 8;

Net make_net(const pmt::Mesh<Backend>& mesh) {
  const auto k = [](std::uint32_t s) { return pmt::RngKey{11, s}; };
  return Net(Col(mesh, d, hidden, k(1)), Gelu(), Row(mesh, hidden, d, k(2)), Gelu(), Col(mesh, d, hidden, k(3)), Gelu(),
             Row(mesh, hidden, d, k(4)), Gelu(), Col(mesh, d, hidden, k(5)), Gelu(), Row(mesh, hidden, d, k(6)), Gelu(),
             Col(mesh, d, hidden, k(7)), Gelu(), Row(mesh, hidden, d, k(8)), Gelu(),
             Linear<pmt::Replicate>(mesh, d, 1, k(9)));
}

Model::Batch batch(int step, std::size_t i) {
  Model::Batch b{pmt::Tensor<T, 2, Exec>("x", rows, d), pmt::Tensor<T, 2, Exec>("t", rows, 1), rows};
  pmt::GlobalSlice s;
  s.extent[0] = rows * microbatches, s.extent[1] = d, s.offset[0] = i * rows;
  pmt::fill_normal(Exec(), b.input, pmt::RngKey{12, static_cast<std::uint32_t>(step)}, 0.0, 1.0, s);
  Kokkos::deep_copy(b.target, T(0.5));
  return b;
}

struct Result {
  double peak_mib = 0, seconds = 0;
  std::vector<T> values;
};

/// `steps` steps of the trainer over the microbatches batch(step, i), i < microbatches: the peak of
/// each step's Kokkos allocations above what is held before it (each step's memory allocated
/// afresh), the median step time and the trained parameters.
template <class Model, class Trainer, class MakeBatch>
Result measure(Model& model, Trainer& trainer, int steps, double normaliser, const MakeBatch& batch) {
  Result r;
  std::vector<double> times;
  for (int step = 0; step < steps; ++step) {
    std::vector<typename Model::Batch> mbs;
    for (std::size_t i = 0; i < microbatches; ++i) mbs.push_back(batch(step, i));
    const auto [peak, seconds] = pmt::bench::measured_step([&] { trainer.step(mbs, {normaliser, 1e-3, 1.0}); });
    times.push_back(seconds);
    r.peak_mib = std::max(r.peak_mib, peak);
  }
  r.seconds = pmt::bench::median(times);
  for (auto* p : model.parameters()) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), p->value);
    r.values.insert(r.values.end(), h.data(), h.data() + h.size());
  }
  return r;
}

Result run(const pmt::comm::Communicator<Backend>& world, bool recompute, int steps) {
  pmt::Mesh<Backend> mesh(world, pmt::MeshShape{1, world.size() / 2, 2});
  Model model(mesh, make_net(mesh), {}, pmt::nn::StagedOptions{{}, 1, "mlp", recompute});
  Opt opt(model.parameters(), {0.9, 0.95, 1e-8, 0.0});
  pmt::train::Trainer<Model, Opt, Exec, Backend, Policy> trainer(mesh, model, opt);
  trainer.set_schedule(pmt::parallel::ScheduleKind::GPipe);
  return measure(model, trainer, steps, double(rows * microbatches), batch);
}

// --- the GPT: recomputation per block -------------------------------------------------------
using GptModel = pmt::nn::Gpt<T, Exec, Backend>;
const pmt::nn::GptConfig gpt{/*vocab=*/256, /*context=*/128, /*layers=*/4,
                             /*width=*/256, /*heads=*/4,     /*seed=*/5};
constexpr std::size_t sequences = 2;

GptModel::Batch gpt_batch(int step, std::size_t i) {
  return pmt::bench::synthetic_token_batch<GptModel::Batch>(step, i, sequences, gpt.context, gpt.vocab);
}

Result run_gpt(const pmt::comm::Communicator<Backend>& world, bool recompute, int steps) {
  pmt::Mesh<Backend> mesh(world, pmt::MeshShape{1, world.size() / 2, 2});
  GptModel model(mesh, gpt, pmt::nn::GptOptions{{}, 1, recompute});
  Opt opt(model.parameters(), {0.9, 0.95, 1e-8, 0.0});
  pmt::train::Trainer<GptModel, Opt, Exec, Backend, Policy> trainer(mesh, model, opt);
  trainer.set_schedule(pmt::parallel::ScheduleKind::GPipe);
  return measure(model, trainer, steps, double(microbatches * sequences * gpt.context), gpt_batch);
}

/// 1 on every rank when a and b hold the same values on every rank, else 0.
double same_everywhere(const pmt::comm::Communicator<Backend>& world, const Result& a, const Result& b) {
  Kokkos::View<double*, Kokkos::HostSpace> same("same", 1);
  same(0) = a.values == b.values ? 1 : 0;
  pmt::comm::all_reduce(world, Exec(), same, pmt::comm::ReduceOp::Min);
  return same(0);
}

}  // namespace

int main(int argc, char* argv[]) {
  pmt::ScopeGuard guard(argc, argv);
  pmt::comm::Communicator<Backend> world(MPI_COMM_WORLD);
  const int steps = argc > 1 ? std::max(2, std::atoi(argv[1])) : 5;
  if (world.size() % 2 != 0) {
    if (world.rank() == 0) std::fprintf(stderr, "bench_recompute: run on an even number of ranks (pp 2)\n");
    return 1;
  }
  run(world, false, 1);  // the first products measure their matmul paths; both runs use the decided ones
  const Result plain = run(world, false, steps), again = run(world, true, steps);
  run_gpt(world, false, 1);
  const Result gpt_plain = run_gpt(world, false, steps), gpt_again = run_gpt(world, true, steps);
  // stage 0 (world rank 0) holds the most; the parameters compare on every rank
  const double same = same_everywhere(world, plain, again), gpt_same = same_everywhere(world, gpt_plain, gpt_again);
  if (world.rank() == 0) {
    std::printf("bench_recompute on %s, %d ranks\n", pmt::bench::cpu_name().c_str(), world.size());
    std::printf("pp 2 (stage 0 shown), GPipe, %zu microbatches, float, %d steps\n", microbatches, steps);
    std::printf(
        "MLP: %zu rows per microbatch, width %zu, hidden %zu; GPT: %zu sequences per microbatch, %zu layers, "
        "width %zu, context %zu\n",
        rows, d, hidden, sequences, gpt.layers, gpt.width, gpt.context);
    std::printf("%-22s %16s %14s\n", "", "step peak (MiB)", "step (ms)");
    std::printf("%-22s %16.2f %14.2f\n", "MLP keep activations", plain.peak_mib, 1e3 * plain.seconds);
    std::printf("%-22s %16.2f %14.2f\n", "MLP recompute", again.peak_mib, 1e3 * again.seconds);
    std::printf("%-22s %16.2f %14.2f\n", "GPT keep activations", gpt_plain.peak_mib, 1e3 * gpt_plain.seconds);
    std::printf("%-22s %16.2f %14.2f\n", "GPT recompute", gpt_again.peak_mib, 1e3 * gpt_again.seconds);
    pmt::bench::target_line("recompute_peak_ratio", again.peak_mib / plain.peak_mib, 0.5, /*higher_is_better=*/false);
    pmt::bench::target_line("recompute_same_parameters", same, 1.0);
    pmt::bench::target_line("gpt_recompute_peak_ratio", gpt_again.peak_mib / gpt_plain.peak_mib, 0.5,
                            /*higher_is_better=*/false);
    pmt::bench::target_line("gpt_recompute_same_parameters", gpt_same, 1.0);
  }
  return 0;
}
