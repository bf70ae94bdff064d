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
//
// The program is parse -> plan/validate -> build -> train: the flags and their checks are in
// train_gpt_options.hpp, the job's safety (preflight, agreed errors, watchdog, metrics, report)
// in pmt/run/, the model, the trainer, the checkpoints and the sampling in the library.
#include "train_gpt_options.hpp"

#include <pmt/obs/trace.hpp>
#include <pmt/run.hpp>
#include <pmt/run/metrics.hpp>
#include <pmt/tools.hpp>
#include <pmt/train/sample.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace train_gpt;
using Host  = Kokkos::DefaultHostExecutionSpace;
using World = pmt::comm::Communicator<pmt::comm::default_backend_t<Host>>;  // the job's ranks, host values
using pmt::detail::str;
using pmt::run::JobError;

/// Exit codes besides 0 (done) and 1 (bad input, I/O error); a second signal N exits 128 + N.
constexpr int exit_nonfinite = 3, exit_watchdog = 4, exit_preempted = 75;

/// The types of a run whose ranks compute on Exec and talk over Backend (--device, --comm).
template <class Exec_, class Backend_>
struct On {
  using Exec    = Exec_;
  using Backend = Backend_;
  using Model   = pmt::nn::Gpt<float, Exec, Backend>;
  using AdamW   = pmt::optim::AdamW<float, Exec>;
  using Zero    = pmt::optim::ZeroAdamW<float, Exec, Backend>;
  using Zero2   = pmt::optim::Zero2AdamW<float, Exec, Backend>;
  using Zero3   = pmt::optim::Zero3AdamW<float, Exec, Backend>;
};

/// The model the flags describe, over the mesh (recomputation on this rank's stage, unless
/// --recompute-stages leaves it out).
template <class Model, class Backend>
Model build_model(const Options& o, const pmt::Mesh<Backend>& mesh) {
  const bool here = o.recompute_stages == 0 || mesh.coord(pmt::Axis::pp) < o.recompute_stages;
  return Model(
      mesh, gpt_config(o),
      pmt::nn::GptOptions{{}, o.chunks, o.recompute && here, o.sequence_parallel, o.recompute_attention && here});
}

/// AdamW, or ZeRO-1/2/3's sharded AdamW.
template <class S, class Opt>
Opt build_optimizer(const Options& o, const pmt::Mesh<typename S::Backend>& mesh, typename S::Model& model) {
  const pmt::optim::AdamWOptions hyper{0.9, 0.95, 1e-8, 0.1};
  using Comm    = pmt::comm::Communicator<typename S::Backend>;
  const auto pp = o.pp > 1 ? std::optional<Comm>(mesh.comm(pmt::Axis::pp)) : std::nullopt;
  if constexpr (std::is_same_v<Opt, typename S::Zero>)
    return Opt(model.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp), pp);
  else if constexpr (std::is_same_v<Opt, typename S::Zero3>)
    return Opt(model.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp), pp,
               model.tied_parameters(), pmt::optim::Zero3Options{static_cast<std::size_t>(o.prefetch), o.shard_size});
  else if constexpr (std::is_same_v<Opt, typename S::Zero2>)
    return Opt(model.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp), pp,
               model.tied_parameters());
  else
    return Opt(model.parameters(), hyper);
}

template <class S>
pmt::train::TrainerOptions trainer_options(const Options& o) {
  pmt::train::TrainerOptions t(pmt::parallel::GradSyncOptions{
      pmt::parallel::GradSync<float, typename S::Exec, typename S::Backend>::default_bucket_bytes,
      o.compress == "bf16" ? pmt::parallel::GradCompression::bf16 : pmt::parallel::GradCompression::none});
  t.period    = std::max(o.local_sgd, o.diloco);
  t.staleness = std::max(o.staleness, 0);
  t.outer     = {o.outer_lr, o.outer_momentum, true};
  t.precision = pmt::parse_precision(o.precision);
  return t;
}

