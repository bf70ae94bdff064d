// SPDX-License-Identifier: Apache-2.0
// Pipeline bubble and activation memory: pmt's PipelineRunner on pp = world size stages, GPipe,
// 1F1B and interleaved 1F1B with 2 model chunks per stage ("1f1b-v2"), m = 1 ... 16 microbatches,
// against the theoretical bubble (p - 1) / (m + p - 1), for 1f1b-v2 (p - 1) / (2 m + p - 1)
// (m >= p only: interleaving needs m a multiple of p).
//   bench_pipeline model [reps]  a real Gpt (16 blocks of width 256, context 64, vocabulary 256,
//                                one sequence per microbatch) balanced over the stages; needs one
//                                core per rank to mean anything
//   bench_pipeline sleep [reps]  stages that sleep 10 ms per forward and 20 ms per backward and
//                                send real (64, 256) activations: the schedule and the runtime
//                                without CPU contention (for pp beyond the cores of a machine)
// Per run (after a barrier) each stage reports its wall time and compute time (forward +
// backward, fenced); bubble = 1 - sum(compute) / (p * max wall), the median over `reps` rounds
// that run every configuration once each, interleaved (a slow phase of the machine hits several
// configurations once, not one configuration in every run).
// theory = (p - 1) / (m + p - 1) assumes equal stages; `expected` is the checker's simulation of
// the same table with each stage's measured mean forward and backward times, which separates
// unequal or noisy stages (the hardware) from the runtime's own overhead (waiting for messages).
// Memory: per stage, the peak of live microbatches (1f1b-v2: of live (chunk, microbatch) pairs,
// each half a stage's activations) the runner counted and, in model mode, the
// peak of heap bytes in use (glibc mallinfo2, sampled after every forward) above the level before
// the run. Targets (per schedule and m >= 4p): the measured bubble within 10% of
// theory, and within 10% of `expected`.
#include "bench_common.hpp"

#include "pmt/nn/gpt.hpp"
#include "pmt/parallel/pipeline.hpp"

#include <malloc.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using Exec    = Kokkos::DefaultHostExecutionSpace;
using Backend = pmt::comm::Mpi;
using Gpt     = pmt::nn::Gpt<float, Exec, Backend>;
using Ids     = Gpt::Ids;
using pmt::parallel::ScheduleKind;

namespace {

std::size_t heap_in_use() {
  const auto mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

/// CPU time the hypervisor gave to other guests ("steal" in /proc/stat, all CPUs), in ms; 0 where
/// unknown. Read around each run: under load this VM loses 5-12 % of its vCPU time, in bursts.
double steal_ms() {
  std::FILE* f = std::fopen("/proc/stat", "r");
  if (!f) return 0;
  unsigned long long v[8] = {};
  const int got = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4],
                              &v[5], &v[6], &v[7]);
  std::fclose(f);
  return got == 8 ? 1000.0 * double(v[7]) / double(sysconf(_SC_CLK_TCK)) : 0.0;
}

/// A stage that sleeps instead of computing (the Model interface of PipelineRunner).
struct SleepStage {
  using value_type = float;
  using Ids        = ::Ids;
  using Batch      = pmt::parallel::Microbatch<Ids>;
  using Activation = pmt::Tensor<float, 2, Exec>;
  int s, p;
  std::size_t C;
  double t_forward, t_backward;  // of the whole stage: each of `v` chunks takes 1/v of it
  int v            = 1;
  std::size_t base = 0, peak = 0;
  int stage() const { return s; }
  int stages() const { return p; }
  int chunks() const { return v; }
  std::vector<pmt::Parameter<float, Exec>*> parameters() { return {}; }
  std::array<std::size_t, 2> input_extent(int, const Batch& mb) const { return {mb.B * mb.T, C}; }
  std::array<std::size_t, 2> output_extent(int, const Batch& mb) const { return {mb.B * mb.T, C}; }
  /// Takes exactly `seconds`: sleeps in 0.25 ms pieces, letting pending messages progress in
  /// between (as the Gpt does between its attention and MLP halves), and spins, still polling,
  /// through the last 0.4 ms. Sleeping to the end instead overshot each action by a random
  /// 0-0.35 ms (the last piece plus the kernel's timer slack); in a tight schedule the slower of
  /// two such stages sets every step, which is noise of the stand-in, not the runtime's cost.
  static void work(double seconds) {
    using clock    = std::chrono::steady_clock;
    const auto end = clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(seconds));
    for (auto now = clock::now(); now < end; now = clock::now()) {
      if (end - now > std::chrono::microseconds(400)) std::this_thread::sleep_for(std::chrono::microseconds(250));
      pmt::comm::progress();
    }
  }
  Activation forward_chunk(const Exec&, int k, const Batch& mb, const Activation&, double, double* loss) {
    work(t_forward / v);
    if (s + 1 == p && k + 1 == v) {
      *loss += 1.0;
      return Activation();
    }
    return Activation("act", mb.B * mb.T, C);
  }
  Activation backward_chunk(const Exec&, int k, const Activation&) {
    work(t_backward / v);
    return s == 0 && k == 0 ? Activation() : Activation("grad", std::size_t(64), C);
  }
};

