// SPDX-License-Identifier: Apache-2.0
#pragma once
// train_gpt's flags: each declared once through CLI11 (pmt/run/cli.hpp: type, range, help and
// default from one declaration), then checked against each other and, for the layout, by the planner's rules
// (pmt::plan::why_invalid). The model's vocabulary is the dataset's (pmt::io::TokenDataset).

#include <pmt/run.hpp>
#include <pmt/run/cli.hpp>
#include <pmt/tools.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#ifndef PMT_DEFAULT_DATA_DIR
#define PMT_DEFAULT_DATA_DIR "docs"
#endif

namespace train_gpt {

constexpr const char* prog = "train_gpt";

struct Options {
  int dp = 0, tp = 1, pp = 1, chunks = 1, microbatches = 0, layers = 4, width = 128, heads = 4, context = 64, batch = 8;
  int steps = 100, warmup = 10, val_every = 50, ckpt_every = 0, threads = 0, keep = 0;
  double lr = 3e-3, watchdog = 600;
  long seed   = 1;
  bool resume = false, zero = false, zero2 = false, zero3 = false, auto_plan = false, no_memory_report = false;
  int zero_stage = 1;                // with zero: 1 (optimizer state sharded), 2 (gradients too) or 3 (parameters too)
  int shard_size = 0, prefetch = 1;  // ZeRO-3: the dp ranks a parameter is cut over (0: all), units gathered ahead
  bool overwrite = false, allow_changed_config = false, skip_nonfinite = false, recompute = false;
  bool sequence_parallel = false, recompute_attention = false, async_save = true;
  int recompute_stages = 0;  // with --recompute or --recompute-attention: the first this many stages (0: all)
  std::vector<std::string> layout_flags;  // --dp, --tp, ... as given (--auto chooses them)
  std::string schedule = "1f1b", data = PMT_DEFAULT_DATA_DIR, ckpt_dir, metrics, trace, matmul;
  std::string compress     = "none";  // dp gradients on the wire: none or bf16 (error feedback)
  std::string precision    = "fp32";  // the model's products: fp32, or bf16 operands with fp32 sums
  std::string on_nonfinite = "stop";
  std::string device = "default", comm = "auto";  // where ranks compute, how they talk (pmt/run/placement.hpp)
  int local_sgd = 0, diloco = 0;  // a period: parameters averaged (and DiLoCo's outer step) every so many steps
  int staleness   = -1;           // >= 0: bounded staleness, gradient sums applied this many steps late
  double outer_lr = 0.7, outer_momentum = 0.9;
  bool outer_given = false;
  bool memory_report() const { return !no_memory_report; }
};

// --- the declarations -------------------------------------------------------------------------

using pmt::run::integer;
using pmt::run::number;
using pmt::run::one_of;
using pmt::run::option;
using pmt::run::parsed_by;

inline void declare_layout(CLI::App& app, Options& o) {
  const std::string g = "Layout (the planner's rules check it)";
  option(app, g, "--dp", o.dp, "data-parallel degree (default: ranks / (tp pp))", integer("--dp", 1));
  option(app, g, "--tp", o.tp, "tensor-parallel degree", integer("--tp", 1))->capture_default_str();
  option(app, g, "--pp", o.pp, "pipeline stages", integer("--pp", 1))->capture_default_str();
  option(app, g, "--schedule", o.schedule, "pipeline schedule: 1f1b or gpipe", one_of("--schedule", {"1f1b", "gpipe"}))
      ->capture_default_str();
  option(app, g, "--chunks", o.chunks,
         "model chunks per stage; with 1f1b, V > 1 runs interleaved 1F1B (bubble / V; microbatches a multiple of pp)",
         integer("--chunks", 1))
      ->capture_default_str();
  option(app, g, "--microbatches", o.microbatches,
         "microbatches per step and dp rank (default 2 pp with pp > 1, else 1); must divide batch / dp",
         integer("--microbatches", 1));
  app.add_flag("--zero", o.zero, "ZeRO-1: AdamW's state sharded over dp")->group(g);
  app.add_flag("--zero2", o.zero2, "ZeRO-2: AdamW's state and the gradients sharded over dp")->group(g);
  app.add_flag("--zero3", o.zero3,
               "ZeRO-3 (FSDP): the parameters sharded over dp too, each block's gathered while it computes")
      ->group(g);
  option(app, g, "--shard-size", o.shard_size,
         "with --zero3: shard over groups of this many dp ranks and replicate across them (HSDP; default: all of dp)",
         integer("--shard-size", 1));
  option(app, g, "--prefetch", o.prefetch,
         "with --zero3: blocks whose gather starts ahead of their use (0: each gathered when it is needed)",
         integer("--prefetch", 0))
      ->capture_default_str();
  option(app, g, "--compress", o.compress, "dp gradients sent as bf16 with error feedback (half the bytes), or not",
         one_of("--compress", {"none", "bf16"}))
      ->capture_default_str();
  option(app, g, "--local-sgd", o.local_sgd,
         "no gradient all-reduce: each dp replica trains on its own data, parameters averaged every H steps",
         integer("--local-sgd", 1));
  option(app, g, "--diloco", o.diloco,
         "DiLoCo: as --local-sgd H, then an outer Nesterov SGD step on the averaged change", integer("--diloco", 1));
  option(app, g, "--outer-lr", o.outer_lr, "DiLoCo's outer learning rate",
         number(
             "--outer-lr", [](double x) { return x > 0; }, "expected a positive number"))
      ->capture_default_str();
  option(app, g, "--outer-momentum", o.outer_momentum, "DiLoCo's outer Nesterov momentum",
         number(
             "--outer-momentum", [](double x) { return x >= 0 && x < 1; }, "expected 0 <= X < 1"))
      ->capture_default_str();
  option(app, g, "--staleness", o.staleness,
         "asynchronous dp: each step applies the gradient sum started S steps before (0: synchronous)",
         integer("--staleness", 0));
  app.add_flag("--recompute", o.recompute, "activation recomputation per block (about a third more compute)")->group(g);
  option(app, g, "--recompute-stages", o.recompute_stages,
         "only the first K pipeline stages recompute (default every stage)", integer("--recompute-stages", 1));
  app.add_flag("--recompute-attention", o.recompute_attention,
               "selective recomputation: blocks keep q, k, v, not the attention's T x T matrices")
      ->group(g);
  app.add_flag("--sequence-parallel", o.sequence_parallel,
               "with tp > 1: norms and residuals hold 1 / tp of the tokens each (less activation memory)")
      ->group(g);
  app.add_flag("--auto", o.auto_plan,
               "let the planner choose all of the above: it calibrates on the ranks, predicts every layout "
               "(pmt-plan prints the same table) and runs the best")
      ->group(g);
}

inline void declare_model_and_training(CLI::App& app, Options& o) {
  const std::string m = "Model (byte-level: vocabulary 256)";
  option(app, m, "--layers", o.layers, "transformer blocks", integer("--layers", 1))->capture_default_str();
  option(app, m, "--width", o.width, "model width", integer("--width", 1))->capture_default_str();
  option(app, m, "--heads", o.heads, "attention heads", integer("--heads", 1))->capture_default_str();
  option(app, m, "--context", o.context, "tokens per sequence", integer("--context", 1))->capture_default_str();
  const std::string t = "Training";
  option(app, t, "--batch", o.batch, "sequences per step, over all dp ranks", integer("--batch", 1))
      ->capture_default_str();
  option(app, t, "--steps", o.steps, "optimizer steps", integer("--steps", 1))->capture_default_str();
  option(app, t, "--lr", o.lr, "peak learning rate (warmup, then cosine to a tenth)",
         number(
             "--lr", [](double x) { return x > 0; }, "expected a positive number"))
      ->capture_default_str();
  option(app, t, "--warmup", o.warmup, "warmup steps", integer("--warmup", 0))->capture_default_str();
  option(app, t, "--seed", o.seed, "the model's and the data's seed", integer("--seed", 0))->capture_default_str();
  option(app, t, "--threads", o.threads,
         "OpenMP threads per rank (default: OMP_NUM_THREADS; when it is unset and several ranks share a node: "
         "its cores / its ranks; a count that would oversubscribe the node is capped to that, unless "
         "PMT_OVERSUBSCRIBE=1)",
         [](const std::string& v) {
           const std::string bad = integer("--threads", 1, pmt::run::max_threads())(v);
           return bad.empty()
                      ? bad
                      : bad + " (4 per core; this node has " + std::to_string(pmt::run::max_threads() / 4) + " cores)";
         });
  option(app, t, "--on-nonfinite", o.on_nonfinite,
         "a nan or inf loss or gradient norm stops the run (exit 3), or skips that step's update (10 in a row stop "
         "it)",
         one_of("--on-nonfinite", {"stop", "skip"}))
      ->capture_default_str();
  option(app, t, "--watchdog", o.watchdog,
         "end the job when one communication call waits longer, naming the ranks that never arrived (exit 4; 0: off)",
         number(
             "--watchdog", [](double x) { return x >= 0; }, "expected seconds >= 0 (0: off)"))
      ->capture_default_str();
  option(app, t, "--precision", o.precision,
         "the model's products: fp32, or bf16 mixed precision (bf16 operands, fp32 sums, parameters and state)",
         parsed_by([](const std::string& v) { pmt::parse_precision(v, "--precision"); }))
      ->capture_default_str();
  option(app, t, "--device", o.device,
         "where each rank computes: default (Kokkos' default space: a GPU per rank when Kokkos has CUDA) or host",
         one_of("--device", {"default", "host"}))
      ->capture_default_str();
  option(app, t, "--comm", o.comm,
         "how ranks talk: auto (NCCL between GPU ranks when built with it, MPI between host ranks), mpi or nccl",
         one_of("--comm", {"auto", "mpi", "nccl"}))
      ->capture_default_str();
  option(app, t, "--matmul", o.matmul,
         "the matmul path: auto (default, or PMT_MATMUL) times the vendor BLAS and pmt's kernel per shape class and "
         "keeps the faster; vendor or portable pins one",
         parsed_by([](const std::string& v) { pmt::ops::parse_matmul_path(v, "--matmul"); }));
}

inline void declare_data_and_outputs(CLI::App& app, Options& o) {
  const std::string d = "Data";
  option(app, d, "--data", o.data,
         std::string("a text file, or a directory whose .md files are concatenated (default: ") + PMT_DEFAULT_DATA_DIR +
             ", the project's documentation); the first 90 % trains, the rest validates")
      ->type_name("PATH");
  option(app, d, "--val-every", o.val_every, "validation loss every N steps (0: only at the end)",
         integer("--val-every", 0))
      ->capture_default_str();
  const std::string c = "Checkpoints";
  option(app, c, "--ckpt-dir", o.ckpt_dir, "where to save sharded checkpoints (DIR/step-N, DIR/LATEST)",
         [](const std::string& v) { return v.empty() ? "--ckpt-dir needs a directory, not an empty word" : ""; })
      ->type_name("DIR");
  option(app, c, "--ckpt-every", o.ckpt_every, "save every N steps (0: only at the end, when --ckpt-dir is given)",
         integer("--ckpt-every", 0));
  app.add_flag("--resume", o.resume,
               "continue from DIR/LATEST (any layout of the same model), or the newest checkpoint that verifies")
      ->group(c);
  app.add_flag("--overwrite", o.overwrite, "a fresh run into a DIR holding checkpoints removes them (else refused)")
      ->group(c);
  app.add_flag("--allow-changed-config", o.allow_changed_config,
               "resume although --seed, --data, --lr, --warmup or --steps differ from the saved run's")
      ->group(c);
  option(app, c, "--keep", o.keep, "keep the newest N checkpoints (default: all)", integer("--keep", 1));
  app.add_flag("--async-save,!--no-async-save", o.async_save,
               "write checkpoints in the background: a save holds the step only while it copies the state to host "
               "memory (default); --no-async-save writes them before the next step")
      ->group(c);
  const std::string out = "Output";
  option(app, out, "--metrics", o.metrics, "JSON lines: every step's and validation's figures")->type_name("FILE");
  app.add_flag("--no-memory-report", o.no_memory_report,
               "leave out the peak memory per rank (counting Kokkos' allocations costs about 3 % of a small step)")
      ->group(out);
  option(app, out, "--trace", o.trace, "Chrome trace (Perfetto) of every rank (docs/plot.py draws it)")
      ->type_name("FILE");
}

inline const char* help_footer() {
  return "One run writes --ckpt-dir at a time (DIR/LOCK). SIGTERM, SIGINT or SIGUSR1 to any rank (or SIGUSR1 to\n"
         "mpiexec, which forwards it) stops all ranks at the next step with a checkpoint (exit 75).\n"
         "Each step prints: loss, learning rate, tokens/s, MFU (model FLOPs / the measured fp32 FMA peak of\n"
         "all ranks), the share of rank 0's step spent in communication, and progress; the run ends with\n"
         "validation, a per-rank compute / communication / idle report and a generated sample.\n"
         "Kokkos' own flags (--kokkos-help lists them) go to Kokkos.";
}

// --- parsing ------------------------------------------------------------------------------------

/// A command line, parsed: the options, or the error to report once the ranks agree.
struct Parsed {
  Options options;
  std::string error;  ///< empty when the flags are good
  std::string help;   ///< --help: the text to print (and nothing else to do)
};

/// The flags of `args` (the words after the program's name; Kokkos' own taken out already).
inline Parsed parse(std::vector<std::string> args) {
  Parsed p;
  Options& o = p.options;
  CLI::App app("trains a byte-level GPT on a text file with any dp x tp x pp layout of the MPI ranks", prog);
  app.footer(help_footer());
  declare_layout(app, o);
  declare_model_and_training(app, o);
  declare_data_and_outputs(app, o);
  const auto flags = pmt::run::parse_flags(app, std::move(args));
  p.error = flags.error, p.help = flags.help;
  if (!p.error.empty() || !p.help.empty()) return p;
  for (const char* f : {"--dp", "--tp", "--pp", "--chunks", "--microbatches", "--schedule", "--zero", "--zero2",
                        "--zero3", "--shard-size", "--prefetch"})
    if (app.count(f) > 0) o.layout_flags.push_back(f);
  if (o.zero + o.zero2 + o.zero3 > 1) {
    p.error = "--zero, --zero2 and --zero3 are three ZeRO stages: give one";
    return p;
  }
  if ((app.count("--shard-size") + app.count("--prefetch") > 0) && !o.zero3) {
    p.error = "--shard-size and --prefetch set ZeRO-3's sharding: they need --zero3";
    return p;
  }
  o.zero           = o.zero || o.zero2 || o.zero3;
  o.zero_stage     = o.zero3 ? 3 : o.zero2 ? 2 : 1;
  o.skip_nonfinite = o.on_nonfinite == "skip";
  o.outer_given    = app.count("--outer-lr") + app.count("--outer-momentum") > 0;
  return p;
}

// --- what the flags describe ------------------------------------------------------------------

/// The checkpoint's description of the model (load refuses another).
inline std::string model_description(const Options& o) {
  return pmt::detail::str("gpt vocab=", pmt::io::TokenDataset::vocab_size, " context=", o.context, " layers=", o.layers,
                          " width=", o.width, " heads=", o.heads);
}

/// The model the flags describe; its vocabulary is the dataset's.
inline pmt::nn::GptConfig gpt_config(const Options& o) {
  return {pmt::io::TokenDataset::vocab_size, static_cast<std::size_t>(o.context), static_cast<std::size_t>(o.layers),
          static_cast<std::size_t>(o.width), static_cast<std::size_t>(o.heads),   static_cast<std::uint64_t>(o.seed)};
}

/// The planner's problem: this model, this batch, this precision.
inline pmt::plan::Problem problem_of(const Options& o) {
  pmt::plan::Problem problem;
  problem.model     = gpt_config(o);
  problem.batch     = static_cast<std::size_t>(o.batch);
  problem.precision = pmt::parse_precision(o.precision);
  return problem;
}

/// The data-parallel mode the flags name, as the planner states it.
inline pmt::plan::DpChoice dp_choice(const Options& o) {
  using M = pmt::plan::DpMode;
  return o.local_sgd > 0        ? pmt::plan::DpChoice{M::LocalSgd, o.local_sgd}
         : o.diloco > 0         ? pmt::plan::DpChoice{M::DiLoCo, o.diloco}
         : o.staleness >= 0     ? pmt::plan::DpChoice{M::Stale, o.staleness}
         : o.compress == "bf16" ? pmt::plan::DpChoice{M::Bf16, 0}
                                : pmt::plan::DpChoice{};
}

/// The layout the flags describe, as the planner states layouts.
inline pmt::plan::Layout layout_of(const Options& o) {
  pmt::plan::Layout l;
  l.dp = o.dp, l.tp = o.tp, l.pp = o.pp, l.microbatches = o.microbatches, l.chunks = o.chunks;
  l.schedule   = o.schedule == "gpipe" ? pmt::parallel::ScheduleKind::GPipe : pmt::parallel::ScheduleKind::OneFOneB;
  l.zero       = o.zero ? o.zero_stage : 0;
  l.shard_size = o.zero_stage == 3 ? o.shard_size : 0;
  l.prefetch   = o.prefetch;
  l.recompute  = o.recompute;
  l.recompute_attention = o.recompute_attention && !o.recompute;  // the whole block recomputes it anyway
  l.recompute_stages    = o.recompute_stages;
  l.sequence_parallel   = o.sequence_parallel && o.tp > 1;  // with tp 1 there is nothing to split
  if (o.dp > 1) l.sync = dp_choice(o);                      // one replica: a dp mode changes nothing
  return l;
}

/// The data-parallel mode's words in the checkpoint (a resumed run must share them).
inline std::string dp_mode_record(const Options& o) {
  return o.diloco > 0       ? pmt::detail::str("diloco:", o.diloco, ":", o.outer_lr, ":", o.outer_momentum)
         : o.local_sgd > 0  ? pmt::detail::str("local-sgd:", o.local_sgd)
         : o.staleness >= 0 ? pmt::detail::str("stale:", o.staleness)
                            : "sync:" + o.compress;
}

/// The run's configuration as a checkpoint records it: what a resumed run must share with the
/// saved one for its losses to continue the saved run's.
inline std::vector<std::pair<std::string, std::string>> run_config(const Options& o,
                                                                   const pmt::io::TokenDataset& data) {
  char lr[32], hash[32];
  std::snprintf(lr, sizeof lr, "%.17g", o.lr);
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(data.fingerprint()));
  return {{"seed", std::to_string(o.seed)},
          {"data", std::to_string(data.size()) + ":" + hash},
          {"lr", lr},
          {"warmup", std::to_string(o.warmup)},
          {"steps", std::to_string(o.steps)},
          {"precision", o.precision},
          {"dp_mode", dp_mode_record(o)}};
}

