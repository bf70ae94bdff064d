// SPDX-License-Identifier: Apache-2.0
// train_gpt: trains a byte-level GPT language model (vocabulary = the 256 byte values) on a text
// file with any dp x tp x pp layout of the MPI ranks, with validation, sharded checkpoints,
// metrics, a trace and a generated sample at the end. `train_gpt --help` lists the flags.
//   mpiexec -n 4 train_gpt --tp 2 --pp 2 --steps 200
// Every layout sees the same global batches (io/dataset.hpp), so a run's losses do not depend on
// its layout; a resumed run continues bit for bit like an uninterrupted one (same layout).
// It never loses work: outputs are checked writable before training, one run writes a
// checkpoint directory at a time (a lock), a signal checkpoints and stops all ranks at a step
// boundary, nan/inf stops (or skips) a step and never reaches a checkpoint, a watchdog ends a
// hung job naming the ranks that never arrived, and ranks started with different flags are
// refused. Exit codes: 0 done, 1 bad input or I/O error, 3 nan/inf, 4 watchdog, 75 stopped by a
// signal (after its checkpoint), 128 + N a second signal N (at once).
#include <pmt/obs/trace.hpp>
#include <pmt/run.hpp>
#include <pmt/tools.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <sched.h>
#include <unistd.h>

#if defined(_OPENMP)
#include <omp.h>
#endif

#ifndef PMT_DEFAULT_DATA_DIR
#define PMT_DEFAULT_DATA_DIR "docs"
#endif