/// The Gpt with the heap sampled after every stage forward.
struct MeteredGpt {
  using value_type = float;
  using Ids        = ::Ids;
  using Batch      = Gpt::Batch;
  using Activation = Gpt::Activation;
  Gpt& g;
  std::size_t peak = 0;  // heap in use, sampled after each forward; `base` before the run
  int stage() const { return g.stage(); }
  int stages() const { return g.stages(); }
  int chunks() const { return g.chunks(); }
  std::vector<pmt::Parameter<float, Exec>*> parameters() { return g.parameters(); }
  std::array<std::size_t, 2> input_extent(int k, const Batch& mb) const { return g.input_extent(k, mb); }
  std::array<std::size_t, 2> output_extent(int k, const Batch& mb) const { return g.output_extent(k, mb); }
  Activation forward_chunk(const Exec& e, int k, const Batch& mb, const Activation& x, double n, double* loss) {
    auto y = g.forward_chunk(e, k, mb, x, n, loss);
    peak   = std::max(peak, heap_in_use());
    return y;
  }
  std::size_t base = 0;
  Activation backward_chunk(const Exec& e, int k, const Activation& dy) { return g.backward_chunk(e, k, dy); }
};

struct Row {
  double bubble   = 0;
  double expected = 0;  // the checker's bubble for this run's measured per-stage forward and backward times
  double steal    = 0;  // ms of vCPU time stolen by the hypervisor during a run (median)
  std::vector<double> busy, idle, peak_mib;  // per stage (medians; peak: the largest)
  std::vector<int> peak_live;                // per stage, as the runner counted
};