// --- checks -----------------------------------------------------------------------------------

/// dp from the ranks when not given; the default microbatches.
inline void resolve_degrees(Options& o, int ranks) {
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
}

/// The data-parallel flags against each other.
inline void check_dp_modes(const Options& o) {
  using pmt::detail::str;
  if ((o.local_sgd > 0) + (o.diloco > 0) + (o.staleness >= 0) > 1)
    throw pmt::ConfigError(prog, "--local-sgd, --diloco and --staleness are three data-parallel modes: give one");
  if (o.staleness >= 0 && (o.zero || o.compress != "none"))
    throw pmt::ConfigError(prog, str("--staleness applies whole fp32 gradient sums late; it does not combine with ",
                                     o.zero ? "--zero" : "--compress"));
  if ((o.local_sgd > 0 || o.diloco > 0) && o.zero)
    throw pmt::ConfigError(prog, str(o.diloco > 0 ? "--diloco" : "--local-sgd",
                                     " keeps replicas apart between averages; --zero needs synchronous gradients"));
  if (o.compress != "none" && (o.local_sgd > 0 || o.diloco > 0 || o.zero))
    throw pmt::ConfigError(prog,
                           str("--compress ", o.compress, " compresses the synchronous gradient all-reduce; ",
                               o.zero ? "--zero reduce-scatters instead" : "this run does not all-reduce gradients"));
  if (o.outer_given && o.diloco == 0)
    throw pmt::ConfigError(prog, "--outer-lr and --outer-momentum set DiLoCo's outer step: they need --diloco H");
}

