// SPDX-License-Identifier: Apache-2.0
// pmt-plan: how should this GPT run on these ranks? Predicts the step time and the peak memory per
// rank of every dp x tp x pp layout, microbatch count, schedule and ZeRO-1 setting
// (plan/model.hpp), ranks them, and says why the rest were rejected.
//   mpiexec -n 4 pmt-plan --layers 4 --width 128           # calibrates on the 4 ranks, then plans
//   pmt-plan --ranks 64 --gemm-gflops 400 --link-gbps 25 --memory-mib 16384 --layers 48 --width
//   1600
//                                                           # plans for a machine described by hand
// `--measure K` then trains pmt's Gpt with each of the K best predicted candidates (`all`: every
// one), interleaved in rounds (plan/measure.hpp), and prints measured against predicted: the
// prediction as a shortlist, the measurement as the judge.
// `--csv FILE` writes every ranked candidate, with its measured step when measured
// (bench/plan_check.py compares them with train_gpt runs).
#include <pmt/plan/calibrate.hpp>
#include <pmt/plan/measure.hpp>
#include <pmt/run/cli.hpp>
#include <pmt/run/command_line.hpp>
#include <pmt/run/placement.hpp>
#include <pmt/tools.hpp>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr const char* prog = "pmt-plan";

struct Options {
  pmt::plan::Problem problem;
  int ranks = 0, top = 10, measure = 0, rounds = 10;  // measure: -1 all
  double gemm_gflops = 0, memory_gbps = 10, link_gbps = 5, latency_us = 5, memory_mib = 0, bf16_copy_bytes = 0;
  int ranks_per_node = 0;  // 0: one link model for every pair of ranks
  double intra_gbps = 0, intra_latency_us = 2, inter_gbps = 0, inter_latency_us = 5;
  bool no_zero = false, no_gpipe = false, no_recompute = false, no_sequence_parallel = false, verbose = false;
  std::string csv, rankfile, precision = "fp32", dp_modes_text = "sync", measure_text;
  std::string device = "default", comm = "auto";  // where the calibration computes (pmt/run/placement.hpp)
  std::vector<pmt::plan::DpChoice> dp_modes = {pmt::plan::DpChoice{}};
};