std::vector<double> gather(double x, int p) {
  std::vector<double> all(static_cast<std::size_t>(p));
  MPI_Allgather(&x, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
  return all;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// What to run: a schedule, m microbatches, model chunks per stage.
struct Setup {
  ScheduleKind kind;
  int m, chunks;
  std::string name() const {
    return std::string(pmt::parallel::schedule_name(kind)) + (chunks > 1 ? "-v" + std::to_string(chunks) : "");
  }
};

/// One configuration with its model, runner, microbatches and per-run samples.
template <class Model>
struct Config {
  ScheduleKind kind;
  int m, chunks;
  Model* model;
  std::unique_ptr<pmt::parallel::PipelineRunner<Model, Exec, Backend>> runner;
  std::vector<pmt::parallel::Microbatch<Ids>> mbs;
  std::vector<double> bubbles, expected, peak_mib, steal;
  std::vector<std::vector<double>> busy, idle;  // [stage][run]
};

/// One run of `c` (after a barrier); recorded unless it is a warm-up.
template <class Model>
void run_once(Config<Model>& c, int p, bool record) {
  Model& model = *c.model;
  const auto P = static_cast<std::size_t>(p);
  MPI_Barrier(MPI_COMM_WORLD);
  model.base = model.peak = heap_in_use();
  const double steal0     = steal_ms();
  c.runner->run(Exec(), c.kind, c.mbs, double(c.m) * double(c.mbs[0].T));
  const double stolen = steal_ms() - steal0;
  const auto& st      = c.runner->stats();
  const auto compute = gather(st.compute, p), wall = gather(st.wall, p);
  double tf = 0, tb = 0;  // this stage's mean forward and backward times
  for (const auto& e : st.events) {
    if (e.action.kind == pmt::parallel::Action::Forward) tf += (e.end - e.start) / c.m;
    if (e.action.kind == pmt::parallel::Action::Backward) tb += (e.end - e.start) / c.m;
  }
  const auto all_tf = gather(tf, p), all_tb = gather(tb, p);
  if (!record) return;
  const double max_wall = *std::max_element(wall.begin(), wall.end());
  double sum_busy       = 0;
  c.busy.resize(P);
  c.idle.resize(P);
  for (std::size_t s = 0; s < P; ++s) {
    sum_busy += compute[s];
    c.busy[s].push_back(compute[s]);
    c.idle[s].push_back(max_wall - compute[s]);
  }
  c.bubbles.push_back(1.0 - sum_busy / (p * max_wall));
  c.expected.push_back(
      pmt::parallel::check(pmt::parallel::make_schedule(c.kind, p, c.m, c.chunks), all_tf, all_tb).bubble);
  c.peak_mib.push_back(double(model.peak - model.base) / double(1 << 20));
  c.steal.push_back(stolen);
}

/// Every (schedule, m) measured in interleaved rounds: one warm-up round, then `reps` rounds that
/// run each configuration once, in an order rotated per round, so that a slow phase of the
/// machine (seconds long on this VM) falls on several configurations once rather than on every
/// run of one. Each row holds the medians over the rounds. models[v - 1] holds v chunks per stage.
template <class Model>
std::vector<Row> measure(const pmt::Mesh<Backend>& mesh, const std::vector<Model*>& models,
                         const std::vector<Setup>& configs, int reps, std::size_t T) {
  const int p = mesh.degree(pmt::Axis::pp);
  std::vector<Config<Model>> cs;
  for (const auto& setup : configs) {
    Model& model = *models.at(static_cast<std::size_t>(setup.chunks - 1));
    Config<Model> c{setup.kind,
                    setup.m,
                    setup.chunks,
                    &model,
                    std::make_unique<pmt::parallel::PipelineRunner<Model, Exec, Backend>>(mesh, model),
                    {},
                    {},
                    {},
                    {},
                    {},
                    {},
                    {}};
    for (int i = 0; i < setup.m; ++i) {
      pmt::parallel::Microbatch<Ids> mb{Ids("ids", T), Ids("targets", T), 1, T};
      for (std::size_t t = 0; t < T; ++t)
        mb.ids(t) = int((t * 7 + i) % 256), mb.targets(t) = int((t * 7 + i + 1) % 256);
      c.mbs.push_back(mb);
    }
    cs.push_back(std::move(c));
  }
  const std::size_t n = cs.size();
  for (int rep = -1; rep < reps; ++rep)
    for (std::size_t k = 0; k < n; ++k) run_once(cs[(k + static_cast<std::size_t>(rep + 1)) % n], p, rep >= 0);
  std::vector<Row> rows;
  for (auto& c : cs) {
    Row row;
    row.bubble   = median(c.bubbles);
    row.expected = median(c.expected);
    row.steal    = median(c.steal);
    for (std::size_t s = 0; s < static_cast<std::size_t>(p); ++s)
      row.busy.push_back(median(c.busy[s])), row.idle.push_back(median(c.idle[s]));
    row.peak_mib = gather(*std::max_element(c.peak_mib.begin(), c.peak_mib.end()), p);
    for (double x : gather(c.runner->stats().peak_live, p)) row.peak_live.push_back(int(x));
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace

int main(int argc, char* argv[]) {
  pmt::ScopeGuard guard(argc, argv);
  pmt::comm::Communicator<Backend> world(MPI_COMM_WORLD);
  const std::string mode = argc > 1 ? argv[1] : "model";
  const int reps         = argc > 2 ? std::atoi(argv[2]) : 5;
  const int p = world.size(), r = world.rank();
  if (p > 32 || (mode != "model" && mode != "sleep")) {
    if (r == 0) std::fprintf(stderr, "usage: mpiexec -n P bench_pipeline model|sleep [reps]  (P <= 32)\n");
    return 2;
  }
  pmt::Mesh<Backend> mesh(world, pmt::MeshShape{1, 1, p});
  const pmt::nn::GptConfig cfg{256, 64, 16, 256, 4, 1};
  const std::size_t T  = cfg.context;
  const unsigned cores = std::thread::hardware_concurrency();
  if (r == 0) {
    std::printf("pmt bench_pipeline: %s mode, pp = %d stages, %d thread(s) per rank, %u cores%s\n", mode.c_str(), p,
                Exec().concurrency(), cores,
                mode == "model" && unsigned(p) * unsigned(Exec().concurrency()) > cores
                    ? " (OVERSUBSCRIBED: stages share cores, the bubble is not the schedule's)"
                    : "");
    if (mode == "model")
      std::printf("model: %zu blocks of width %zu, context %zu, vocabulary %zu, one sequence per microbatch\n",
                  cfg.layers, cfg.width, cfg.context, cfg.vocab);
    else
      std::printf("sleep stages: forward 10 ms, backward 20 ms, activations (64, 256) floats\n");
    std::printf("%-7s %3s %8s %8s %6s %9s %6s %6s | %s\n", "sched", "m", "bubble", "theory", "ratio", "expected",
                "ratio", "steal",
                (std::string("per stage: busy/idle ms, peak live microbatches") +
                 (mode == "model" ? ", peak activation MiB" : ""))
                    .c_str());
  }
  std::unique_ptr<Gpt> gpt, gpt2;  // one and two chunks per stage
  if (mode == "model")
    gpt = std::make_unique<Gpt>(mesh, cfg), gpt2 = std::make_unique<Gpt>(mesh, cfg, pmt::parallel::StagePlan{}, 2);
  if (r == 0 && gpt)
    std::printf("stages: %s; with 2 chunks per stage: %s\n", gpt->plan().describe().c_str(),
                gpt2->plan().describe().c_str());
  std::vector<int> ms;
  for (int m = 1; m <= 16; m *= 2) ms.push_back(m);
  struct Target {
    std::string name;
    double measured, theory, expected;
  };
  std::vector<Target> targets;
  std::vector<Setup> configs;
  for (auto kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB})
    for (int m : ms) configs.push_back({kind, m, 1});
  if (p > 1)
    for (int m : ms)
      if (m % p == 0) configs.push_back({ScheduleKind::OneFOneB, m, 2});
  std::vector<Row> rows;
  if (mode == "model") {
    MeteredGpt metered{*gpt}, metered2{*gpt2};
    rows = measure(mesh, std::vector<MeteredGpt*>{&metered, &metered2}, configs, reps, T);
  } else {
    SleepStage stage{mesh.coord(pmt::Axis::pp), p, 256, 0.010, 0.020}, stage2 = stage;
    stage2.v = 2;
    rows     = measure(mesh, std::vector<SleepStage*>{&stage, &stage2}, configs, reps, T);
  }
  for (std::size_t c = 0; c < configs.size(); ++c) {
    const int m         = configs[c].m;
    const Row& row      = rows[c];
    const double theory = pmt::parallel::ScheduleReport::theory(p, m, configs[c].chunks);
    if (r == 0) {
      std::printf("%-7s %3d %7.1f%% %7.1f%% %6.3f %8.1f%% %6.3f %4.0fms |", configs[c].name().c_str(), m,
                  100 * row.bubble, 100 * theory, row.bubble / theory, 100 * row.expected, row.bubble / row.expected,
                  row.steal);
      for (std::size_t s = 0; s < static_cast<std::size_t>(p); ++s) {
        std::printf(" s%zu %.0f/%.0f live %d", s, 1e3 * row.busy[s], 1e3 * row.idle[s], row.peak_live[s]);
        if (mode == "model") std::printf(" %.1fMiB", row.peak_mib[s]);
        std::printf(s + 1 < static_cast<std::size_t>(p) ? ";" : "\n");
      }
      std::fflush(stdout);
    }
    if (m >= 4 * p)
      targets.push_back({std::string("pipeline_bubble_") + mode + "_pp" + std::to_string(p) + "_" + configs[c].name() +
                             "_m" + std::to_string(m),
                         row.bubble, theory, row.expected});
  }
  if (r == 0) {
    for (const auto& t : targets) {
      const double dev   = std::abs(t.measured - t.theory) / t.theory,
                   dev_e = std::abs(t.measured - t.expected) / t.expected;
      std::printf("target %s measured=%.4f goal=%.4f+-10%% (deviation %.1f%%) %s\n", t.name.c_str(), t.measured,
                  t.theory, 100 * dev, dev <= 0.10 ? "met" : "missed");
      std::printf("target %s_vs_measured_stage_times measured=%.4f goal=%.4f+-10%% (deviation %.1f%%) %s\n",
                  t.name.c_str(), t.measured, t.expected, 100 * dev_e, dev_e <= 0.10 ? "met" : "missed");
    }
  }
  return 0;
}
