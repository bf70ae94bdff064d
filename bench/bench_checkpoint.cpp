// SPDX-License-Identifier: Apache-2.0
// Asynchronous checkpoints against blocking ones, in one run: the training step's time while a
// checkpoint of about 150 MB (nn::Gpt, float, 4 layers, width 512: parameters and AdamW's two
// moments) is written in the background, against the step alone; the part of an asynchronous
// save that holds the step (the snapshot to host memory) against copying the same state in
// memory with Kokkos::deep_copy into buffers already allocated; and the blocking save's time.
// dp = every rank (each rank writes its share):
//   ./bench_checkpoint [DIR]          (default DIR: a fresh directory under the temporary one)
//   mpiexec -n 2 ./bench_checkpoint [DIR]
// Targets: async_save_step_ratio (the mean step time while a save is written / the median step
// time without one, goal <= 1.10), async_save_blocking_vs_copy (the snapshot's median seconds,
// second save on, / the in-memory copy's median, goal <= 1.0).
#include "bench_common.hpp"

#include <pmt/io/checkpoint_async.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

using T       = float;
using Exec    = Kokkos::DefaultHostExecutionSpace;
using Backend = pmt::comm::default_backend_t<Exec>;
using Model   = pmt::nn::Gpt<T, Exec, Backend>;
using Policy  = pmt::Hybrid<pmt::DataParallel<>, pmt::TensorSplit<>, pmt::Pipeline<>>;
using Opt     = pmt::optim::AdamW<T, Exec>;
const pmt::nn::GptConfig gpt{/*vocab=*/256, /*context=*/64, /*layers=*/4,
                             /*width=*/512, /*heads=*/8,    /*seed=*/5};
constexpr std::size_t sequences = 4;  // per rank and step

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char* argv[]) {
  pmt::ScopeGuard guard(argc, argv);
  pmt::comm::Communicator<Backend> world(MPI_COMM_WORLD);
  const bool root = world.rank() == 0;
  Kokkos::View<long long*, Kokkos::HostSpace> id("pid", 1);
  id(0) = static_cast<long long>(::getpid());
  pmt::comm::broadcast(world, Exec(), id, 0);
  const std::string dir =
      argc > 1 ? argv[1]
               : (std::filesystem::temp_directory_path() / ("pmt-bench-checkpoint-" + std::to_string(id(0)))).string();
  pmt::Mesh<Backend> mesh(world, pmt::MeshShape{world.size(), 1, 1});
  Model model(mesh, gpt);
  Opt opt(model.parameters(), {0.9, 0.95, 1e-8, 0.0});
  pmt::train::Trainer<Model, Opt, Exec, Backend, Policy> trainer(mesh, model, opt);
  std::size_t P = 0;
  for (auto* p : model.parameters()) P += p->size();
  int step        = 0;
  const auto once = [&] {  // one training step, its seconds
    const std::vector<Model::Batch> mbs{pmt::bench::synthetic_token_batch<Model::Batch>(
        step++, sequences * std::size_t(world.rank()), sequences, gpt.context, gpt.vocab)};
    const auto t0 = std::chrono::steady_clock::now();
    trainer.step(mbs, {double(sequences * std::size_t(world.size()) * gpt.context), 1e-4, 1.0});
    return seconds_since(t0);
  };
  for (int k = 0; k < 2; ++k) once();  // warm-up

  // the in-memory copy of the same state, into buffers allocated beforehand
  std::vector<Kokkos::View<T*, Kokkos::HostSpace>> copies;
  std::vector<Kokkos::View<T*, Exec::memory_space>> sources;
  for (std::size_t i = 0; i < model.parameters().size(); ++i)
    for (auto v : {model.parameters()[i]->value, opt.exp_avg(i), opt.exp_avg_sq(i)}) {
      sources.push_back(v);
      copies.emplace_back("copy", v.size());
    }
  std::vector<double> copy_s;
  const auto copy_state = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t j = 0; j < sources.size(); ++j) Kokkos::deep_copy(copies[j], sources[j]);
    copy_s.push_back(seconds_since(t0));
  };
  copy_state();

  pmt::io::CheckpointInfo info;
  info.model = "bench_checkpoint gpt 4x512";
  std::vector<double> normal, during, blocking_save, snapshot, writer;
  int during_steps = 0;
  pmt::io::AsyncCheckpointer<Backend> saver(mesh);
  for (int round = 0; round < 4; ++round) {
    for (int k = 0; k < 3; ++k) normal.push_back(once());
    // blocking: the whole save holds the step
    info.step = step;
    auto t0   = std::chrono::steady_clock::now();
    pmt::io::save_checkpoint(dir + "/blocking", mesh, opt, info, trainer.state());
    blocking_save.push_back(seconds_since(t0));
    // asynchronous: the snapshot holds it, then steps go on while the shard is written; the
    // in-memory copy just before it, in the same state of the caches
    (void)once();
    copy_state();
    info.step = step;
    saver.save(dir + "/async", opt, info, trainer.state());
    snapshot.push_back(saver.blocking_seconds());
    for (std::string done; done.empty();) {
      t0 = std::chrono::steady_clock::now();
      (void)once();
      done = saver.poll();
      during.push_back(seconds_since(t0));
      ++during_steps;
    }
    writer.push_back(saver.writing_seconds());
  }
  const double normal_s = pmt::bench::median(normal);
  const double during_s = std::accumulate(during.begin(), during.end(), 0.0) / double(during.size());
  const double copy     = pmt::bench::median(copy_s);
  const double snap     = pmt::bench::median(std::vector<double>(snapshot.begin() + 1, snapshot.end()));
  if (root) {
    const double mb = double(P) * 3 * sizeof(T) / 1e6;
    std::printf("bench_checkpoint on %s, %d rank(s) = dp %d, checkpoint directory %s\n", pmt::bench::cpu_name().c_str(),
                world.size(), world.size(), dir.c_str());
    std::printf("GPT %zu layers, width %zu (%zu parameters): %.0f MB of parameters and AdamW moments (float)\n",
                gpt.layers, gpt.width, P, mb);
    std::printf("%-52s %10s\n", "rank 0", "seconds");
    std::printf("%-52s %10.4f\n", "training step, no save (median)", normal_s);
    std::printf("%-52s %10.4f\n", "training step while a save is written (mean)", during_s);
    std::printf("%-52s %10d\n", "  steps that overlapped a save (4 saves)", during_steps);
    std::printf("%-52s %10.4f\n", "blocking save (median)", pmt::bench::median(blocking_save));
    std::printf("%-52s %10.4f\n", "async save: snapshot, first save", snapshot[0]);
    std::printf("%-52s %10.4f\n", "async save: snapshot, later saves (median)", snap);
    std::printf("%-52s %10.4f\n", "async save: background writer (median)", pmt::bench::median(writer));
    std::printf("%-52s %10.4f\n", "deep_copy of the same state (median)", copy);
    pmt::bench::target_line("async_save_step_ratio", during_s / normal_s, 1.10, /*higher_is_better=*/false);
    pmt::bench::target_line("async_save_blocking_vs_copy", snap / copy, 1.0, /*higher_is_better=*/false);
  }
  pmt::comm::barrier(world);
  if (root && argc <= 1) std::filesystem::remove_all(dir);
  return 0;
}