/// The data-parallel modes of a comma-separated list ("sync,bf16,local:4").
/// \throws pmt::ConfigError for a word that names none.
std::vector<pmt::plan::DpChoice> dp_modes_of(const std::string& list) {
  std::vector<pmt::plan::DpChoice> modes;
  std::size_t at = 0;
  while (at <= list.size()) {
    const auto comma = list.find(',', at);
    modes.push_back(
        pmt::plan::parse_dp_choice(list.substr(at, comma == std::string::npos ? std::string::npos : comma - at)));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return modes;
}

using pmt::run::integer;
using pmt::run::number;
using pmt::run::option;

const auto positive = [](double x) { return x > 0; };

/// The model and the machine, each flag declared once (CLI11: type, check, help).
void declare_problem(CLI::App& app, Options& o) {
  auto& m             = o.problem.model;
  const std::string g = "Model and batch (as train_gpt; vocabulary 256 bytes unless --vocab)";
  option(app, g, "--layers", m.layers, "transformer blocks", integer("--layers", 1))->capture_default_str();
  option(app, g, "--width", m.width, "model width", integer("--width", 1))->capture_default_str();
  option(app, g, "--heads", m.heads, "attention heads", integer("--heads", 1))->capture_default_str();
  option(app, g, "--context", m.context, "tokens per sequence", integer("--context", 1))->capture_default_str();
  option(app, g, "--vocab", m.vocab, "vocabulary", integer("--vocab", 1))->capture_default_str();
  option(app, g, "--batch", o.problem.batch, "sequences per step", integer("--batch", 1))->capture_default_str();
  const std::string h = "A machine given by hand instead of calibrating (per rank)";
  option(app, h, "--ranks", o.ranks, "ranks of the machine", integer("--ranks", 1));
  option(app, h, "--gemm-gflops", o.gemm_gflops, "matrix-product rate (in --precision)",
         number("--gemm-gflops", positive, "expected a positive number"));
  option(app, h, "--memory-gbps", o.memory_gbps, "memory bandwidth",
         number("--memory-gbps", positive, "expected a positive number"))
      ->capture_default_str();
  option(app, h, "--link-gbps", o.link_gbps, "link bandwidth",
         number("--link-gbps", positive, "expected a positive number"))
      ->capture_default_str();
  option(app, h, "--latency-us", o.latency_us, "link latency",
         number("--latency-us", positive, "expected a positive number"))
      ->capture_default_str();
  option(app, h, "--precision", o.precision,
         "the products' precision (train_gpt --precision): calibration and --measure run them in it; by hand, "
         "--gemm-gflops is the rate in it",
         pmt::run::parsed_by([](const std::string& v) { pmt::parse_precision(v, "--precision"); }))
      ->capture_default_str();
  option(app, h, "--bf16-copy-bytes", o.bf16_copy_bytes,
         "by hand: bytes per operand element bf16 products copy (0 in-register kernels, 2 cuBLAS's bf16 copies, 4 the "
         "rounded path; calibrating, measured)",
         pmt::run::one_of("--bf16-copy-bytes", {"0", "2", "4"}));
  option(app, h, "--memory-mib", o.memory_mib, "memory per rank (calibrated: MemAvailable / ranks on the node)",
         number("--memory-mib", positive, "expected a positive number"));
  option(app, h, "--activation-bytes", o.problem.activation_bytes,
         "bytes of an activation value (default 4, as pmt keeps them; 2 plans for a runtime keeping bf16 "
         "activations, as GPU frameworks do)",
         pmt::run::one_of("--activation-bytes", {"2", "4"}));
}

void declare_nodes(CLI::App& app, Options& o) {
  const std::string n = "Nodes";
  option(app, n, "--ranks-per-node", o.ranks_per_node,
         "ranks on a node: collectives and sends are costed on the links they cross (tp fastest in the rank order, "
         "then dp, then pp); calibrating, both links are measured (by default when the ranks span nodes)",
         integer("--ranks-per-node", 1));
  option(app, n, "--intra-gbps", o.intra_gbps, "the links inside a node (per rank)",
         number("--intra-gbps", positive, "expected a positive number"));
  option(app, n, "--intra-latency-us", o.intra_latency_us, "their latency",
         number("--intra-latency-us", positive, "expected a positive number"))
      ->capture_default_str();
  option(app, n, "--inter-gbps", o.inter_gbps, "the network between nodes (per rank)",
         number("--inter-gbps", positive, "expected a positive number"));
  option(app, n, "--inter-latency-us", o.inter_latency_us, "its latency",
         number("--inter-latency-us", positive, "expected a positive number"))
      ->capture_default_str();
  option(app, n, "--rankfile", o.rankfile,
         "with --ranks-per-node: write an Open MPI rankfile placing the best layout's tp groups inside nodes");
}

void declare_search(CLI::App& app, Options& o) {
  const std::string s = "Search and output";
  pmt::run::flag(app, s, "--no-zero", o.no_zero, "leave ZeRO (1 and 2) out");
  pmt::run::flag(app, s, "--no-gpipe", o.no_gpipe, "leave GPipe out");
  pmt::run::flag(app, s, "--no-recompute", o.no_recompute,
                 "never recompute activations (by default a layout that does not fit is tried again with the "
                 "attention's recomputation, then with per-block recomputation)");
  pmt::run::flag(app, s, "--no-sequence-parallel", o.no_sequence_parallel,
                 "never split the tokens over tp (by default a layout with tp > 1 that does not fit is tried again "
                 "with sequence parallelism)");
  option(app, s, "--dp-modes", o.dp_modes_text,
         "data-parallel modes to consider with dp > 1: a comma-separated list of sync, bf16 (compressed gradients), "
         "local:H, diloco:H (averages every H steps), stale:S (gradients applied S steps late); all but sync change "
         "how the model trains",
         pmt::run::parsed_by([](const std::string& v) { dp_modes_of(v); }))
      ->capture_default_str();
  option(app, s, "--top", o.top, "rows of the table", integer("--top", 1))->capture_default_str();
  pmt::run::flag(app, s, "--verbose", o.verbose, "what the calibration measured, piece by piece");
  option(app, s, "--csv", o.csv, "every ranked candidate: layout, predicted step ms and peak MiB per stage");
  const std::string m = "Measure (under mpiexec, calibrated)";
  option(app, m, "--measure", o.measure_text,
         "train the K best predicted candidates (or all), interleaved, and compare",
         [](const std::string& v) { return v == "all" ? std::string() : integer("--measure", 1)(v); });
  option(app, m, "--device", o.device,
         "where the calibration times the blocks: default (Kokkos' default space: the GPU in a CUDA build) or host",
         pmt::run::one_of("--device", {"default", "host"}))
      ->capture_default_str();
  option(app, m, "--comm", o.comm, "how the calibrated ranks talk: auto (NCCL between GPUs), mpi or nccl",
         pmt::run::one_of("--comm", {"auto", "mpi", "nccl"}))
      ->capture_default_str();
  option(app, m, "--rounds", o.rounds, "visits of each measured candidate (1 warm-up + 2 timed steps each)",
         integer("--rounds", 1))
      ->capture_default_str();
}

/// The flags of `args` (the words after the program's name; Kokkos' own taken out already);
/// `help` receives the help text for --help.
/// \throws pmt::ConfigError for a bad flag or flags that do not go together.
Options parse(std::vector<std::string> args, std::string& help) {
  Options o;
  o.problem.model = {256, 64, 4, 128, 4, 1};
  CLI::App app(
      "how should this GPT run on these ranks? (under mpiexec -n N: calibrate on the N ranks and plan for "
      "them)",
      prog);
  declare_problem(app, o);
  declare_nodes(app, o);
  declare_search(app, o);
  const auto flags = pmt::run::parse_flags(app, std::move(args));
  if (!flags.error.empty()) throw pmt::ConfigError(prog, flags.error);
  help = flags.help;
  if (!help.empty()) return o;
  o.problem.precision = pmt::parse_precision(o.precision, "--precision");
  o.dp_modes          = dp_modes_of(o.dp_modes_text);
  o.measure           = o.measure_text.empty() ? 0 : o.measure_text == "all" ? -1 : std::stoi(o.measure_text);
  if (o.ranks > 0 && o.gemm_gflops <= 0)
    throw pmt::ConfigError(prog,
                           "--ranks plans for a machine given by hand: give --gemm-gflops too (or run under "
                           "mpiexec without --ranks to calibrate)");
  if (o.ranks_per_node > 0 && o.ranks > 0 && (o.intra_gbps <= 0 || o.inter_gbps <= 0))
    throw pmt::ConfigError(prog,
                           "--ranks-per-node with a machine given by hand: give --intra-gbps and --inter-gbps too "
                           "(under mpiexec without --ranks the calibration measures both links)");
  if (o.ranks <= 0 && (o.intra_gbps > 0 || o.inter_gbps > 0))
    throw pmt::ConfigError(prog,
                           "--intra-gbps and --inter-gbps describe a machine given by hand (--ranks); a calibration "
                           "measures the links");
  if (o.ranks_per_node <= 0 && !o.rankfile.empty())
    throw pmt::ConfigError(prog, "--rankfile places ranks on nodes: give --ranks-per-node too");
  if (o.ranks_per_node <= 0 && (o.intra_gbps > 0 || o.inter_gbps > 0))
    throw pmt::ConfigError(prog, "--intra-gbps and --inter-gbps need --ranks-per-node (how many ranks share a node)");
  if (o.ranks <= 0 && o.problem.activation_bytes != 0 && o.problem.activation_bytes != o.problem.value_bytes)
    throw pmt::ConfigError(prog,
                           "--activation-bytes plans for another runtime's storage: give the machine by hand "
                           "(--ranks, --gemm-gflops); a calibration times pmt's own blocks, which keep 4");
  if (o.ranks > 0 && o.measure != 0)
    throw pmt::ConfigError(prog,
                           "--measure trains on the ranks it runs on: drop --ranks (the machine by "
                           "hand) and run under mpiexec");
  return o;
}

}  // namespace