namespace {

using Exec                 = Kokkos::DefaultHostExecutionSpace;
using Backend              = pmt::comm::default_backend_t<Exec>;
using Model                = pmt::nn::Gpt<float, Exec, Backend>;
using AdamW                = pmt::optim::AdamW<float, Exec>;
using Zero                 = pmt::optim::ZeroAdamW<float, Exec, Backend>;
using Zero2                = pmt::optim::Zero2AdamW<float, Exec, Backend>;
using Ids                  = Model::Ids;
constexpr const char* prog = "train_gpt";
namespace fs               = std::filesystem;

/// Exit codes besides 0 (done) and 1 (bad input, I/O error); a second signal N exits 128 + N.
constexpr int exit_nonfinite = 3, exit_watchdog = 4, exit_preempted = 75;

/// An error's message without the program's own name in front ("prog: error: what", once).
std::string own(const std::string& message) {
  const std::string mine = std::string(prog) + ": ";
  return message.rfind(mine, 0) == 0 ? message.substr(mine.size()) : message;
}

struct Options {
  int dp = 0, tp = 1, pp = 1, chunks = 1, microbatches = 0, layers = 4, width = 128, heads = 4, context = 64, batch = 8;
  int steps = 100, warmup = 10, val_every = 50, ckpt_every = 0, threads = 0, keep = 0;
  double lr = 3e-3, watchdog = 600;
  long seed   = 1;
  bool resume = false, help = false, zero = false, auto_plan = false, memory_report = true;
  int zero_stage = 1;  // with zero: 1 (optimizer state sharded) or 2 (gradients too)
  bool overwrite = false, allow_changed_config = false, skip_nonfinite = false, recompute = false;
  bool sequence_parallel = false, recompute_attention = false;
  int recompute_stages = 0;  // with --recompute or --recompute-attention: the first this many stages (0: all)
  std::vector<std::string> layout_flags;  // --dp, --tp, ... as given (--auto chooses them)
  std::vector<std::string> kokkos_args;   // --kokkos-*: passed to Kokkos, and only these
  std::string schedule = "1f1b", data = PMT_DEFAULT_DATA_DIR, ckpt_dir, metrics, trace, matmul;
  std::string compress  = "none";  // dp gradients on the wire: none or bf16 (error feedback)
  std::string precision = "fp32";  // the model's products: fp32, or bf16 operands with fp32 sums
  int local_sgd = 0, diloco = 0;   // a period: parameters averaged (and DiLoCo's outer step) every so many steps
  int staleness   = -1;            // >= 0: bounded staleness, gradient sums applied this many steps late
  double outer_lr = 0.7, outer_momentum = 0.9;
  bool outer_given = false;
};

/// Kokkos' own flags (3.4 to 5.x), each as --name or --name=value.
bool is_kokkos_flag(const std::string& a) {
  static const char* const names[] = {"--kokkos-help",
                                      "--kokkos-threads",
                                      "--kokkos-num-threads",
                                      "--kokkos-numa",
                                      "--kokkos-device-id",
                                      "--kokkos-device",
                                      "--kokkos-num-devices",
                                      "--kokkos-ndevices",
                                      "--kokkos-skip-device",
                                      "--kokkos-disable-warnings",
                                      "--kokkos-print-configuration",
                                      "--kokkos-tune-internals",
                                      "--kokkos-tools-library",
                                      "--kokkos-tools-libs",
                                      "--kokkos-tools-args",
                                      "--kokkos-tools-help",
                                      "--kokkos-map-device-id-by"};
  const std::string name           = a.substr(0, a.find('='));
  return std::find_if(std::begin(names), std::end(names), [&](const char* n) { return name == n; }) != std::end(names);
}

std::string usage() {
  return std::string(
             "usage: train_gpt [flags]        (under mpiexec -n N for N ranks)\n"
             "layout\n"
             "  --dp N --tp N --pp N    data x tensor x pipeline degrees; their product must be the number\n"
             "                          of ranks (default: tp 1, pp 1, dp = ranks / (tp pp))\n"
             "  --schedule 1f1b|gpipe   pipeline schedule (default 1f1b)\n"
             "  --chunks V              model chunks per pipeline stage (default 1); with 1f1b, V > 1 runs\n"
             "                          interleaved 1F1B (bubble / V; needs microbatches a multiple of pp)\n"
             "  --microbatches N        microbatches per step and dp rank (default 2 pp with pp > 1, else 1);\n"
             "                          must divide batch / dp\n"
             "  --zero                  ZeRO-1: AdamW's state sharded over dp\n"
             "  --zero2                 ZeRO-2: AdamW's state and the gradients sharded over dp\n"
             "  --compress none|bf16    dp gradients sent as bf16 with error feedback (half the bytes; default none)\n"
             "  --local-sgd H           no gradient all-reduce: each dp replica trains on its own data, the\n"
             "                          parameters are averaged every H steps\n"
             "  --diloco H              DiLoCo: as --local-sgd H, then an outer Nesterov SGD step on the averaged\n"
             "                          change (--outer-lr X, default 0.7; --outer-momentum X, default 0.9)\n"
             "  --staleness S           asynchronous dp: each step applies the gradient sum started S steps\n"
             "                          before, whose all-reduce overlaps those S steps (0: synchronous)\n"
             "  --recompute             activation recomputation per block: backward runs each block's forward\n"
             "                          again (about a third more compute, a block's input kept per microbatch)\n"
             "  --recompute-stages K    only the first K pipeline stages recompute (with --recompute or\n"
             "                          --recompute-attention; default every stage)\n"
             "  --recompute-attention   selective recomputation: each block keeps q, k, v, not the attention's\n"
             "                          T x T matrices, and runs the attention core again in backward\n"
             "  --sequence-parallel     with tp > 1: the norms and residuals hold 1 / tp of the tokens each, the tp\n"
             "                          layers all-gather and reduce-scatter them (less activation memory)\n"
             "  --auto                  let the planner choose all of the above: it calibrates on the ranks,\n"
             "                          predicts every layout (pmt-plan prints the same table) and runs the best\n"
             "model (byte-level: vocabulary 256)\n"
             "  --layers N (4)  --width N (128)  --heads N (4)  --context N (64)\n"
             "training\n"
             "  --batch N (8)           sequences per step, over all dp ranks\n"
             "  --steps N (100)  --lr X (3e-3)  --warmup N (10)  --seed N (1)\n"
             "  --threads N             OpenMP threads per rank (default: OMP_NUM_THREADS; when it is unset and\n"
             "                          several ranks share a node: its cores / its ranks, said at start-up)\n"
             "  --on-nonfinite stop|skip  a nan or inf loss or gradient norm stops the run (exit 3; default), or\n"
             "                          skips that step's update (10 skipped steps in a row stop it)\n"
             "  --watchdog SECONDS      end the job when one communication call waits longer (default 600; 0: off),\n"
             "                          naming the ranks that never arrived (exit 4)\n"
             "  --precision fp32|bf16   the model's matrix products: fp32 (default), or bf16 mixed precision\n"
             "                          (operands rounded to bf16, sums in fp32, on AMX tiles where the CPU has\n"
             "                          them; fp32 parameters, gradients and optimizer state)\n"
             "  --matmul auto|vendor|portable  the matmul path: auto (default, or PMT_MATMUL) times the vendor\n"
             "                          BLAS and pmt's portable kernel per shape class on first use and keeps\n"
             "                          the faster, the same on every rank; vendor or portable pins one\n"
             "data\n"
             "  --data PATH             a text file, or a directory whose .md files are concatenated\n"
             "                          (default: ") +
         PMT_DEFAULT_DATA_DIR +
         ",\n"
         "                          the project's documentation, on every machine pmt is built on);\n"
         "                          the first 90 % trains, the rest validates\n"
         "  --val-every N (50)      validation loss every N steps (0: only at the end)\n"
         "checkpoints\n"
         "  --ckpt-dir DIR          where to save sharded checkpoints (DIR/step-N, DIR/LATEST)\n"
         "  --ckpt-every N          save every N steps (0: only at the end, when --ckpt-dir is given)\n"
         "  --resume                continue from DIR/LATEST (any layout of the same model); when LATEST is\n"
         "                          missing or damaged, from the newest checkpoint that verifies\n"
         "  --overwrite             a fresh run (no --resume) into a DIR holding checkpoints removes them;\n"
         "                          without it such a run is refused\n"
         "  --allow-changed-config  resume although --seed, --data, --lr, --warmup or --steps differ from the\n"
         "                          saved run's (refused otherwise)\n"
         "  --keep N                keep the newest N checkpoints (default: all)\n"
         "  One run writes DIR at a time (DIR/LOCK). SIGTERM, SIGINT or SIGUSR1 to any rank (or SIGUSR1 to\n"
         "  mpiexec, which forwards it) stops all ranks at the next step with a checkpoint (exit 75).\n"
         "output\n"
         "  --metrics FILE          JSON lines: every step's and validation's figures\n"
         "  --no-memory-report      leave out the peak memory per rank (counting Kokkos' allocations costs\n"
         "                          about 3 % of a step for small models)\n"
         "  --trace FILE            Chrome trace (chrome://tracing, Perfetto) of every rank: forwards, backwards,\n"
         "                          sends -> receives, collectives, optimizer (docs/plot.py draws it)\n"
         "Each step prints: loss, learning rate, tokens/s, MFU (model FLOPs / the measured fp32 FMA peak of\n"
         "all ranks), the share of rank 0's step spent in communication, and progress; the run ends with\n"
         "validation, a per-rank compute / communication / idle report and a generated sample.\n";
}

Options parse(int argc, char* argv[]) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--kokkos", 0) == 0) {  // Kokkos' own flags
      if (!is_kokkos_flag(a))
        throw pmt::ConfigError(prog, "unknown Kokkos flag " + a + " (Kokkos' flags: --kokkos-help lists them)");
      o.kokkos_args.push_back(a);
      continue;
    }
    if (a == "--help" || a == "-h") {
      o.help = true;
      continue;
    }
    if (a == "--recompute") {
      o.recompute = true;
      continue;
    }
    if (a == "--sequence-parallel" || a == "--recompute-attention") {
      (a == "--sequence-parallel" ? o.sequence_parallel : o.recompute_attention) = true;
      continue;
    }
    if (a == "--no-memory-report") {
      o.memory_report = false;
      continue;
    }
    if (a == "--overwrite" || a == "--allow-changed-config") {
      (a == "--overwrite" ? o.overwrite : o.allow_changed_config) = true;
      continue;
    }
    if (a == "--resume" || a == "--zero" || a == "--zero2" || a == "--auto") {
      (a == "--resume" ? o.resume : a == "--auto" ? o.auto_plan : o.zero) = true;
      if (a == "--zero2") o.zero_stage = 2;
      if (a == "--zero" || a == "--zero2") o.layout_flags.push_back(a);
      continue;
    }
    const auto known = {"--dp",
                        "--tp",
                        "--pp",
                        "--chunks",
                        "--schedule",
                        "--microbatches",
                        "--layers",
                        "--width",
                        "--heads",
                        "--context",
                        "--batch",
                        "--steps",
                        "--lr",
                        "--warmup",
                        "--seed",
                        "--data",
                        "--val-every",
                        "--ckpt-dir",
                        "--ckpt-every",
                        "--metrics",
                        "--trace",
                        "--threads",
                        "--matmul",
                        "--keep",
                        "--watchdog",
                        "--on-nonfinite",
                        "--compress",
                        "--local-sgd",
                        "--diloco",
                        "--outer-lr",
                        "--outer-momentum",
                        "--staleness",
                        "--precision",
                        "--recompute-stages"};
    if (std::find(known.begin(), known.end(), a) == known.end())
      throw pmt::ConfigError(prog, "unknown flag " + a + " (see --help)");
    if (i + 1 >= argc) throw pmt::ConfigError(prog, a + " needs a value (see --help)");
    const std::string v = argv[++i];
    if (a == "--dp" || a == "--tp" || a == "--pp" || a == "--chunks" || a == "--microbatches" || a == "--schedule")
      o.layout_flags.push_back(a);
    const auto as_int = [&](long min) {
      char* end    = nullptr;
      errno        = 0;
      const long x = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || errno != 0 || x < min || x > 1L << 30)
        throw pmt::ConfigError(prog, a + " " + v + ": expected an integer >= " + std::to_string(min));
      return static_cast<int>(x);
    };
    if (a == "--dp")
      o.dp = as_int(1);
    else if (a == "--tp")
      o.tp = as_int(1);
    else if (a == "--pp")
      o.pp = as_int(1);
    else if (a == "--chunks")
      o.chunks = as_int(1);
    else if (a == "--recompute-stages")
      o.recompute_stages = as_int(1);
    else if (a == "--microbatches")
      o.microbatches = as_int(1);
    else if (a == "--layers")
      o.layers = as_int(1);
    else if (a == "--width")
      o.width = as_int(1);
    else if (a == "--heads")
      o.heads = as_int(1);
    else if (a == "--context")
      o.context = as_int(1);
    else if (a == "--batch")
      o.batch = as_int(1);
    else if (a == "--steps")
      o.steps = as_int(1);
    else if (a == "--warmup")
      o.warmup = as_int(0);
    else if (a == "--seed")
      o.seed = as_int(0);
    else if (a == "--val-every")
      o.val_every = as_int(0);
    else if (a == "--ckpt-every")
      o.ckpt_every = as_int(0);
    else if (a == "--threads")
      o.threads = as_int(1);
    else if (a == "--keep")
      o.keep = as_int(1);
    else if (a == "--local-sgd")
      o.local_sgd = as_int(1);
    else if (a == "--diloco")
      o.diloco = as_int(1);
    else if (a == "--staleness")
      o.staleness = as_int(0);
    else if (a == "--compress") {
      if (v != "none" && v != "bf16") throw pmt::ConfigError(prog, "--compress " + v + ": expected none or bf16");
      o.compress = v;
    } else if (a == "--outer-lr" || a == "--outer-momentum") {
      char* end      = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      const bool ok  = end && *end == '\0' && (a == "--outer-lr" ? x > 0 : x >= 0 && x < 1);
      if (!ok)
        throw pmt::ConfigError(
            prog, a + " " + v + (a == "--outer-lr" ? ": expected a positive number" : ": expected 0 <= X < 1"));
      (a == "--outer-lr" ? o.outer_lr : o.outer_momentum) = x;
      o.outer_given                                       = true;
    } else if (a == "--watchdog") {
      char* end  = nullptr;
      o.watchdog = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(o.watchdog >= 0) || !std::isfinite(o.watchdog))
        throw pmt::ConfigError(prog, "--watchdog " + v + ": expected seconds >= 0 (0: off)");
    } else if (a == "--on-nonfinite") {
      if (v != "stop" && v != "skip") throw pmt::ConfigError(prog, "--on-nonfinite " + v + ": expected stop or skip");
      o.skip_nonfinite = v == "skip";
    } else if (a == "--lr") {
      char* end = nullptr;
      o.lr      = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(o.lr > 0) || !std::isfinite(o.lr))
        throw pmt::ConfigError(prog, "--lr " + v + ": expected a positive number");
    } else if (a == "--schedule") {
      if (v != "1f1b" && v != "gpipe") throw pmt::ConfigError(prog, "--schedule " + v + ": expected 1f1b or gpipe");
      o.schedule = v;
    } else if (a == "--data")
      o.data = v;
    else if (a == "--ckpt-dir") {
      if (v.empty()) throw pmt::ConfigError(prog, "--ckpt-dir needs a directory, not an empty word");
      o.ckpt_dir = v;
    } else if (a == "--metrics")
      o.metrics = v;
    else if (a == "--trace")
      o.trace = v;
    else if (a == "--precision") {
      pmt::parse_precision(v, "--precision");  // throws for another word
      o.precision = v;
    } else if (a == "--matmul") {
      pmt::ops::parse_matmul_path(v, "--matmul");  // throws for another word
      o.matmul = v;
    }
  }
  return o;
}