/// How rank 0 spent data-parallel bytes, for the report.
std::string dp_traffic(const Options& o) {
  if (o.diloco > 0) return str("DiLoCo: parameters averaged every ", o.diloco, " steps");
  if (o.local_sgd > 0) return str("local SGD: parameters averaged every ", o.local_sgd, " steps");
  if (o.staleness >= 0) return str("gradients every step, fp32, applied ", o.staleness, " steps late");
  if (o.zero) return str("ZeRO-", o.zero_stage, " reduce-scatters and all-gathers itself: not counted");
  return str("gradients every step, ", o.compress == "bf16" ? "bf16 with error feedback" : "fp32");
}

/// One training run on S's space and backend (On<Exec, Backend>) with optimizer Opt (AdamW,
/// ZeroAdamW, Zero2AdamW, Zero3AdamW) and data-parallel mode Mode (Synchronous, LocalSgd<>, DiLoCo<>,
/// BoundedStaleness<>). The program's own host values (the checkpoint to resume, the peak, the
/// non-finite report) travel over the job's world; the model's over the mesh's backend.
template <class S, class Opt, class Mode>
class Run {
 public:
  using Exec    = typename S::Exec;
  using Backend = typename S::Backend;
  using Model   = typename S::Model;
  using Ids     = typename Model::Ids;
  using Policy  = pmt::Hybrid<pmt::DataParallel<Mode>, pmt::TensorSplit<>, pmt::Pipeline<>>;
  using Trainer = pmt::train::Trainer<Model, Opt, Exec, Backend, Policy>;

  Run(Options& o, const World& world, const pmt::io::TokenDataset& data, pmt::run::Guards& guards)
      : o(o),
        world(world),
        data(data),
        guards(guards),
        mesh(pmt::run::communicator_for<Backend>(world), pmt::MeshShape{o.dp, o.tp, o.pp}),
        model(build_model<Model>(o, mesh)),
        opt(build_optimizer<S, Opt>(o, mesh, model)),
        trainer(mesh, model, opt, Exec(), trainer_options<S>(o)) {
    trainer.set_schedule(o.schedule == "gpipe" ? pmt::parallel::ScheduleKind::GPipe
                                               : pmt::parallel::ScheduleKind::OneFOneB);
    const std::size_t B_local = static_cast<std::size_t>(o.batch / o.dp);
    per                       = B_local / static_cast<std::size_t>(o.microbatches);
    first                     = B_local * static_cast<std::size_t>(mesh.coord(pmt::Axis::dp));
    for (int i = 0; i < o.microbatches; ++i)
      mbs.push_back({Ids("ids", per * T()), Ids("targets", per * T()), per, T()});
  }

  int operator()() {
    if (o.resume) resume();
    measure_peak();
    if (root()) banner();
    open_metrics();
    if (!o.trace.empty()) pmt::TraceRecorder::instance().enable();
    const auto t0 = std::chrono::steady_clock::now();
    for (int step = start; step < o.steps; ++step) {
      if (!train_step(step, t0)) continue;
      poll_save();
      if (o.val_every > 0 && (step + 1) % o.val_every == 0 && step + 1 < o.steps) validate(step + 1);
      if (!o.ckpt_dir.empty() && o.ckpt_every > 0 && (step + 1) % o.ckpt_every == 0) saved_at = save(step + 1);
      if (const int sig = pmt::run::agree_stop(world)) return stop(sig, step);
    }
    pmt::TraceRecorder::instance().enable(false);
    finish();
    return 0;
  }

 private:
  bool root() const { return world.rank() == 0; }
  /// f() with every parameter's values whole: ZeRO-3 gathers them for its time (collective over
  /// dp), the other optimizers hold them anyway.
  template <class F>
  auto with_values(F&& f) {
    if constexpr (pmt::optim::shards_params_v<Opt>) {
      struct Whole {
        Opt& opt;
        explicit Whole(Opt& o) : opt(o) { opt.gather_all(); }
        ~Whole() { opt.release_all(); }
      } whole(opt);
      return f();
    } else {
      return f();
    }
  }
  std::size_t T() const { return static_cast<std::size_t>(o.context); }
  double tokens() const { return double(o.batch) * double(T()); }