int main(int argc, char* argv[]) {
  Options o;
  std::string help;
  pmt::run::KokkosFlags kokkos(argv[0]);
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    kokkos.take(args, prog);
    o = parse(std::move(args), help);
  } catch (const pmt::Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", prog, pmt::run::without_program(e.what(), prog).c_str());
    return 1;
  }
  if (!help.empty()) {
    std::fputs(help.c_str(), stdout);
    return 0;
  }
  pmt::ScopeGuard guard(kokkos.argc(), kokkos.argv());
  const bool root = pmt::world_rank() == 0;
  try {
    using Backend = pmt::comm::default_backend_t<Kokkos::DefaultHostExecutionSpace>;
#if PMT_ENABLE_MPI
    pmt::comm::Communicator<Backend> world(MPI_COMM_WORLD);
#else
    pmt::comm::Communicator<Backend> world;
#endif
    pmt::plan::Machine machine;
    if (o.ranks > 0) {
      machine.ranks           = o.ranks;
      machine.gemm_gflops     = o.gemm_gflops;
      machine.memory_gbps     = o.memory_gbps;
      machine.link_gbps       = o.link_gbps;
      machine.link_latency    = o.latency_us * 1e-6;
      machine.memory_bytes    = o.memory_mib * 1048576.0;
      machine.bf16_copy_bytes = o.bf16_copy_bytes;
      machine.source          = "given";
      if (o.ranks_per_node > 0) {
        machine.ranks_per_node = o.ranks_per_node;
        machine.intra          = {0, o.intra_latency_us * 1e-6, o.intra_gbps};
        machine.inter          = {0, o.inter_latency_us * 1e-6, o.inter_gbps};
      }
    } else {
      pmt::plan::CalibrateOptions co;
      co.memory_bytes   = o.memory_mib * 1048576.0;
      co.ranks_per_node = o.ranks_per_node;
      machine           = pmt::run::with_placement(prog, o.device, o.comm, [&](auto exec, auto backend) {
        using Exec = typename decltype(exec)::type;
        return pmt::plan::calibrate(pmt::run::communicator_for<typename decltype(backend)::type>(world), o.problem, co,
                                              Exec());
      });
    }
    pmt::plan::SearchOptions so;
    so.allow_zero              = !o.no_zero;
    so.allow_gpipe             = !o.no_gpipe;
    so.allow_recompute         = !o.no_recompute;
    so.allow_sequence_parallel = !o.no_sequence_parallel;
    so.dp_modes                = o.dp_modes;
    for (const auto& c : o.dp_modes)
      if (o.measure != 0 && c.mode != pmt::plan::DpMode::Sync && c.mode != pmt::plan::DpMode::Bf16)
        throw pmt::ConfigError(prog, "--measure trains the synchronous dp modes only (sync, bf16); --dp-modes names " +
                                         c.describe() + ", whose step time depends on the phase of its period");
    const auto plan = pmt::plan::search(o.problem, machine, so);
    std::vector<pmt::plan::Measured> measured;  // of the first measured.size() ranked candidates
    if (o.measure != 0) {
      std::vector<pmt::plan::Layout> shortlist;
      for (const auto& e : plan.ranked)
        if (o.measure < 0 || static_cast<int>(shortlist.size()) < o.measure) shortlist.push_back(e.layout);
      pmt::plan::MeasureOptions mo;
      mo.rounds = o.rounds;
      measured  = pmt::plan::measure(world, o.problem, shortlist, mo);
    }
    if (root) {
      const auto& m = o.problem.model;
      std::printf(
          "pmt-plan: GPT %zu layers, width %zu, %zu heads, context %zu, vocabulary %zu; batch %zu "
          "sequences; %s products\n",
          m.layers, m.width, m.heads, m.context, m.vocab, o.problem.batch, pmt::precision_name(o.problem.precision));
      std::printf("machine: %s\n", pmt::plan::describe(machine).c_str());
      if (!machine.advice.empty()) std::printf("note: %s\n", machine.advice.c_str());
      if (o.verbose) std::fputs(machine.details.c_str(), stdout);
      std::printf("\n");
      std::fputs(plan.table(static_cast<std::size_t>(o.top)).c_str(), stdout);
      if (!plan.ranked.empty()) {
        const auto& b           = plan.best().layout;
        const std::string flags = pmt::detail::str(
            "train_gpt --dp ", b.dp, " --tp ", b.tp, " --pp ", b.pp, " --microbatches ", b.microbatches,
            b.pp > 1 ? std::string(" --schedule ") + pmt::parallel::schedule_name(b.schedule) : std::string(),
            b.chunks > 1 ? " --chunks " + std::to_string(b.chunks) : std::string(),
            b.zero == 2 ? " --zero2"
            : b.zero    ? " --zero"
                        : "",
            b.recompute ? " --recompute" : "", b.recompute_attention ? " --recompute-attention" : "",
            b.recompute_stages > 0 ? " --recompute-stages " + std::to_string(b.recompute_stages) : std::string(),
            b.sequence_parallel ? " --sequence-parallel" : "",
            o.problem.precision == pmt::Precision::bf16 ? " --precision bf16" : "",
            b.sync.mode == pmt::plan::DpMode::Bf16       ? std::string(" --compress bf16")
            : b.sync.mode == pmt::plan::DpMode::LocalSgd ? " --local-sgd " + std::to_string(b.sync.period)
            : b.sync.mode == pmt::plan::DpMode::DiLoCo   ? " --diloco " + std::to_string(b.sync.period)
            : b.sync.mode == pmt::plan::DpMode::Stale    ? " --staleness " + std::to_string(b.sync.period)
                                                         : std::string());
        const double flops = pmt::plan::gpt_step_flops(o.problem.model, o.problem.batch, b.recompute);
        const double step  = plan.best().step_seconds();
        std::printf("\nthe best: %.4g s a step, %.4g GFLOP/s per rank of the model's products (%.4g FLOP a step%s)\n",
                    step, flops / step / machine.ranks / 1e9, flops,
                    b.recompute ? ", the recomputed forward included" : "");
        std::printf("run it: mpiexec -n %d %s   (or train_gpt --auto)\n", machine.ranks, flags.c_str());
        std::printf("in C++: Trainer policy %s, optimizer %s%s%s\n", b.policy_type().c_str(),
                    b.zero == 2 ? "pmt::optim::Zero2AdamW"
                    : b.zero    ? "pmt::optim::ZeroAdamW"
                                : "pmt::optim::AdamW",
                    o.problem.precision == pmt::Precision::bf16 ? ", TrainerOptions::precision bf16" : "",
                    b.sync.mode == pmt::plan::DpMode::Bf16 ? ", GradSyncOptions::compression bf16" : "");
        if (machine.ranks_per_node > 0) {
          // the Mesh's order is tp fastest, then dp, then pp: consecutive world ranks on one node
          // keep each tp group (of at most ranks_per_node) inside it
          const int n = machine.ranks_per_node;
          std::printf(
              "on nodes of %d ranks, consecutive ranks per node (tp groups inside a node):\n"
              "  mpiexec -n %d --map-by ppr:%d:node --rank-by slot --bind-to core %s\n"
              "  srun -n %d --ntasks-per-node=%d --distribution=block:block %s\n",
              n, machine.ranks, n, flags.c_str(), machine.ranks, n, flags.c_str());
          if (!o.rankfile.empty()) {
            std::FILE* f = std::fopen(o.rankfile.c_str(), "w");
            if (!f) throw pmt::IoError(prog, o.rankfile + ": cannot be written");
            for (int r = 0; r < machine.ranks; ++r) std::fprintf(f, "rank %d=+n%d slot=%d\n", r, r / n, r % n);
            std::fclose(f);
            std::printf("  rankfile %s (Open MPI, relative nodes +n0 ...): mpiexec -n %d --rankfile %s %s\n",
                        o.rankfile.c_str(), machine.ranks, o.rankfile.c_str(), flags.c_str());
          }
        }
      }
      if (!measured.empty()) {
        const std::size_t n = measured.size();
        std::vector<double> predicted(n), median(n);
        for (std::size_t i = 0; i < n; ++i) {
          predicted[i] = plan.ranked[i].step_seconds();
          median[i]    = measured[i].median;
        }
        std::vector<std::size_t> order(n);
        for (std::size_t i = 0; i < n; ++i) order[i] = i;
        std::stable_sort(order.begin(), order.end(),
                         [&](std::size_t a, std::size_t b) { return median[a] < median[b]; });
        std::vector<std::size_t> measured_rank(n);
        for (std::size_t k = 0; k < n; ++k) measured_rank[order[k]] = k + 1;
        std::printf(
            "\nmeasured: the %zu best predicted, trained side by side in %d rounds (each visit 1 warm-up + 2 "
            "timed steps; median and quartiles of the timed steps)\n",
            n, o.rounds);
        std::printf("pred rank  meas rank  %-38s  predicted ms  measured ms (quartiles)\n", "layout");
        for (std::size_t i = 0; i < n; ++i)
          std::printf("%9zu  %9zu  %-38s  %12.2f  %11.2f (%.2f-%.2f)\n", i + 1, measured_rank[i],
                      plan.ranked[i].layout.describe().c_str(), 1e3 * predicted[i], 1e3 * median[i],
                      1e3 * measured[i].low, 1e3 * measured[i].high);
        const auto& f = plan.ranked[order[0]].layout;
        std::printf("Spearman rank correlation, predicted vs measured: %.3f\n", pmt::plan::spearman(predicted, median));
        std::printf("fastest measured: %s, %.2f ms (the predicted best measured %.2f ms, %.2fx)\n",
                    f.describe().c_str(), 1e3 * median[order[0]], 1e3 * median[0], median[0] / median[order[0]]);
      }
      if (!o.csv.empty()) {
        std::FILE* f = std::fopen(o.csv.c_str(), "w");
        if (!f) throw pmt::IoError(prog, o.csv + ": cannot be written");
        std::fprintf(f,
                     "dp,tp,pp,microbatches,schedule,zero,step_ms,peak_mib,stage_peak_mib,measured_ms,"
                     "measured_steps_ms,chunks\n");
        for (std::size_t i = 0; i < plan.ranked.size(); ++i) {
          const auto& e = plan.ranked[i];
          std::string stages;
          for (const auto& s : e.memory) stages += (stages.empty() ? "" : ";") + std::to_string(s.total() / 1048576.0);
          std::string meas, meas_steps;
          if (i < measured.size()) {
            meas = std::to_string(1e3 * measured[i].median);
            for (double t : measured[i].steps) meas_steps += (meas_steps.empty() ? "" : ";") + std::to_string(1e3 * t);
          }
          std::fprintf(f, "%d,%d,%d,%d,%s,%d,%.4f,%.3f,%s,%s,%s,%d\n", e.layout.dp, e.layout.tp, e.layout.pp,
                       e.layout.microbatches, pmt::parallel::schedule_name(e.layout.schedule), e.layout.zero,
                       1e3 * e.step_seconds(), e.peak_bytes() / 1048576.0, stages.c_str(), meas.c_str(),
                       meas_steps.c_str(), e.layout.chunks);
        }
        std::fclose(f);
        std::printf("candidates: %s\n", o.csv.c_str());
      }
    }
    return plan.ranked.empty() ? 2 : 0;
  } catch (const pmt::Error& e) {
    if (root) std::fprintf(stderr, "%s: error: %s\n", prog, pmt::run::without_program(e.what(), prog).c_str());
    return 1;
  }
}