/// The checkpoint's description of the model (load refuses another).
std::string model_description(const Options& o) {
  return pmt::detail::str("gpt vocab=", pmt::io::TokenDataset::vocab_size, " context=", o.context, " layers=", o.layers,
                          " width=", o.width, " heads=", o.heads);
}

/// The model the flags describe; its vocabulary is the dataset's.
pmt::nn::GptConfig gpt_config(const Options& o) {
  return {pmt::io::TokenDataset::vocab_size, static_cast<std::size_t>(o.context), static_cast<std::size_t>(o.layers),
          static_cast<std::size_t>(o.width), static_cast<std::size_t>(o.heads),   static_cast<std::uint64_t>(o.seed)};
}

/// The layout the flags describe, as the planner states layouts.
pmt::plan::Layout layout_of(const Options& o) {
  pmt::plan::Layout l;
  l.dp = o.dp, l.tp = o.tp, l.pp = o.pp, l.microbatches = o.microbatches, l.chunks = o.chunks;
  l.schedule  = o.schedule == "gpipe" ? pmt::parallel::ScheduleKind::GPipe : pmt::parallel::ScheduleKind::OneFOneB;
  l.zero      = o.zero ? o.zero_stage : 0;
  l.recompute = o.recompute;
  l.recompute_attention = o.recompute_attention && !o.recompute;  // the whole block recomputes it anyway
  l.recompute_stages    = o.recompute_stages;
  l.sequence_parallel   = o.sequence_parallel && o.tp > 1;  // with tp 1 there is nothing to split
  using M               = pmt::plan::DpMode;
  if (o.dp > 1)  // one replica: a data-parallel mode changes nothing
    l.sync = o.local_sgd > 0        ? pmt::plan::DpChoice{M::LocalSgd, o.local_sgd}
             : o.diloco > 0         ? pmt::plan::DpChoice{M::DiLoCo, o.diloco}
             : o.staleness >= 0     ? pmt::plan::DpChoice{M::Stale, o.staleness}
             : o.compress == "bf16" ? pmt::plan::DpChoice{M::Bf16, 0}
                                    : pmt::plan::DpChoice{};
  return l;
}

/// Checks what needs no communication; every rank reaches the same verdict. The layout's rules
/// are the planner's (pmt::plan::why_invalid); what is checked here is the flags' own.
void validate(Options& o, int ranks) {
  if (o.dp == 0) {
    if (ranks % (o.tp * o.pp) != 0)
      throw pmt::ConfigError(prog,
                             pmt::detail::str(ranks, " ranks are not divisible by tp(", o.tp, ") * pp(", o.pp, ")"));
    o.dp = ranks / (o.tp * o.pp);
  }
  if (static_cast<long>(o.dp) * o.tp * o.pp != ranks)
    throw pmt::ConfigError(
        prog, pmt::detail::str("dp(", o.dp, ") * tp(", o.tp, ") * pp(", o.pp,
                               ") = ", static_cast<long>(o.dp) * o.tp * o.pp, " but there are ", ranks, " ranks"));
  if (o.microbatches == 0) o.microbatches = o.pp > 1 ? std::max(1, std::min(2 * o.pp, o.batch / o.dp)) : 1;
  if ((o.local_sgd > 0) + (o.diloco > 0) + (o.staleness >= 0) > 1)
    throw pmt::ConfigError(prog, "--local-sgd, --diloco and --staleness are three data-parallel modes: give one");
  if (o.staleness >= 0 && (o.zero || o.compress != "none"))
    throw pmt::ConfigError(
        prog, pmt::detail::str("--staleness applies whole fp32 gradient sums late; it does not combine with ",
                               o.zero ? "--zero" : "--compress"));
  if ((o.local_sgd > 0 || o.diloco > 0) && o.zero)
    throw pmt::ConfigError(
        prog, pmt::detail::str(o.diloco > 0 ? "--diloco" : "--local-sgd",
                               " keeps replicas apart between averages; --zero needs synchronous gradients"));
  if (o.compress != "none" && (o.local_sgd > 0 || o.diloco > 0 || o.zero))
    throw pmt::ConfigError(
        prog, pmt::detail::str("--compress ", o.compress, " compresses the synchronous gradient all-reduce; ",
                               o.zero ? "--zero reduce-scatters instead" : "this run does not all-reduce gradients"));
  if (o.outer_given && o.diloco == 0)
    throw pmt::ConfigError(prog, "--outer-lr and --outer-momentum set DiLoCo's outer step: they need --diloco H");
  pmt::plan::Problem problem;
  problem.model                  = gpt_config(o);
  problem.batch                  = static_cast<std::size_t>(o.batch);
  const pmt::plan::Layout layout = layout_of(o);
  if (const std::string why = pmt::plan::why_invalid(problem, layout, ranks); !why.empty())
    throw pmt::ConfigError(prog, pmt::detail::str("the layout ", layout.describe(), " cannot train this model (",
                                                  model_description(o), "): ", why));
}

/// Checks the checkpoint and output flags (before the preflight acts on them).
void validate_outputs(const Options& o) {
  if (o.resume && o.ckpt_dir.empty()) throw pmt::ConfigError(prog, "--resume needs --ckpt-dir");
  if (o.ckpt_every > 0 && o.ckpt_dir.empty())
    throw pmt::ConfigError(prog, "--ckpt-every " + std::to_string(o.ckpt_every) + " needs --ckpt-dir (where to save)");
  if (o.keep > 0 && o.ckpt_dir.empty()) throw pmt::ConfigError(prog, "--keep needs --ckpt-dir");
  if (o.overwrite && o.ckpt_dir.empty()) throw pmt::ConfigError(prog, "--overwrite needs --ckpt-dir");
  if (o.overwrite && o.resume)
    throw pmt::ConfigError(prog, "--overwrite starts afresh and --resume continues: give one");
}