  /// Continues from the checkpoint rank 0 picks (LATEST, or the newest that verifies).
  void resume() {
    const std::string latest = pick_checkpoint();
    if (latest.empty()) {
      if (root()) std::printf("no checkpoint in %s: starting from step 0\n", o.ckpt_dir.c_str());
      return;
    }
    try {
      const auto info = pmt::io::load_checkpoint(latest, mesh, opt, model_description(o), trainer.state());
      start           = static_cast<int>(info.step);
      check_saved_config(latest, info);
      // the checkpoint restored the measured choices (matmul paths) the saved run took
      if (const auto it = info.extra.find("measured_choices"); it != info.extra.end() && root())
        if (const auto paths = pmt::decode_measured_choices(it->second); !paths.empty())
          std::printf("matmul: the paths of %zu shape classes from the checkpoint\n", paths.size());
      // a layout-free fingerprint of the loaded parameters (the same model on any layout)
      const double fp = with_values([&] { return pmt::run::parameter_fingerprint(mesh, model.parameters()); });
      if (root())
        std::printf("resumed from %s: step %d, saved with dp %d x tp %d x pp %d, parameter fingerprint %.15e\n",
                    latest.c_str(), start, info.layout.dp, info.layout.tp, info.layout.pp, fp);
    } catch (const pmt::IoError& e) {
      throw JobError{e.what(), false};  // load_checkpoint raises on every rank
    }
  }

  /// Collective: the step directory rank 0 finds to resume ("" when none).
  std::string pick_checkpoint() {
    Kokkos::View<double, Kokkos::HostSpace> pick("pick");
    pick() = -1;
    std::exception_ptr err;
    if (root()) try {
        std::string note;
        const std::string found = pmt::io::resumable_checkpoint(o.ckpt_dir, &note);
        if (!note.empty()) std::printf("checkpoints: %s\n", note.c_str());
        if (!found.empty()) pick() = double(std::stoll(found.substr(found.size() - 8)));
      } catch (...) {
        err = std::current_exception();
      }
    pmt::run::agree_errors(world, err, prog, "finding the checkpoint to resume");
    pmt::comm::broadcast(world, Host(), pick, 0);
    return pick() < 0 ? std::string() : pmt::io::checkpoint_step_dir(o.ckpt_dir, static_cast<std::int64_t>(pick()));
  }

  /// The saved run's configuration: a different one would not continue its losses.
  void check_saved_config(const std::string& latest, const pmt::io::CheckpointInfo& info) {
    std::string changed;
    for (const auto& [key, now] : run_config(o, data)) {
      const auto it = info.extra.find(key);
      if (it != info.extra.end() && it->second != now)
        changed += (changed.empty() ? "" : ", ") + ("--" + key) + " " + (key == "data" ? "(" + now + ")" : now) +
                   " (the saved run: " + it->second + ")";
    }
    if (!changed.empty() && !o.allow_changed_config)
      throw JobError{"resuming " + latest + " with a changed configuration: " + changed +
                     "; its batches or learning rates would differ from the saved run's (--allow-changed-config "
                     "resumes anyway)"};
    if (!changed.empty() && root())
      std::printf("resuming with a changed configuration (--allow-changed-config): %s\n", changed.c_str());
  }

  /// Collective: the peak of all ranks: on host ranks the measured fp32 FMA peak (all at once:
  /// each its share of the node), on GPU ranks the device's from its properties (bf16 tensor
  /// cores for --precision bf16, else fp32).
  void measure_peak() {
    pmt::comm::barrier(world);
    Kokkos::View<double, Kokkos::HostSpace> p("peak");
    p() = pmt::obs::peak_gflops<Exec>(o.precision == "bf16") * 1e9;
    pmt::comm::all_reduce(world, Host(), p);
    peak = p();
    // Ranks that share cores time their products whenever the scheduler gives them the cores, so
    // a product's share of "peak / ranks" would mean nothing there.
    cores_shared = pmt::plan::detail::compute_share(world, Host().concurrency()) < 1.0;
  }