/// Checks what needs no communication; every rank reaches the same verdict. The layout's rules
/// are the planner's (pmt::plan::why_invalid); what is checked here is the flags' own.
inline void validate(Options& o, int ranks) {
  resolve_degrees(o, ranks);
  check_dp_modes(o);
  const pmt::plan::Layout layout = layout_of(o);
  if (const std::string why = pmt::plan::why_invalid(problem_of(o), layout, ranks); !why.empty())
    throw pmt::ConfigError(prog, pmt::detail::str("the layout ", layout.describe(), " cannot train this model (",
                                                  model_description(o), "): ", why));
}

/// Checks the checkpoint and output flags (before the preflight acts on them).
inline void validate_outputs(const Options& o) {
  if (o.resume && o.ckpt_dir.empty()) throw pmt::ConfigError(prog, "--resume needs --ckpt-dir");
  if (o.ckpt_every > 0 && o.ckpt_dir.empty())
    throw pmt::ConfigError(prog, "--ckpt-every " + std::to_string(o.ckpt_every) + " needs --ckpt-dir (where to save)");
  if (o.keep > 0 && o.ckpt_dir.empty()) throw pmt::ConfigError(prog, "--keep needs --ckpt-dir");
  if (o.overwrite && o.ckpt_dir.empty()) throw pmt::ConfigError(prog, "--overwrite needs --ckpt-dir");
  if (o.overwrite && o.resume)
    throw pmt::ConfigError(prog, "--overwrite starts afresh and --resume continues: give one");
}