/// --auto: the planner's best layout for this model on these ranks (collective: it calibrates).
template <class Comm>
void choose_layout(Options& o, const Comm& world) {
  if (!o.layout_flags.empty()) {
    std::string given;
    for (const auto& f : o.layout_flags) given += " " + f;
    throw pmt::ConfigError(prog, "--auto chooses the layout; drop" + given);
  }
  pmt::plan::Problem problem;
  problem.model     = gpt_config(o);
  problem.batch     = static_cast<std::size_t>(o.batch);
  problem.precision = pmt::parse_precision(o.precision);  // calibrated in the run's precision
  pmt::plan::SearchOptions so;
  const auto plan = pmt::plan::search(problem, pmt::plan::calibrate(world, problem), so);
  if (pmt::world_rank() == 0 && !plan.machine.advice.empty())
    std::printf("--auto: note: %s\n", plan.machine.advice.c_str());
  const auto& b = plan.best().layout;  // raises, with the rejections, when nothing runs
  o.dp = b.dp, o.tp = b.tp, o.pp = b.pp, o.microbatches = b.microbatches, o.zero = b.zero > 0, o.chunks = b.chunks;
  o.zero_stage          = b.zero > 0 ? b.zero : 1;
  o.recompute           = o.recompute || b.recompute;
  o.sequence_parallel   = o.sequence_parallel || b.sequence_parallel;
  o.recompute_attention = (o.recompute_attention || b.recompute_attention) && !o.recompute;
  if (b.recompute || b.recompute_attention) o.recompute_stages = b.recompute_stages;
  o.schedule = pmt::parallel::schedule_name(b.schedule);
  if (pmt::world_rank() == 0)
    std::printf("--auto: the planner's top 5 of %zu layouts (%s)\n%s\n", plan.ranked.size(),
                pmt::plan::describe(plan.machine).c_str(), plan.table(5).c_str());
}

bool is_world_root_env() {  // before MPI is initialised
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK"})
    if (const char* r = std::getenv(v)) return std::atoi(r) == 0;
  return true;
}

/// An error every rank raised (bad input, or a checkpoint that cannot be loaded or saved): all
/// exit 1; rank 0 reports it, and so does a rank whose own error it is (`alike` false: only some
/// ranks hold the cause, the others raise "failed on other rank(s)").
struct Agreed {
  std::string message;
  bool alike = true;
  int code   = 1;  ///< the exit code
};

/// Collective: raises Agreed on every rank when any rank holds an error (its own message on
/// that rank, "failed on other rank(s)" elsewhere).
template <class Comm>
void agree_errors(const Comm& world, const std::exception_ptr& err, const std::string& what) {
  try {
    pmt::comm::agree_on_errors(world, err, prog, what);
  } catch (const std::exception& e) {
    throw Agreed{e.what(), false};
  }
}

/// Collective: every rank hashes its command line (and PMT_MATMUL); ranks whose hash differs
/// from rank 0's are named in one error, before any other communication could mismatch.
template <class Comm>
void agree_command_line(const Comm& world, int argc, char* argv[]) {
  std::string line;  // the arguments, each ended by a 0 byte, and PMT_MATMUL
  for (int i = 1; i < argc; ++i) line += std::string(argv[i]) + '\0';
  line += std::getenv("PMT_MATMUL") ? std::getenv("PMT_MATMUL") : "";
  try {
    pmt::comm::agree_on_text(world, line, prog, "flags (command line and PMT_MATMUL)");
  } catch (const pmt::ConfigError& e) {
    throw Agreed{e.what()};
  }
}

/// Whether `path` can be written, without changing it (a file that did not exist is removed).
void probe_writable(const std::string& flag, const std::string& path) {
  std::error_code ec;
  const bool existed = fs::exists(path, ec);
  std::FILE* f       = std::fopen(path.c_str(), "a");
  if (!f) throw pmt::IoError(prog, flag + " " + path + ": cannot be written (" + std::strerror(errno) + ")");
  std::fclose(f);
  if (!existed) fs::remove(path, ec);
}

/// The run's configuration as a checkpoint records it: what a resumed run must share with the
/// saved one for its losses to continue the saved run's.
std::vector<std::pair<std::string, std::string>> run_config(const Options& o, const pmt::io::TokenDataset& data) {
  char lr[32], hash[32];
  std::snprintf(lr, sizeof lr, "%.17g", o.lr);
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(data.fingerprint()));
  return {{"seed", std::to_string(o.seed)},
          {"data", std::to_string(data.size()) + ":" + hash},
          {"lr", lr},
          {"warmup", std::to_string(o.warmup)},
          {"steps", std::to_string(o.steps)},
          {"precision", o.precision},
          {"dp_mode", o.diloco > 0       ? pmt::detail::str("diloco:", o.diloco, ":", o.outer_lr, ":", o.outer_momentum)
                      : o.local_sgd > 0  ? pmt::detail::str("local-sgd:", o.local_sgd)
                      : o.staleness >= 0 ? pmt::detail::str("stale:", o.staleness)
                                         : "sync:" + o.compress}};
}

/// The number of ranks on this node, from the launcher's environment (1 when unknown).
int local_ranks_env() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* n = std::getenv(v))
      if (std::atoi(n) > 0) return std::atoi(n);
  return 1;
}

/// What keeps a run safe while it lasts: the checkpoint directory's lock (rank 0), the watchdog
/// and its heartbeat directory (removed by rank 0 at the end, after the watchdog stops).
struct Guards {
  std::unique_ptr<pmt::run::DirectoryLock> lock;
  struct RemoveBeats {
    std::string dir;
    ~RemoveBeats() {
      std::error_code ec;
      if (!dir.empty()) fs::remove_all(dir, ec);
    }
  } remove_beats;
  std::unique_ptr<pmt::run::Watchdog> watchdog;
};

/// Collective, before any training (and before --auto calibrates): rank 0 takes the checkpoint
/// directory's lock, refuses a fresh run into old checkpoints (unless --overwrite), clears what
/// an interrupted save left, and checks that the metrics and trace files can be written; then
/// every rank checks that it can write its shards into the directory. Then the watchdog starts:
/// heartbeats in the checkpoint directory (shared by the nodes, as a rule) or in a fresh
/// temporary directory that rank 0 names.
template <class Comm>
std::unique_ptr<Guards> preflight(const Options& o, const Comm& world) {
  const bool root = world.rank() == 0;
  auto g          = std::make_unique<Guards>();
  {
    std::exception_ptr err;
    if (root) try {
        if (!o.ckpt_dir.empty()) {
          g->lock = std::make_unique<pmt::run::DirectoryLock>(o.ckpt_dir);
          if (!g->lock->note().empty())
            std::printf("checkpoints: %s: %s\n", o.ckpt_dir.c_str(), g->lock->note().c_str());
          const auto steps = pmt::io::checkpoint_steps(o.ckpt_dir);
          if (!o.resume && !steps.empty()) {
            if (!o.overwrite)
              throw pmt::IoError(
                  prog,
                  pmt::detail::str(o.ckpt_dir, " holds ", steps.size(), " checkpoint(s), the newest ", steps.back(),
                                   ": continue them with --resume, or replace them with --overwrite"));
            std::error_code ec;
            for (const auto& st : steps) fs::remove_all(o.ckpt_dir + "/" + st, ec);
            fs::remove(o.ckpt_dir + "/LATEST", ec);
            std::printf("checkpoints: --overwrite removed %zu checkpoint(s) from %s\n", steps.size(),
                        o.ckpt_dir.c_str());
          }
          const auto gone = pmt::io::remove_stale_partials(o.ckpt_dir);
          if (!gone.empty())
            std::printf("checkpoints: removed %zu leftover(s) of an interrupted save from %s\n", gone.size(),
                        o.ckpt_dir.c_str());
        }
        if (!o.metrics.empty()) probe_writable("--metrics", o.metrics);
        if (!o.trace.empty()) probe_writable("--trace", o.trace);
      } catch (...) {
        err = std::current_exception();
      }
    agree_errors(world, err, "the preflight checks");
    if (!o.ckpt_dir.empty()) {
      try {
        probe_writable("--ckpt-dir", o.ckpt_dir + "/.write-test-rank-" + std::to_string(world.rank()));
      } catch (...) {
        err = std::current_exception();
      }
      agree_errors(world, err, "writing into --ckpt-dir");
    }
  }
  std::string beats;
  if (o.watchdog > 0) {
    Kokkos::View<std::int8_t*, Kokkos::HostSpace> name("beats", 4096);
    if (root) {
      std::string dir = o.ckpt_dir.empty() ? std::string() : o.ckpt_dir + "/.heartbeat";
      if (dir.empty()) {
        std::string pattern = (fs::temp_directory_path() / "pmt-watchdog-XXXXXX").string();
        dir                 = ::mkdtemp(&pattern[0]) ? pattern : std::string();
      }
      std::error_code ec;
      if (!dir.empty()) fs::create_directories(dir, ec);
      for (std::size_t i = 0; i < dir.size() && i + 1 < name.size(); ++i) name(i) = static_cast<std::int8_t>(dir[i]);
    }
    pmt::comm::broadcast(world, Kokkos::DefaultHostExecutionSpace(), name, 0);
    for (std::size_t i = 0; i < name.size() && name(i) != 0; ++i) beats += static_cast<char>(name(i));
    if (!beats.empty())
      g->watchdog = std::make_unique<pmt::run::Watchdog>(
          pmt::run::WatchdogOptions{o.watchdog, beats, world.rank(), world.size(), 0},
          [](const std::string& report, bool reporter) {
            if (reporter) {
              std::fprintf(stderr, "%s: error: %s\n", prog, report.c_str());
              std::fflush(stderr);
            } else {
              std::this_thread::sleep_for(std::chrono::seconds(3));  // the reporter's message first
            }
            std::_Exit(exit_watchdog);
          });
  }
  if (root) g->remove_beats.dir = beats;
  return g;
}