  void banner() const {
    const std::string extras = str(
        o.recompute ? ", activations recomputed per block" : "",
        o.recompute_attention && !o.recompute ? ", attention recomputed" : "",
        o.recompute_stages > 0 && (o.recompute || o.recompute_attention) ? str(" on stages < ", o.recompute_stages)
                                                                         : std::string(),
        model.sequence_parallel() ? ", sequence-parallel" : "", o.zero ? str(", ZeRO-", o.zero_stage) : std::string(),
        o.zero && o.zero_stage == 3 && o.shard_size > 0 && o.shard_size < o.dp
            ? str(" sharded in groups of ", o.shard_size)
            : std::string(),
        o.zero && o.zero_stage == 3 ? str(", prefetch ", o.prefetch) : std::string());
    std::printf(
        "pmt train_gpt: %d ranks = dp %d x tp %d x pp %d (%s%s, %d microbatches%s); GPT %d layers, width %d, %d heads, "
        "context %zu; batch %d; %s\n",
        world.size(), o.dp, o.tp, o.pp, o.schedule.c_str(),
        o.chunks > 1 ? str(", ", o.chunks, " chunks per stage").c_str() : "", o.microbatches, extras.c_str(), o.layers,
        o.width, o.heads, T(), o.batch, pmt::run::placement_description<Exec, Backend>().c_str());
    std::printf("data: %s, %zu bytes (%zu train, %zu validation)\n", data.path().c_str(), data.size(),
                data.train_size(), data.val_size());
    if (o.pp > 1) std::printf("stages: %s\n", model.plan().describe().c_str());
    std::printf("%s peak of all ranks: %.1f GFLOP/s (%s); %s\n", pmt::obs::peak_kind<Exec>(o.precision == "bf16"),
                peak / 1e9, pmt::obs::peak_source<Exec>().c_str(),
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

  void open_metrics() {
    if (!root() || o.metrics.empty()) return;
    std::string note;
    metrics = pmt::run::MetricsLog(o.metrics, o.resume ? start : 0, &note);
    if (!note.empty()) std::printf("metrics: %s\n", note.c_str());
  }

  /// The microbatches from `source(first sequence, ids, targets)`, on this dp rank.
  template <class Source>
  void fill(Source&& source) {
    for (int i = 0; i < o.microbatches; ++i) {
      auto ids = Kokkos::create_mirror_view(mbs[i].ids), tgt = Kokkos::create_mirror_view(mbs[i].targets);
      source(first + static_cast<std::size_t>(i) * per, ids, tgt);
      Kokkos::deep_copy(mbs[i].ids, ids);
      Kokkos::deep_copy(mbs[i].targets, tgt);
    }
  }

  /// One step; false when its update was skipped (nan or inf, --on-nonfinite skip).
  bool train_step(int step, std::chrono::steady_clock::time_point run_t0) {
    if (guards.watchdog) guards.watchdog->set_step(step);
    fill([&](std::size_t f, auto& ids, auto& tgt) {
      data.train_batch(static_cast<std::uint64_t>(o.seed), step, f, per, ids, tgt);
    });
    const double lr = pmt::optim::warmup_cosine(step, o.warmup, o.steps, o.lr, o.lr / 10);
    const double c0 = pmt::comm::comm_time().seconds;
    const auto t0   = std::chrono::steady_clock::now();
    double loss     = 0;
    {
      const pmt::Instrument instrument("train_gpt::step", pmt::Track::Optimizer,
                                       [step] { return "step " + std::to_string(step); });
      loss = trainer.step(mbs, pmt::train::StepOptions{tokens(), lr, 1.0, /*skip_nonfinite=*/true, /*step=*/step});
    }
    if (trainer.last_step_skipped()) {  // nan or inf: the update was not applied (on every rank alike)
      skipped(step, loss);
      return false;
    }
    skipped_in_row = 0;
    const auto t1  = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(t1 - t0).count(), comm = pmt::comm::comm_time().seconds - c0;
    totals.compute_s += s - comm, totals.comm_s += comm;
    if (root()) progress(step, loss, lr, s, comm, std::chrono::duration<double>(t1 - run_t0).count());
    return true;
  }

  /// A step whose loss or gradient norm is not finite: which ranks hold non-finite gradients of
  /// their own; stops the run (exit 3) unless --on-nonfinite skip (and fewer than 10 in a row).
  void skipped(int step, double loss) {
    Kokkos::View<double*, Kokkos::HostSpace> mine("mine", 1), all("all", static_cast<std::size_t>(world.size()));
    for (auto* p : model.parameters()) {
      auto g = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), p->grad);
      for (std::size_t i = 0; i < g.size() && mine(0) == 0; ++i) mine(0) = std::isfinite(g(i)) ? 0.0 : 1.0;
    }
    pmt::comm::all_gather(world, Host(), mine, all);
    std::string ranks;
    for (int q = 0; q < world.size(); ++q)
      if (all(q) != 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(q);
    const std::string what =
        str("step ", step, ": loss ", loss, ", gradient norm ", trainer.last_grad_norm(),
            ranks.empty() ? std::string(" (no rank's own gradients hold nan or inf: the loss does)")
                          : " (non-finite gradients on rank(s) " + ranks + ")");
    if (!o.skip_nonfinite || ++skipped_in_row >= 10) {
      finish_save();  // every rank stops here alike: a save in flight is whole first, then the whole trace
      write_trace();
      throw JobError{
          what + (o.skip_nonfinite ? "; 10 steps in a row were skipped" : "") +
              ": stopping; the update was not applied and nothing was saved" +
              (o.ckpt_dir.empty() ? std::string() : "; " + o.ckpt_dir + "/LATEST names the last good checkpoint"),
          true, exit_nonfinite};
    }
    if (root()) std::printf("%s: update skipped (--on-nonfinite skip; %d in a row)\n", what.c_str(), skipped_in_row);
    metrics.write({{"step", step}, {"skipped", true}});
  }

  /// Rank 0's line per step, and its metrics line.
  void progress(int step, double loss, double lr, double s, double comm, double elapsed) {
    const double flops = pmt::plan::gpt_step_flops(gpt_config(o), static_cast<std::size_t>(o.batch), false);
    const double done  = double(step + 1 - start) / double(o.steps - start);
    const double left  = elapsed * (1 - done) / done;
    std::printf(
        "step %5d/%d  loss %.4f  lr %.2e  %7.0f tok/s  MFU %4.1f%% (%s)  comm %4.1f%%  [%3.0f%%, %dm%02ds left]\n",
        step, o.steps, loss, lr, tokens() / s, 100.0 * flops / s / peak,
        o.precision == "bf16" ? str("bf16 ", pmt::ops::bf16_matmul_isa<Exec>()).c_str()
                              : pmt::ops::matmul_path_label().c_str(),
        100.0 * comm / s, 100.0 * done, int(left) / 60, int(left) % 60);
    if (step == start && pmt::ops::matmul_path() == pmt::ops::MatmulPath::Auto)
      std::printf("%s%s\n", pmt::ops::matmul_path_summary(cores_shared ? 0.0 : peak / 1e9 / world.size()).c_str(),
                  cores_shared ? " (ranks share cores: no share of peak)" : "");
    std::fflush(stdout);
    metrics.write({{"step", step},
                   {"loss", loss},
                   {"lr", lr},
                   {"grad_norm", trainer.last_grad_norm()},
                   {"seconds", s},
                   {"tokens_per_s", tokens() / s},
                   {"mfu", flops / s / peak},
                   {"comm_fraction", comm / s}});
  }

  /// The validation loss on 4 batches of the held-out text.
  void validate(int step) {
    double loss       = 0;
    const int batches = 4;
    for (int k = 0; k < batches; ++k) {
      fill([&](std::size_t f, auto& ids, auto& tgt) {
        data.val_batch(static_cast<std::size_t>(k * o.batch) + f, per, ids, tgt);
      });
      loss += trainer.evaluate(mbs, tokens() * batches);
    }
    if (root()) std::printf("step %5d  validation loss %.4f\n", step, loss);
    metrics.write({{"step", step}, {"val_loss", loss}});
  }

  /// A checkpoint of the state after `step` steps (collective). --async-save (the default): the
  /// state is copied to host memory and written in the background, finished by a later
  /// poll_save() or by finish_save(); `wait` finishes it at once. --keep prunes older ones.
  int save(int step, bool wait = false) {
    pmt::io::CheckpointInfo info;
    info.step  = step;
    info.model = model_description(o);
    info.extra = {{"data_position", std::to_string(step)}};  // the measured choices go in by themselves
    for (const auto& [key, value] : run_config(o, data)) info.extra[key] = value;
    try {
      if (!o.async_save) {
        saved(pmt::io::save_checkpoint(o.ckpt_dir, mesh, opt, info, trainer.state()));
        return step;
      }
      saver.save(o.ckpt_dir, opt, info, trainer.state());
      if (root())
        std::printf("checkpoint: step %d copied in %.3f s, writing in the background\n", step,
                    saver.blocking_seconds());
      if (wait) finish_save();
    } catch (const pmt::IoError& e) {
      throw JobError{e.what(), false};  // a save raises on every rank
    }
    return step;
  }

  /// Each step boundary: finishes a background save once every rank has written its shard.
  void poll_save() {
    try {
      if (const std::string where = saver.poll(); !where.empty()) saved(where);
    } catch (const pmt::IoError& e) {
      throw JobError{e.what(), false};  // raised on every rank
    }
  }

  /// Waits for a background save in flight and finishes it (LATEST names it).
  void finish_save() {
    try {
      if (const std::string where = saver.wait(); !where.empty()) saved(where);
    } catch (const pmt::IoError& e) {
      throw JobError{e.what(), false};  // raised on every rank
    }
  }

  /// A checkpoint is whole and LATEST names it: say so, and prune (--keep).
  void saved(const std::string& where) {
    if (root() && o.async_save)
      std::printf("checkpoint: %s (written in the background in %.3f s)\n", where.c_str(), saver.writing_seconds());
    else if (root())
      std::printf("checkpoint: %s\n", where.c_str());
    if (root() && o.keep > 0)
      for (const auto& g : pmt::io::prune_checkpoints(o.ckpt_dir, static_cast<std::size_t>(o.keep)))
        std::printf("checkpoint: removed %s/%s (--keep %d)\n", o.ckpt_dir.c_str(), g.c_str(), o.keep);
  }

  /// A stop signal (agreed by all ranks) after `step`: a checkpoint, the trace of the steps run,
  /// then exit 75.
  int stop(int sig, int step) {
    if (saver.in_flight() && root())
      std::printf("stopping: first finishing the checkpoint being written in the background\n");
    finish_save();  // a save in flight first: LATEST names it before anything else happens
    if (!o.ckpt_dir.empty() && saved_at != step + 1) saved_at = save(step + 1, true);
    write_trace();
    if (root()) {
      std::printf(
          "stopped by %s after step %d: %s\n", pmt::run::signal_name(sig), step,
          o.ckpt_dir.empty()
              ? "no --ckpt-dir, nothing saved"
              : ("saved " + pmt::io::checkpoint_step_dir(o.ckpt_dir, saved_at) + "; --resume continues it").c_str());
      std::fflush(stdout);
    }
    return exit_preempted;
  }

  /// The trained model first (validation, the final checkpoint), then the trace, the per-rank
  /// report and a sample.
  void finish() {
    validate(o.steps);
    finish_save();
    if (!o.ckpt_dir.empty() && saved_at != o.steps && start < o.steps) saved_at = save(o.steps, true);
    write_trace();
    report();
    sample();
  }

  /// --trace: every rank's events of the steps run (collective).
  void write_trace() {
    pmt::TraceRecorder::instance().enable(false);
    if (o.trace.empty()) return;
    pmt::obs::write_trace(mesh, o.trace);
    if (root()) std::printf("trace: %s\n", o.trace.c_str());
  }

  void report() {
    totals.peak_bytes = o.memory_report() ? double(pmt::obs::MemoryTracker::instance().peak_bytes()) : -1.0;
    const auto all    = pmt::run::rank_report(world, {o.dp, o.tp, o.pp}, totals, o.steps - start);
    if (!root() || start >= o.steps) return;
    if (o.dp > 1)
      std::printf("dp communication: %.2f MiB handed to dp all-reduces by rank 0 over %d steps (%s)\n",
                  double(trainer.dp_bytes_sent()) / 1048576.0, o.steps - start, dp_traffic(o).c_str());
    metrics.write({{"dp_bytes_sent", trainer.dp_bytes_sent()}});
    if (!o.memory_report()) return;
    std::vector<long long> peaks;
    for (const auto& t : all) peaks.push_back(static_cast<long long>(t.peak_bytes));
    metrics.write({{"peak_memory_bytes", peaks}});
  }

  /// 160 bytes after a prompt from the validation text, temperature 0.8, seeded.
  void sample() {
    std::string prompt;
    Ids ids("p", T()), tgt("t", T());
    auto hi = Kokkos::create_mirror_view(ids), ht = Kokkos::create_mirror_view(tgt);
    data.val_batch(0, 1, hi, ht);
    for (std::size_t t = 0; t < std::min<std::size_t>(T() / 2, 24); ++t) prompt += static_cast<char>(hi(t));
    const std::string text = with_values([&] {
      return pmt::train::sample_text(mesh, model, prompt, 160, 0.8,
                                     pmt::RngKey{static_cast<std::uint64_t>(o.seed), 4242});
    });
    if (!root()) return;
    std::string shown;
    for (char ch : text) shown += (ch == '\n' || (ch >= 32 && ch < 127)) ? ch : '?';
    std::printf("sample (prompt \"%s\", temperature 0.8):\n%s\n", prompt.c_str(), shown.c_str());
  }

  Options& o;
  const World& world;  // the job's ranks, for host values
  const pmt::io::TokenDataset& data;
  pmt::run::Guards& guards;
  pmt::Mesh<Backend> mesh;
  Model model;
  Opt opt;
  Trainer trainer;
  pmt::io::AsyncCheckpointer<Backend> saver{mesh};  // a save in flight when the run fails stays .partial
  std::vector<pmt::train::Microbatch<Ids>> mbs;
  std::size_t per = 0, first = 0;
  int start = 0, saved_at = -1, skipped_in_row = 0;
  double peak       = 0;
  bool cores_shared = false;
  pmt::run::RankTotals totals;
  pmt::run::MetricsLog metrics;
};

/// The run the flags name on S's space and backend: the optimizer and the data-parallel mode, as types.
template <class S>
int train_on(Options& o, const World& world, const pmt::io::TokenDataset& data, pmt::run::Guards& guards) {
  using AdamW = typename S::AdamW;
  if (o.zero && o.zero_stage == 3) return Run<S, typename S::Zero3, pmt::Synchronous>(o, world, data, guards)();
  if (o.zero && o.zero_stage == 2) return Run<S, typename S::Zero2, pmt::Synchronous>(o, world, data, guards)();
  if (o.zero) return Run<S, typename S::Zero, pmt::Synchronous>(o, world, data, guards)();
  if (o.local_sgd > 0) return Run<S, AdamW, pmt::LocalSgd<>>(o, world, data, guards)();
  if (o.diloco > 0) return Run<S, AdamW, pmt::DiLoCo<>>(o, world, data, guards)();
  if (o.staleness >= 0) return Run<S, AdamW, pmt::BoundedStaleness<>>(o, world, data, guards)();
  return Run<S, AdamW, pmt::Synchronous>(o, world, data, guards)();
}

/// The run on the space and backend --device and --comm name.
int train(Options& o, const World& world, const pmt::io::TokenDataset& data, pmt::run::Guards& guards) {
  if (o.memory_report()) pmt::obs::MemoryTracker::instance().enable();  // Kokkos allocations: the peak per rank
  return pmt::run::with_placement(prog, o.device, o.comm, [&](auto exec, auto backend) {
    return train_on<On<typename decltype(exec)::type, typename decltype(backend)::type>>(o, world, data, guards);
  });
}

/// A pmt::Error raised alike on every rank, as the job's error.
template <class F>
auto agreed(F&& f) {
  try {
    return f();
  } catch (const pmt::Error& e) {
    throw JobError{e.what()};
  }
}

/// A rank that ends alone (an error only it raised, the watchdog): its own events go to
/// TRACE.rank-R, as the others cannot be reached to gather them.
void keep_own_trace(const std::string& trace) {
  if (trace.empty()) return;
  const int r = pmt::world_rank();
  pmt::obs::write_rank_trace(trace + ".rank-" + std::to_string(r), r, "");
  std::fprintf(stderr, "%s: rank %d's trace: %s.rank-%d\n", prog, r, trace.c_str(), r);
}

/// After Kokkos and MPI start: the ranks agree on the flags, then the preflight, the layout
/// (--auto: the planner's), the data, and the run.
int job(Parsed& p, int argc, char* argv[], const std::string& threads_note) {
  Options& o = p.options;
#if PMT_ENABLE_MPI
  World world(MPI_COMM_WORLD);
#else
  World world;
#endif
  agreed([&] { pmt::run::agree_command_line(world, argc, argv, prog); });  // first: later calls would mismatch
  if (!p.error.empty()) throw JobError{p.error};
  pmt::run::install_stop_handlers();
  if (world.rank() == 0 && !threads_note.empty()) std::printf("%s\n", threads_note.c_str());
  agreed([&] {
    pmt::ops::matmul_path();  // a bad PMT_MATMUL fails here, alike on every rank
    pmt::run::check_placement(prog, o.device, o.comm);
    validate_outputs(o);
  });
  const auto guards =
      pmt::run::preflight(world, pmt::run::PreflightOptions{prog,
                                                            o.ckpt_dir,
                                                            o.resume,
                                                            o.overwrite,
                                                            "--ckpt-dir",
                                                            {{"--metrics", o.metrics}, {"--trace", o.trace}},
                                                            o.watchdog,
                                                            exit_watchdog,
                                                            [trace = o.trace] { keep_own_trace(trace); }});
  const auto data = agreed([&] {
    if (o.auto_plan) choose_layout(o, world);
    validate(o, world.size());
    return std::make_unique<pmt::io::TokenDataset>(o.data, static_cast<std::size_t>(o.context));
  });
  return train(o, world, *data, *guards);
}

}  // namespace

int main(int argc, char* argv[]) {
  std::vector<std::string> args(argv + 1, argv + argc);
  pmt::run::KokkosFlags kokkos(argv[0]);
  Parsed p;
  try {
    kokkos.take(args, prog);
    p = parse(args);
  } catch (const pmt::Error& e) {
    p.error = e.what();
  }
  if (!p.help.empty()) {
    if (pmt::run::is_first_rank_env()) std::fputs(p.help.c_str(), stdout);
    return 0;
  }
  std::string threads_note;
  try {
    if (p.error.empty()) threads_note = pmt::run::choose_threads(p.options.threads);
  } catch (const pmt::Error& e) {
    p.error = e.what();
  }
  if (p.error.empty() && !p.options.matmul.empty())
    pmt::ops::set_matmul_path(pmt::ops::parse_matmul_path(p.options.matmul, "--matmul"));
  pmt::ScopeGuard guard(kokkos.argc(), kokkos.argv());  // Kokkos sees its own flags only
  return pmt::run::run_job(
      prog, [&] { return job(p, argc, argv, threads_note); }, [&] { keep_own_trace(p.options.trace); });
}