/// --auto: the planner's best layout for this model on these ranks (collective: it calibrates on
/// the space and over the backend --device and --comm name).
template <class Comm>
void choose_layout(Options& o, const Comm& world) {
  if (!o.layout_flags.empty()) {
    std::string given;
    for (const auto& f : o.layout_flags) given += " " + f;
    throw pmt::ConfigError(prog, "--auto chooses the layout; drop" + given);
  }
  const auto problem = problem_of(o);  // calibrated in the run's precision, where the run computes
  const auto machine = pmt::run::with_placement(prog, o.device, o.comm, [&](auto exec, auto backend) {
    using Exec = typename decltype(exec)::type;
    return pmt::plan::calibrate(pmt::run::communicator_for<typename decltype(backend)::type>(world), problem,
                                pmt::plan::CalibrateOptions{}, Exec());
  });
  const auto plan    = pmt::plan::search(problem, machine, pmt::plan::SearchOptions{});
  if (pmt::world_rank() == 0 && !plan.machine.advice.empty())
    std::printf("--auto: note: %s\n", plan.machine.advice.c_str());
  const auto& b = plan.best().layout;  // raises, with the rejections, when nothing runs
  o.dp = b.dp, o.tp = b.tp, o.pp = b.pp, o.microbatches = b.microbatches, o.zero = b.zero > 0, o.chunks = b.chunks;
  o.zero_stage = b.zero > 0 ? b.zero : 1;
  o.shard_size = b.shard_size, o.prefetch = b.prefetch;
  o.recompute           = o.recompute || b.recompute;
  o.sequence_parallel   = o.sequence_parallel || b.sequence_parallel;
  o.recompute_attention = (o.recompute_attention || b.recompute_attention) && !o.recompute;
  if (b.recompute || b.recompute_attention) o.recompute_stages = b.recompute_stages;
  o.schedule = pmt::parallel::schedule_name(b.schedule);
  if (pmt::world_rank() == 0)
    std::printf("--auto: the planner's top 5 of %zu layouts (%s)\n%s\n", plan.ranked.size(),
                pmt::plan::describe(plan.machine).c_str(), plan.table(5).c_str());
}

}  // namespace train_gpt