/// The run with optimizer Opt (AdamW, or ZeroAdamW with --zero) and data-parallel mode Mode
/// (Synchronous, LocalSgd<> or DiLoCo<>): builds the model over the mesh, trains, validates,
/// checkpoints, reports and samples.
template <class Opt, class Mode>
int run(Options& o, const pmt::comm::Communicator<Backend>& world, std::unique_ptr<pmt::io::TokenDataset>& data,
        Guards& guards) {
  const bool root = pmt::world_rank() == 0;
  auto& memory    = pmt::obs::MemoryTracker::instance();  // Kokkos allocations: the peak per rank, in the report
  if (o.memory_report) memory.enable();
  pmt::Mesh<Backend> mesh(world, pmt::MeshShape{o.dp, o.tp, o.pp});
  const std::size_t T          = static_cast<std::size_t>(o.context);
  const pmt::nn::GptConfig cfg = gpt_config(o);
  // recomputation on this rank's stage, unless --recompute-stages leaves it out
  const bool recomputes_here = o.recompute_stages == 0 || mesh.coord(pmt::Axis::pp) < o.recompute_stages;
  Model model(
      mesh, cfg,
      pmt::nn::GptOptions{
          {}, o.chunks, o.recompute && recomputes_here, o.sequence_parallel, o.recompute_attention && recomputes_here});
  const pmt::optim::AdamWOptions hyper{0.9, 0.95, 1e-8, 0.1};
  Opt opt = [&] {
    if constexpr (std::is_same_v<Opt, Zero>)
      return Opt(model.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp),
                 o.pp > 1 ? std::optional<pmt::comm::Communicator<Backend>>(mesh.comm(pmt::Axis::pp)) : std::nullopt);
    else if constexpr (std::is_same_v<Opt, Zero2>)
      return Opt(model.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp),
                 o.pp > 1 ? std::optional<pmt::comm::Communicator<Backend>>(mesh.comm(pmt::Axis::pp)) : std::nullopt,
                 model.tied_parameters());
    else
      return Opt(model.parameters(), hyper);
  }();
  pmt::train::TrainerOptions topts(pmt::parallel::GradSyncOptions{
      pmt::parallel::GradSync<float, Exec, Backend>::default_bucket_bytes,
      o.compress == "bf16" ? pmt::parallel::GradCompression::bf16 : pmt::parallel::GradCompression::none});
  topts.period    = std::max(o.local_sgd, o.diloco);
  topts.staleness = std::max(o.staleness, 0);
  topts.outer     = {o.outer_lr, o.outer_momentum, true};
  topts.precision = pmt::parse_precision(o.precision);
  using Policy    = pmt::Hybrid<pmt::DataParallel<Mode>, pmt::TensorSplit<>, pmt::Pipeline<>>;
  pmt::train::Trainer<Model, Opt, Exec, Backend, Policy> trainer(mesh, model, opt, Exec(), topts);
  trainer.set_schedule(o.schedule == "gpipe" ? pmt::parallel::ScheduleKind::GPipe
                                             : pmt::parallel::ScheduleKind::OneFOneB);
  int start = 0;
  if (o.resume) {
    // rank 0 picks the checkpoint (LATEST, or the newest that verifies) and tells the others
    Kokkos::View<double, Kokkos::HostSpace> pick("pick");
    pick() = -1;
    {
      std::exception_ptr err;
      if (root) try {
          std::string note;
          const std::string found = pmt::io::resumable_checkpoint(o.ckpt_dir, &note);
          if (!note.empty()) std::printf("checkpoints: %s\n", note.c_str());
          if (!found.empty()) pick() = double(std::stoll(found.substr(found.size() - 8)));
        } catch (...) {
          err = std::current_exception();
        }
      agree_errors(world, err, "finding the checkpoint to resume");
    }
    pmt::comm::broadcast(world, Kokkos::DefaultHostExecutionSpace(), pick, 0);
    const std::string latest =
        pick() < 0 ? std::string() : pmt::io::checkpoint_step_dir(o.ckpt_dir, static_cast<std::int64_t>(pick()));
    if (latest.empty()) {
      if (root) std::printf("no checkpoint in %s: starting from step 0\n", o.ckpt_dir.c_str());
    } else {
      try {
        const auto info = pmt::io::load_checkpoint(latest, mesh, opt, model_description(o), trainer.state());
        start           = static_cast<int>(info.step);
        // the saved run's configuration: a different one would not continue its losses
        std::string changed;
        for (const auto& [key, now] : run_config(o, *data)) {
          const auto it = info.extra.find(key);
          if (it != info.extra.end() && it->second != now)
            changed += (changed.empty() ? "" : ", ") + ("--" + key) + " " + (key == "data" ? "(" + now + ")" : now) +
                       " (the saved run: " + it->second + ")";
        }
        if (!changed.empty() && !o.allow_changed_config)
          throw Agreed{"resuming " + latest + " with a changed configuration: " + changed +
                       "; its batches or learning rates would differ from the saved run's (--allow-changed-config "
                       "resumes anyway)"};
        if (!changed.empty() && root)
          std::printf("resuming with a changed configuration (--allow-changed-config): %s\n", changed.c_str());
        // the matmul paths the saved run took: the resumed run continues on them (bit for bit)
        if (const auto it = info.extra.find("matmul_paths"); it != info.extra.end()) {
          const auto paths = pmt::decode_measured_choices(it->second);
          pmt::set_measured_choices(paths);
          if (root && !paths.empty())
            std::printf("matmul: the paths of %zu shape classes from the checkpoint\n", paths.size());
        }
        // a layout-free fingerprint of the loaded parameters (the same model on any layout)
        const double fp = pmt::run::parameter_fingerprint(mesh, model.parameters());
        if (root)
          std::printf("resumed from %s: step %d, saved with dp %d x tp %d x pp %d, parameter fingerprint %.15e\n",
                      latest.c_str(), start, info.layout.dp, info.layout.tp, info.layout.pp, fp);
      } catch (const pmt::IoError& e) {
        throw Agreed{e.what(), false};  // load_checkpoint raises on every rank
      }
    }
  }
  // the model's FLOPs per step, forward and backward, as the planner and published runs count
  // them (recomputation not counted: MFU is of the model's work)
  const double tokens = double(o.batch) * double(T);
  const double flops  = pmt::plan::gpt_step_flops(cfg, static_cast<std::size_t>(o.batch), /*recompute=*/false);
  pmt::comm::barrier(world);
  Kokkos::View<double, Kokkos::HostSpace> peak("peak");
  peak() = pmt::obs::measured_fp32_peak_gflops() * 1e9;  // all ranks at once: their share of the node
  pmt::comm::all_reduce(world, Kokkos::DefaultHostExecutionSpace(), peak);
  // Ranks that share cores (more ranks x threads than a node has) time their products whenever the
  // scheduler gives them the cores, so a product's share of "peak / ranks" would mean nothing there.
  const bool cores_shared = pmt::plan::detail::compute_share(world, Exec().concurrency()) < 1.0;
  if (root) {
    std::printf(
        "pmt train_gpt: %d ranks = dp %d x tp %d x pp %d (%s%s, %d microbatches%s); GPT %d layers, width %d, %d heads, "
        "context %zu; batch %d; %d thread(s) per rank\n",
        world.size(), o.dp, o.tp, o.pp, o.schedule.c_str(),
        o.chunks > 1 ? pmt::detail::str(", ", o.chunks, " chunks per stage").c_str() : "", o.microbatches,
        pmt::detail::str(o.recompute ? ", activations recomputed per block" : "",
                         o.recompute_attention && !o.recompute ? ", attention recomputed" : "",
                         o.recompute_stages > 0 && (o.recompute || o.recompute_attention)
                             ? pmt::detail::str(" on stages < ", o.recompute_stages)
                             : std::string(),
                         model.sequence_parallel() ? ", sequence-parallel" : "")
            .c_str(),
        o.layers, o.width, o.heads, T, o.batch, Exec().concurrency());
    std::printf("data: %s, %zu bytes (%zu train, %zu validation)\n", data->path().c_str(), data->size(),
                data->train_size(), data->val_size());
    if (o.pp > 1) std::printf("stages: %s\n", model.plan().describe().c_str());
    std::printf("measured fp32 peak of all ranks: %.1f GFLOP/s (%s); %s\n", peak() / 1e9,
                pmt::obs::peak_isa_description().c_str(),
                pmt::ops::matmul_path() == pmt::ops::MatmulPath::Auto
                    ? "matmul auto: vendor BLAS or portable kernel, timed per shape class in the first step and agreed "
                      "over the ranks"
                    : pmt::ops::matmul_path_summary().c_str());
    if (o.precision == "bf16")
      std::printf(
          "precision: bf16 products (%s), fp32 parameters, gradients and optimizer state; MFU counts against the "
          "fp32 peak\n",
          pmt::ops::bf16_matmul_isa<Exec>());
  }
  std::FILE* metrics = nullptr;
  if (root && !o.metrics.empty()) {
    if (o.resume && start > 0) {
      // a resumed run continues the file: the saved run's lines up to its checkpoint stay (its
      // steps before `start`, its validations up to `start`), later ones (the steps it ran
      // past the checkpoint) go, so that no step appears twice
      std::ifstream in(o.metrics);
      std::string line, kept;
      std::size_t n_kept = 0, n_dropped = 0;
      while (std::getline(in, line)) {
        const auto at   = line.find("{\"step\": ");
        const long step = at == 0 ? std::atol(line.c_str() + 9) : -1;
        const bool keep =
            at == 0 && (step < start || (step == start && line.find("\"val_loss\"") != std::string::npos));
        (keep ? n_kept : n_dropped) += 1;
        if (keep) kept += line + "\n";
      }
      const std::string tmp = o.metrics + ".tmp";
      std::ofstream(tmp, std::ios::trunc) << kept;
      std::error_code ec;
      fs::rename(tmp, o.metrics, ec);
      if (n_dropped > 0)
        std::printf("metrics: %s keeps %zu lines up to step %d, dropped %zu after it\n", o.metrics.c_str(), n_kept,
                    start, n_dropped);
    }
    metrics = std::fopen(o.metrics.c_str(), o.resume && start > 0 ? "a" : "w");
    if (!metrics) throw pmt::IoError(prog, o.metrics + ": cannot be written");
  }
  const std::size_t B_local = static_cast<std::size_t>(o.batch / o.dp),
                    per     = B_local / static_cast<std::size_t>(o.microbatches);
  const std::size_t first   = B_local * static_cast<std::size_t>(mesh.coord(pmt::Axis::dp));
  std::vector<pmt::train::Microbatch<Ids>> mbs;
  for (int i = 0; i < o.microbatches; ++i) mbs.push_back({Ids("ids", per * T), Ids("targets", per * T), per, T});
  const auto fill = [&](auto&& source) {
    for (int i = 0; i < o.microbatches; ++i) {
      auto ids = Kokkos::create_mirror_view(mbs[i].ids), tgt = Kokkos::create_mirror_view(mbs[i].targets);
      source(first + static_cast<std::size_t>(i) * per, ids, tgt);
      Kokkos::deep_copy(mbs[i].ids, ids);
      Kokkos::deep_copy(mbs[i].targets, tgt);
    }
  };
  const auto validate_now = [&](int step) {
    double loss       = 0;
    const int batches = 4;
    for (int k = 0; k < batches; ++k) {
      fill([&](std::size_t f, auto& ids, auto& tgt) {
        data->val_batch(static_cast<std::size_t>(k * o.batch) + f, per, ids, tgt);
      });
      loss += trainer.evaluate(mbs, tokens * batches);
    }
    if (root) {
      std::printf("step %5d  validation loss %.4f\n", step, loss);
      if (metrics) std::fprintf(metrics, "{\"step\": %d, \"val_loss\": %.17g}\n", step, loss), std::fflush(metrics);
    }
  };
  const auto save = [&](int step) {
    pmt::io::CheckpointInfo info;
    info.step  = step;
    info.model = model_description(o);
    info.extra = {{"data_position", std::to_string(step)}, {"matmul_paths", pmt::encode_measured_choices()}};
    for (const auto& [key, value] : run_config(o, *data)) info.extra[key] = value;
    try {  // AdamW's or ZeRO-1's state: the same files
      const std::string where = pmt::io::save_checkpoint(o.ckpt_dir, mesh, opt, info, trainer.state());
      if (root) std::printf("checkpoint: %s\n", where.c_str());
    } catch (const pmt::IoError& e) {
      throw Agreed{e.what(), false};  // save_checkpoint raises on every rank
    }
    if (root && o.keep > 0) {
      const auto gone = pmt::io::prune_checkpoints(o.ckpt_dir, static_cast<std::size_t>(o.keep));
      for (const auto& g : gone)
        std::printf("checkpoint: removed %s/%s (--keep %d)\n", o.ckpt_dir.c_str(), g.c_str(), o.keep);
    }
    return step;
  };
  int saved_at = -1;  // the step of this run's last checkpoint
  if (!o.trace.empty()) pmt::TraceRecorder::instance().enable();
  double total_wall = 0, total_comm = 0;  // this rank's, over the steps: the straggler report
  const auto run_t0  = std::chrono::steady_clock::now();
  int skipped_in_row = 0;
  for (int step = start; step < o.steps; ++step) {
    if (guards.watchdog) guards.watchdog->set_step(step);
    fill([&](std::size_t f, auto& ids, auto& tgt) {
      data->train_batch(static_cast<std::uint64_t>(o.seed), step, f, per, ids, tgt);
    });
    const double lr = pmt::optim::warmup_cosine(step, o.warmup, o.steps, o.lr, o.lr / 10);
    const double c0 = pmt::comm::comm_time().seconds;
    const auto t0   = std::chrono::steady_clock::now();
    double loss     = 0;
    {
      const pmt::Instrument instrument("train_gpt::step", pmt::Track::Optimizer,
                                       [step] { return "step " + std::to_string(step); });
      loss = trainer.step(mbs, pmt::train::StepOptions{tokens, lr, 1.0, /*skip_nonfinite=*/true, /*step=*/step});
    }
    if (trainer.last_step_skipped()) {  // nan or inf: the update was not applied (on every rank alike)
      // which ranks hold non-finite gradients of their own
      Kokkos::View<double*, Kokkos::HostSpace> mine("mine", 1), all("all", static_cast<std::size_t>(world.size()));
      for (auto* p : model.parameters()) {
        auto g = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), p->grad);
        for (std::size_t i = 0; i < g.size() && mine(0) == 0; ++i) mine(0) = std::isfinite(g(i)) ? 0.0 : 1.0;
      }
      pmt::comm::all_gather(world, Kokkos::DefaultHostExecutionSpace(), mine, all);
      std::string ranks;
      for (int q = 0; q < world.size(); ++q)
        if (all(q) != 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(q);
      const std::string what =
          pmt::detail::str("step ", step, ": loss ", loss, ", gradient norm ", trainer.last_grad_norm(),
                           ranks.empty() ? std::string(" (no rank's own gradients hold nan or inf: the loss does)")
                                         : " (non-finite gradients on rank(s) " + ranks + ")");
      if (!o.skip_nonfinite || ++skipped_in_row >= 10) {
        throw Agreed{
            what + (o.skip_nonfinite ? "; 10 steps in a row were skipped" : "") +
                ": stopping; the update was not applied and nothing was saved" +
                (o.ckpt_dir.empty() ? std::string() : "; " + o.ckpt_dir + "/LATEST names the last good checkpoint"),
            true, exit_nonfinite};
      }
      if (root) std::printf("%s: update skipped (--on-nonfinite skip; %d in a row)\n", what.c_str(), skipped_in_row);
      if (metrics) std::fprintf(metrics, "{\"step\": %d, \"skipped\": true}\n", step), std::fflush(metrics);
      continue;
    }
    skipped_in_row = 0;
    const auto t1  = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(t1 - t0).count(), comm = pmt::comm::comm_time().seconds - c0;
    total_wall += s, total_comm += comm;
    if (root) {
      const double done = double(step + 1 - start) / double(o.steps - start);
      const double left = std::chrono::duration<double>(t1 - run_t0).count() * (1 - done) / done;
      std::printf(
          "step %5d/%d  loss %.4f  lr %.2e  %7.0f tok/s  MFU %4.1f%% (%s)  comm %4.1f%%  [%3.0f%%, %dm%02ds left]\n",
          step, o.steps, loss, lr, tokens / s, 100.0 * flops / s / peak(),
          o.precision == "bf16" ? pmt::detail::str("bf16 ", pmt::ops::bf16_matmul_isa<Exec>()).c_str()
                                : pmt::ops::matmul_path_label().c_str(),
          100.0 * comm / s, 100.0 * done, int(left) / 60, int(left) % 60);
      if (step == start && pmt::ops::matmul_path() == pmt::ops::MatmulPath::Auto)
        std::printf("%s%s\n", pmt::ops::matmul_path_summary(cores_shared ? 0.0 : peak() / 1e9 / world.size()).c_str(),
                    cores_shared ? " (ranks share cores: no share of peak)" : "");
      std::fflush(stdout);
      if (metrics)
        std::fprintf(metrics,
                     "{\"step\": %d, \"loss\": %.17g, \"lr\": %.9g, \"grad_norm\": %.9g, \"seconds\": %.6f, "
                     "\"tokens_per_s\": %.1f, \"mfu\": %.5f, \"comm_fraction\": %.5f}\n",
                     step, loss, lr, trainer.last_grad_norm(), s, tokens / s, flops / s / peak(), comm / s);
      if (metrics) std::fflush(metrics);
    }
    if (o.val_every > 0 && (step + 1) % o.val_every == 0 && step + 1 < o.steps) validate_now(step + 1);
    if (!o.ckpt_dir.empty() && o.ckpt_every > 0 && (step + 1) % o.ckpt_every == 0) saved_at = save(step + 1);
    if (const int sig = pmt::run::agree_stop(world)) {  // preemption: all ranks stop at this step boundary
      if (!o.ckpt_dir.empty() && saved_at != step + 1) saved_at = save(step + 1);
      if (root) {
        std::printf(
            "stopped by %s after step %d: %s\n", pmt::run::signal_name(sig), step,
            o.ckpt_dir.empty()
                ? "no --ckpt-dir, nothing saved"
                : ("saved " + pmt::io::checkpoint_step_dir(o.ckpt_dir, saved_at) + "; --resume continues it").c_str());
        std::fflush(stdout);
      }
      if (metrics) std::fclose(metrics);
      return exit_preempted;
    }
  }
  pmt::TraceRecorder::instance().enable(false);
  // the trained model first: validation and the final checkpoint, then the trace and reports
  validate_now(o.steps);
  if (!o.ckpt_dir.empty() && saved_at != o.steps && start < o.steps) saved_at = save(o.steps);
  if (!o.trace.empty()) {
    pmt::obs::write_trace(mesh, o.trace);
    if (root) std::printf("trace: %s\n", o.trace.c_str());
  }
  {  // straggler and imbalance report, with each rank's peak memory
    const double peak_bytes = static_cast<double>(memory.peak_bytes());
    Kokkos::View<double*, Kokkos::HostSpace> mine("mine", 3), all("all", 3 * static_cast<std::size_t>(world.size()));
    mine(0) = total_wall - total_comm, mine(1) = total_comm, mine(2) = peak_bytes;
    pmt::comm::all_gather(world, Kokkos::DefaultHostExecutionSpace(), mine, all);
    if (root && start < o.steps) {
      double slowest = 0, mean = 0;
      for (int q = 0; q < world.size(); ++q) slowest = std::max(slowest, all(3 * q)), mean += all(3 * q) / world.size();
      std::printf(
          "per-rank time over %d steps (compute = step time outside communication calls; comm = inside them,\n"
          "waiting included; idle = the slowest rank's compute minus this rank's) and peak memory (Kokkos\n"
          "allocations: parameters, gradients, optimizer state, activations, buffers):\n",
          o.steps - start);
      std::printf("  rank  %-26s %10s %10s %10s %10s\n", "dp / tp / pp", "compute s", "comm s", "idle s", "peak MiB");
      for (int q = 0; q < world.size(); ++q) {
        const int tp_i = q % o.tp, dp_i = q / o.tp % o.dp, pp_i = q / (o.tp * o.dp);
        const std::string peak = o.memory_report ? pmt::detail::str(std::round(all(3 * q + 2) / 10485.76) / 100) : "-";
        std::printf("  %4d  dp %d/%d, tp %d/%d, pp %d/%d%*s %10.2f %10.2f %10.2f %10s%s\n", q, dp_i, o.dp, tp_i, o.tp,
                    pp_i, o.pp, 4, "", all(3 * q), all(3 * q + 1), slowest - all(3 * q), peak.c_str(),
                    all(3 * q) == slowest && world.size() > 1 ? "  <- slowest" : "");
      }
      std::printf("imbalance (slowest / mean compute): %.3f\n", mean > 0 ? slowest / mean : 1.0);
      if (o.dp > 1)
        std::printf(
            "dp communication: %.2f MiB handed to dp all-reduces by rank 0 over %d steps (%s)\n",
            double(trainer.dp_bytes_sent()) / 1048576.0, o.steps - start,
            o.diloco > 0      ? pmt::detail::str("DiLoCo: parameters averaged every ", o.diloco, " steps").c_str()
            : o.local_sgd > 0 ? pmt::detail::str("local SGD: parameters averaged every ", o.local_sgd, " steps").c_str()
            : o.staleness >= 0
                ? pmt::detail::str("gradients every step, fp32, applied ", o.staleness, " steps late").c_str()
            : o.zero
                ? pmt::detail::str("ZeRO-", o.zero_stage, " reduce-scatters and all-gathers itself: not counted")
                      .c_str()
                : pmt::detail::str("gradients every step, ", o.compress == "bf16" ? "bf16 with error feedback" : "fp32")
                      .c_str());
      if (metrics)
        std::fprintf(metrics, "{\"dp_bytes_sent\": %llu}\n", static_cast<unsigned long long>(trainer.dp_bytes_sent()));
      if (metrics && o.memory_report) {
        std::string list;
        for (int q = 0; q < world.size(); ++q)
          list += (q ? ", " : "") + std::to_string(static_cast<long long>(all(3 * q + 2)));
        std::fprintf(metrics, "{\"peak_memory_bytes\": [%s]}\n", list.c_str());
      }
    }
  }
  if (metrics) std::fclose(metrics);
  // A sample: 160 bytes after a prompt from the validation text, temperature 0.8, seeded.
  {
    std::string prompt;
    {
      Ids ids("p", T), tgt("t", T);
      auto hi = Kokkos::create_mirror_view(ids), ht = Kokkos::create_mirror_view(tgt);
      data->val_batch(0, 1, hi, ht);
      for (std::size_t t = 0; t < std::min<std::size_t>(T / 2, 24); ++t) prompt += static_cast<char>(hi(t));
    }
    std::string text = prompt;
    const auto& pp   = mesh.comm(pmt::Axis::pp);
    const int s = model.stage(), P = model.stages();
    for (int g = 0; g < 160; ++g) {
      const std::size_t n = std::min<std::size_t>(text.size(), T);
      Ids ids("gen::ids", n);
      auto hi = Kokkos::create_mirror_view(ids);
      for (std::size_t t = 0; t < n; ++t) hi(t) = static_cast<unsigned char>(text[text.size() - n + t]);
      Kokkos::deep_copy(ids, hi);
      // the chunks in virtual-stage order, round the ring of stages (one pass with one chunk)
      Model::Activation out;
      for (int k = 0; k < model.chunks(); ++k) {
        Model::Activation x;
        if (!model.first_chunk(k)) {
          x = Model::Activation("gen::x", n, static_cast<std::size_t>(o.width));
          pmt::comm::recv(pp, Exec(), x, (s + P - 1) % P, 21);
        }
        out = model.infer_chunk(Exec(), k, ids, x, 1, n);
        if (!model.last_chunk(k)) pmt::comm::send(pp, Exec(), out, (s + 1) % P, 21);
      }
      Kokkos::View<std::int32_t*, Kokkos::HostSpace> next("gen::next", 1);
      if (s + 1 == P) {  // the last row's logits, gathered over tp, sampled alike on every tp rank
        const std::size_t vl = out.extent(1);
        Kokkos::View<float*, Kokkos::HostSpace> mine("gen::mine", vl),
            all("gen::all", vl * static_cast<std::size_t>(o.tp));
        auto ho = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
        for (std::size_t v = 0; v < vl; ++v) mine(v) = ho(n - 1, v);
        pmt::comm::all_gather(mesh.comm(pmt::Axis::tp), Kokkos::DefaultHostExecutionSpace(), mine, all);
        double mx = -1e300, z = 0;
        for (std::size_t v = 0; v < all.size(); ++v) mx = std::max(mx, double(all(v)) / 0.8);
        std::vector<double> prob(all.size());
        for (std::size_t v = 0; v < all.size(); ++v) z += prob[v] = std::exp(double(all(v)) / 0.8 - mx);
        double u =
            pmt::random_uniform(pmt::RngKey{static_cast<std::uint64_t>(o.seed), 4242}, static_cast<std::uint64_t>(g)) *
            z;
        std::size_t v = 0;
        while (v + 1 < all.size() && (u -= prob[v]) > 0) ++v;
        next(0) = static_cast<std::int32_t>(v);
      }
      if (P > 1) pmt::comm::broadcast(pp, Kokkos::DefaultHostExecutionSpace(), next, P - 1);
      text += static_cast<char>(next(0));
    }
    if (root) {
      std::string shown;
      for (char ch : text) shown += (ch == '\n' || (ch >= 32 && ch < 127)) ? ch : '?';
      std::printf("sample (prompt \"%s\", temperature 0.8):\n%s\n", prompt.c_str(), shown.c_str());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char* argv[]) {
  Options o;
  std::string parse_error;
  try {
    o = parse(argc, argv);
  } catch (const pmt::Error& e) {
    parse_error = e.what();
  }
  if (o.help && parse_error.empty()) {
    if (is_world_root_env()) std::fputs(usage().c_str(), stdout);
    return 0;
  }
  std::string threads_note;
  // The OpenMP runtime read OMP_NUM_THREADS when it was loaded: a count chosen here goes to it
  // directly (omp_set_num_threads, which Kokkos and an OpenMP BLAS follow) and to the environment
  const auto set_threads = [](int n) {
    setenv("OMP_NUM_THREADS", std::to_string(n).c_str(), 1);
#if defined(_OPENMP)
    omp_set_num_threads(n);
#endif
  };
  if (o.threads > 0) {
    set_threads(o.threads);  // the user's explicit choice
  } else if (std::getenv("OMP_NUM_THREADS") == nullptr && local_ranks_env() > 1) {
    // ranks sharing a node's cores, each with every core's worth of threads, would thrash: give
    // each its share (a rank bound to fewer cores than the node has: those cores)
    cpu_set_t set;
    const int online = static_cast<int>(std::thread::hardware_concurrency());
    const int mine   = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : online;
    const int ranks  = local_ranks_env();
    const int n      = mine < online ? std::max(1, mine) : std::max(1, online / ranks);
    set_threads(n);
    threads_note = pmt::detail::str("threads: ", n, " per rank (OMP_NUM_THREADS unset: ",
                                    mine < online ? pmt::detail::str("the ", mine, " core(s) this rank is bound to")
                                                  : pmt::detail::str(online, " cores / ", ranks, " ranks on this node"),
                                    "; --threads N sets it)");
  }
  if (!o.matmul.empty()) pmt::ops::set_matmul_path(pmt::ops::parse_matmul_path(o.matmul, "--matmul"));
  // Kokkos sees its own flags only (it would take --threads N for its own, deprecated, flag)
  std::vector<char*> kokkos_argv{argv[0]};
  for (auto& k : o.kokkos_args) kokkos_argv.push_back(&k[0]);
  kokkos_argv.push_back(nullptr);
  int kokkos_argc      = static_cast<int>(kokkos_argv.size()) - 1;
  char** kokkos_argv_p = kokkos_argv.data();
  pmt::ScopeGuard guard(kokkos_argc, kokkos_argv_p);
  const bool root = pmt::world_rank() == 0;
  try {
#if PMT_ENABLE_MPI
    pmt::comm::Communicator<Backend> world(MPI_COMM_WORLD);
#else
    pmt::comm::Communicator<Backend> world;
#endif
    agree_command_line(world, argc, argv);  // first: ranks with other flags would mismatch later
    if (!parse_error.empty()) throw Agreed{parse_error};
    pmt::run::install_stop_handlers();
    if (root && !threads_note.empty()) std::printf("%s\n", threads_note.c_str());
    std::unique_ptr<pmt::io::TokenDataset> data;
    std::unique_ptr<Guards> guards;
    try {
      pmt::ops::matmul_path();  // a bad PMT_MATMUL fails here, alike on every rank
      validate_outputs(o);
    } catch (const pmt::Error& e) {
      throw Agreed{e.what()};
    }
    guards = preflight(o, world);  // the outputs, before anything long
    try {
      if (o.auto_plan) choose_layout(o, world);
      validate(o, world.size());
      data = std::make_unique<pmt::io::TokenDataset>(o.data, static_cast<std::size_t>(o.context));
    } catch (const pmt::Error& e) {
      throw Agreed{e.what()};
    }
    if (o.zero && o.zero_stage == 2) return run<Zero2, pmt::Synchronous>(o, world, data, *guards);
    if (o.zero) return run<Zero, pmt::Synchronous>(o, world, data, *guards);
    if (o.local_sgd > 0) return run<AdamW, pmt::LocalSgd<>>(o, world, data, *guards);
    if (o.diloco > 0) return run<AdamW, pmt::DiLoCo<>>(o, world, data, *guards);
    if (o.staleness >= 0) return run<AdamW, pmt::BoundedStaleness<>>(o, world, data, *guards);
    return run<AdamW, pmt::Synchronous>(o, world, data, *guards);
  } catch (const Agreed& e) {
    if (root || (!e.alike && e.message.find("other rank(s)") == std::string::npos))
      std::fprintf(stderr, "%s: error: %s\n", prog, own(e.message).c_str());
    return e.code;
  } catch (const std::exception& e) {
    // Only this rank may have failed: report it and end the whole job rather than leave the
    // others waiting in a collective.
    if (!root) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::fprintf(stderr, "%s: error: %s\n", prog, own(e.what()).c_str());
#if PMT_ENABLE_MPI
    if (pmt::world_size() > 1) MPI_Abort(MPI_COMM_WORLD, 1);
#endif
    return 1;
  }
}
