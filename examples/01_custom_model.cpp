// SPDX-License-Identifier: Apache-2.0
// Tutorial (docs/tutorial.md): your own model, not a GPT, spread over dp x tp x pp ranks with
// pmt's layers and trained by pmt::train::Trainer, checked against the one-rank run in the same
// job (design invariant 4).
//
//   mpiexec -n 4 ./01_custom_model --dp 2 --tp 2 [--pp P] [--gpipe] [--zero] [--steps 40] [--ckpt DIR] [--plan]
//                                  [--device host|default] [--comm auto|mpi|nccl]
//   (or -n 1, -n 2 --tp 2, -n 4 --pp 4, -n 8 --dp 2 --tp 2 --pp 2, ...)
//
// The model is a small regressor, x (N, 16) -> Linear<Col> -> Gelu -> Dropout -> Linear<Row> ->
// Gelu -> Linear<Replicate> -> prediction (N, 1), trained with a mean squared error that this
// file writes itself in Kokkos. nn::StagedModel turns the Chain and the loss into a model the
// Trainer runs on any layout: with pp > 1 its six layers are cut into pp pipeline stages, and the Trainer
// runs them with the 1F1B schedule (--gpipe: GPipe) over 4 microbatches per dp rank. Each step
// draws a new global batch; every dp rank takes its rows of it. The program trains the layout it
// was asked for and, on every rank, the same model on one rank over the whole batch, and compares
// the losses, every parameter shard, a validation loss (Trainer::evaluate: evaluation mode,
// dropout off) and the predictions for held-out inputs (StagedModel::predict, on every rank)
// with the one-rank run. It exits with 1 when they differ by more than 1e-10
// (relative, double). The dropout masks need no code here: the Trainer keys them by the global
// step and each row's index in the global batch, the same on every layout and after a resume. With --ckpt DIR it also
// saves the layout's model and optimizer state as a sharded checkpoint, loads it into a fresh one-rank model, trains
// one more step there and compares that with the one-rank run. --zero trains the layout with ZeRO-1 (optim::ZeroAdamW)
// instead of AdamW. --plan first prints how the planner ranks every layout of the job's ranks for this model
// (plan::describe reads the Chain; the machine's rates are the planner's defaults here, pmt-plan --calibrate measures
// them). --device host|default and --comm auto|mpi|nccl choose where the ranks compute and how they talk
// (pmt/run/placement.hpp): Kokkos' default space (a GPU per rank with NCCL in a CUDA build) unless --device host.
#include <pmt/pmt.hpp>
#include <pmt/run/command_line.hpp>  // Kokkos' flags apart from the program's
#include <pmt/run/placement.hpp>
#include <pmt/tools.hpp>  // the planner

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace {

using T     = double;
using Host  = Kokkos::DefaultHostExecutionSpace;
using World = pmt::comm::Communicator<pmt::comm::default_backend_t<Host>>;  // the job's ranks (MPI)

constexpr std::size_t d = 16, hidden = 64;  // hidden must be divisible by tp
constexpr std::uint64_t seed = 2026;

std::string flag(int argc, char* argv[], const std::string& name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == name) return argv[i + 1];
  return fallback;
}
int flag(int argc, char* argv[], const std::string& name, int fallback) {
  return std::atoi(flag(argc, argv, name, std::to_string(fallback)).c_str());
}

// The whole program on one placement: the ranks compute on Exec (a host space, or Kokkos::Cuda)
// and the model's collectives go over Backend (MPI, or NCCL between GPUs). main() picks them.
template <class Exec, class Backend>
struct Tutorial {
  template <class Policy>
  using Linear = pmt::nn::Linear<T, Policy, Exec, Backend>;
  using Gelu   = pmt::nn::Gelu<T, Exec>;
  using Drop   = pmt::nn::Dropout<T, Exec, pmt::Sharded, Backend>;  // after Col: on the tp shard's columns

  // The placements are checked when this type is instantiated: Col yields a tensor sharded over tp,
  // Gelu keeps it so, Row takes the shards and all-reduces its product into a replicated tensor.
  // Swapping the first two Linear layers, or putting a Col after a Col, does not compile
  // (tests/compile_fail/chain_col_after_col.cpp shows the message).
  using Net = pmt::nn::Chain<Linear<pmt::TensorSplit<pmt::Col>>, Gelu, Drop, Linear<pmt::TensorSplit<pmt::Row>>, Gelu,
                             Linear<pmt::Replicate>>;

  // Every weight is drawn from the counter-based RNG keyed by (seed, stream, global index), so any
  // layout holds exactly the slices of the one-rank model: nothing is broadcast at start-up.
  static Net make_net(const pmt::Mesh<Backend>& mesh) {
    const pmt::nn::LinearOptions init{/*bias=*/true, /*init_std=*/0.2};
    return Net(Linear<pmt::TensorSplit<pmt::Col>>(mesh, d, hidden, pmt::RngKey{seed, 1}, init), Gelu(),
               Drop(mesh, /*p=*/0.1, pmt::RngKey{seed, 4}),
               Linear<pmt::TensorSplit<pmt::Row>>(mesh, hidden, d, pmt::RngKey{seed, 2}, init), Gelu(),
               Linear<pmt::Replicate>(mesh, d, 1, pmt::RngKey{seed, 3}, init));
  }

  // The loss: a mean squared error over the GLOBAL batch. The Trainer passes the normaliser the
  // step was given (the global row count N), so each rank divides by N, not by its own rows, and
  // the dp ranks' and microbatches' gradients sum to the gradient of the whole batch (pmt sums over
  // dp, never averages). Any type with a target_type and this call operator is a loss
  // (pmt::nn::MseLoss is the library's own version of this one).
  struct SquaredError {
    using target_type = pmt::Tensor<T, 1, Exec>;  // (n): one target per row
    double operator()(const Exec& exec, const pmt::Tensor<T, 2, Exec>& p, const target_type& t, double N,
                      const pmt::Tensor<T, 2, Exec>& dp) const {
      if (t.extent(0) != p.extent(0) || p.extent(1) != 1)
        throw pmt::ShapeError("SquaredError", "prediction " + pmt::shape_str(p) + " and target " + pmt::shape_str(t) +
                                                  "; expected (n, 1) and (n)");
      double loss = 0;
      Kokkos::parallel_reduce(
          "tutorial::mse", Kokkos::RangePolicy<Exec>(exec, 0, p.extent(0)),
          KOKKOS_LAMBDA(std::size_t i, double& sum) {
            const T e = p(i, 0) - t(i);
            dp(i, 0)  = 2 * e / N;
            sum += e * e / N;
          },
          loss);
      return loss;
    }
  };

  // The model the Trainer runs: the Chain cut into pipeline stages, with the loss after the last.
  using Model = pmt::nn::StagedModel<Net, SquaredError>;
  using Batch = typename Model::Batch;  // pmt::parallel::Samples<Tensor<T, 2>, Tensor<T, 1>>: {input, target, rows}

  // Rows [row0, row0 + n) of step `step`'s global batch of N rows: x ~ N(0, 1), keyed by the global
  // element index as the weights are, and the target t = sin(x0 + x1) + x2 x3 / 2.
  static Batch batch(const Exec& exec, int step, std::size_t N, std::size_t row0, std::size_t n) {
    Batch b{pmt::Tensor<T, 2, Exec>("tutorial::x", n, d), pmt::Tensor<T, 1, Exec>("tutorial::t", n), n};
    pmt::GlobalSlice rows;
    rows.extent[0] = N, rows.extent[1] = d, rows.offset[0] = row0;
    pmt::fill_normal(exec, b.input, pmt::RngKey{seed, 1000u + static_cast<std::uint32_t>(step)}, 0.0, 1.0, rows);
    const auto x = b.input;
    const auto t = b.target;
    Kokkos::parallel_for(
        "tutorial::target", Kokkos::RangePolicy<Exec>(exec, 0, n),
        KOKKOS_LAMBDA(std::size_t i) {  // Kokkos' sin runs on a GPU too (Kokkos::Experimental before 3.7)
          t(i) = pmt::detail::math::sin(x(i, 0) + x(i, 1)) + 0.5 * x(i, 2) * x(i, 3);
        });
    return b;
  }

  using AdamW = pmt::optim::AdamW<T, Exec>;
  using Zero  = pmt::optim::ZeroAdamW<T, Exec, Backend>;  // ZeRO-1: AdamW's state sharded over dp
  static constexpr pmt::optim::AdamWOptions hyper{/*beta1=*/0.9, /*beta2=*/0.999, /*eps=*/1e-8,
                                                  /*weight decay=*/0.01};  // lr: per step
  // Data, tensor and pipeline parallelism, each of any degree (the Mesh says which); the schedule
  // is 1F1B unless set_schedule() picks another.
  using Policy                              = pmt::Hybrid<pmt::DataParallel<>, pmt::TensorSplit<>, pmt::Pipeline<>>;
  static constexpr std::size_t microbatches = 4;  // per dp rank and step

  // Everything one layout needs to train: the same code runs the requested layout and the one-rank
  // reference, with a different mesh (and, with --zero, another optimizer).
  template <class Opt>
  struct Run {
    pmt::Mesh<Backend> mesh;
    Model model;
    Opt opt;
    pmt::train::Trainer<Model, Opt, Exec, Backend, Policy> trainer;

    // Checkpoints match parameters by name; StagedModel names the whole chain's parameters
    // "regressor.0", "regressor.1", ..., the same on every layout.
    explicit Run(const pmt::Mesh<Backend>& m)
        : mesh(m),
          model(mesh, make_net(mesh), SquaredError{}, pmt::nn::StagedOptions{{}, 1, "regressor"}),
          opt(make_optimizer()),
          trainer(mesh, model, opt) {}

    Opt make_optimizer() {
      if constexpr (Opt::shards_over_dp)
        return Opt(model.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp),
                   mesh.comm(pmt::Axis::pp));
      else
        return Opt(model.parameters(), hyper);
    }

    /// This dp rank's rows of step `step`'s global batch, in microbatches.
    std::vector<Batch> rows(const Exec& exec, int step, std::size_t N) const {
      const int dp = mesh.degree(pmt::Axis::dp), dp_i = mesh.coord(pmt::Axis::dp);
      const std::size_t n = N / static_cast<std::size_t>(dp);  // main() checks that dp divides N
      const std::size_t m = std::min(microbatches, n), per = n / m;
      std::vector<Batch> mbs;
      for (std::size_t i = 0; i < m; ++i)
        mbs.push_back(batch(exec, step, N, static_cast<std::size_t>(dp_i) * n + i * per, per));
      return mbs;
    }
    /// One step on this rank's rows of the global batch; returns the global loss. The Trainer
    /// zeroes the gradients, runs forward and backward (through the pipeline stages when pp > 1)
    /// with the dropout masks keyed by the step and the global rows, sums the gradients over dp,
    /// clips by the global norm and updates.
    double step(const Exec& exec, int step, std::size_t N, double lr) {
      return trainer.step(rows(exec, step, N), {/*normaliser=*/double(N), lr, /*max_norm=*/1.0});
    }
    /// The global loss of a held-out batch in evaluation mode (dropout off, no backward; a
    /// pipeline runs forward only); the model does not change.
    double validate(const Exec& exec, std::size_t N) { return trainer.evaluate(rows(exec, /*step=*/-1, N), double(N)); }
  };

  /// The largest relative difference between this rank's shard of each parameter (its stage's
  /// only) and the same block of the one-rank model's parameter of that name (Parameter::slice
  /// says where the shard sits), compared in host copies. A name the one-rank model lacks counts
  /// as different.
  static double shard_difference(Model& mine, Model& whole) {
    std::map<std::string, pmt::Parameter<T, Exec>*> by_name;
    for (auto* q : whole.parameters()) by_name[q->name] = q;
    double worst = 0;
    for (auto* p : mine.parameters()) {
      const auto it = by_name.find(p->name);
      if (it == by_name.end()) return 1.0;
      const auto a         = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), p->value2d());
      const auto b         = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), it->second->value2d());
      const std::size_t r0 = p->slice.offset[0], c0 = p->local_shape.size() > 1 ? p->slice.offset[1] : 0;
      for (std::size_t i = 0; i < a.extent(0); ++i)
        for (std::size_t j = 0; j < a.extent(1); ++j) {
          const double ref = b(r0 + i, c0 + j);
          worst            = std::max(worst, std::abs(a(i, j) - ref) / std::max(1e-3, std::abs(ref)));
        }
    }
    return worst;
  }

  /// Trains dp x tp with Opt beside the one-rank run (plain AdamW) and compares; 0 when equal.
  /// The model's communicator is built over `world`'s ranks; the comparisons' host values travel
  /// over `world` itself.
  template <class Opt>
  static int train(const World& job, int argc, char* argv[]) {
    const pmt::comm::Communicator<Backend> world = pmt::run::communicator_for<Backend>(job);
    // --pp (default 1) first; then --dp and --tp: either one alone takes the rest of the world for
    // the other; neither: all tp.
    const int pp      = std::max(1, flag(argc, argv, "--pp", 1));
    const int rest    = std::max(1, world.size() / pp);
    const int dp_flag = flag(argc, argv, "--dp", 0), tp_flag = flag(argc, argv, "--tp", 0);
    const int tp           = tp_flag > 0 ? tp_flag : (dp_flag > 0 ? std::max(1, rest / dp_flag) : rest);
    const int dp           = dp_flag > 0 ? dp_flag : std::max(1, rest / std::max(tp, 1));
    const bool gpipe       = std::find(argv + 1, argv + argc, std::string("--gpipe")) != argv + argc;
    const int steps        = flag(argc, argv, "--steps", 40);
    const std::string ckpt = flag(argc, argv, "--ckpt", "");
    const std::size_t N    = 64;  // the global batch
    const bool root        = world.rank() == 0;
    try {
      // The Mesh throws pmt::ConfigError naming every factor when dp * tp * pp != world size, the
      // split Linear layers pmt::ShapeError when tp does not divide `hidden`, StagedModel
      // pmt::ConfigError for more stages than layers: on every rank alike, before any collective,
      // so no rank is left waiting.
      pmt::Mesh<Backend> mesh(world, pmt::MeshShape{dp, tp, pp});
      if (N % static_cast<std::size_t>(dp) != 0)
        throw pmt::ConfigError("01_custom_model", "dp = " + std::to_string(dp) + " must divide the batch of " +
                                                      std::to_string(N) + " rows");
      Run<Opt> layout(mesh);
      if (gpipe) layout.trainer.set_schedule(pmt::parallel::ScheduleKind::GPipe);
      Run<AdamW> one(pmt::Mesh<Backend>(world.split(world.rank(), 0), pmt::MeshShape{}));  // this rank alone

      if (root && std::find(argv + 1, argv + argc, std::string("--plan")) != argv + argc) {
        pmt::plan::Problem problem;
        problem.spec        = pmt::plan::describe(one.model.net(), /*tp=*/1, "regressor");
        problem.batch       = N;
        problem.value_bytes = sizeof(T);
        pmt::plan::Machine machine;
        machine.ranks = world.size();
        std::printf("the planner's ranking for this model on %d rank(s), default machine rates:\n%s", world.size(),
                    pmt::plan::search(problem, machine).table(5).c_str());
      }
      if (root) {
        std::printf("01_custom_model: %d rank(s) = dp %d x tp %d x pp %d%s; batch %zu, width %zu, hidden %zu; %s\n",
                    world.size(), dp, tp, pp, Opt::shards_over_dp ? ", ZeRO-1" : "", N, d, hidden,
                    pmt::run::placement_description<Exec, Backend>().c_str());
        if (pp > 1)
          std::printf("pipeline: %s, %s, %zu microbatches per dp rank\n", layout.model.plan().describe().c_str(),
                      pmt::parallel::schedule_name(layout.trainer.schedule()), microbatches);
      }
      Exec exec;
      double loss_diff = 0;
      for (int s = 0; s < steps; ++s) {
        const double lr = 3e-3;
        const double a = layout.step(exec, s, N, lr), b = one.step(exec, s, N, lr);
        loss_diff = std::max(loss_diff, std::abs(a - b) / std::abs(b));
        if (root && (s % 10 == 0 || s + 1 == steps)) std::printf("step %3d  loss %.10f  (one rank: %.10f)\n", s, a, b);
      }
      // A held-out batch in evaluation mode: dropout is off, so it scores the model itself.
      const double val = layout.validate(exec, N), val_one = one.validate(exec, N);
      if (root) std::printf("validation loss %.10f  (one rank: %.10f)\n", val, val_one);
      // Inference: every rank gets the model's output for the held-out inputs (a pipeline's stages
      // hand each chunk's output on, and the last stage shares the result).
      const auto held_out = batch(exec, /*step=*/-1, N, 0, N);
      const auto y =
          Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), layout.model.predict(exec, held_out.input));
      const auto y_one =
          Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), one.model.predict(exec, held_out.input));
      double predict_diff = 0;
      for (std::size_t i = 0; i < N; ++i)
        predict_diff =
            std::max(predict_diff, std::abs(y(i, 0) - y_one(i, 0)) / std::max(std::abs(y_one(i, 0)), 1e-300));
      // Each rank checks its own shards; the job agrees on the worst.
      Kokkos::View<double*, Kokkos::HostSpace> worst("worst", 4);
      worst(0) = loss_diff, worst(1) = shard_difference(layout.model, one.model);
      worst(2) = std::abs(val - val_one) / std::abs(val_one), worst(3) = predict_diff;
      pmt::comm::all_reduce(job, Host(), worst, pmt::comm::ReduceOp::Max);
      bool equal = worst(0) <= 1e-10 && worst(1) <= 1e-10 && worst(2) <= 1e-10 && worst(3) <= 1e-10;
      if (root)
        std::printf(
            "largest relative difference from the one-rank run: losses %.2e, parameters %.2e, validation %.2e, "
            "predictions %.2e: %s\n",
            worst(0), worst(1), worst(2), worst(3), equal ? "equal within 1e-10" : "DIFFERENT");

      if (!ckpt.empty()) {
        // Every rank writes its shards (and AdamW's moments; ZeRO-1 gathers its parts of them first):
        // any layout, with either optimizer, can load them.
        pmt::io::CheckpointInfo info;
        info.step               = steps;
        info.model              = "01_custom_model d=16 hidden=64";
        const std::string saved = pmt::io::save_checkpoint(ckpt, layout.mesh, layout.opt, info);
        // A fresh model on one rank (initialised from another seed would do as well) takes them,
        // then trains one more step beside the one-rank run: equal only if the moments and the
        // step count came back too (the step count also keys that step's dropout masks).
        Run<AdamW> resumed(pmt::Mesh<Backend>(world.split(world.rank(), 0), pmt::MeshShape{}));
        pmt::io::load_checkpoint(saved, resumed.mesh, resumed.opt, info.model);
        const double a = resumed.step(exec, steps, N, 3e-3), b = one.step(exec, steps, N, 3e-3);
        worst(0) = std::abs(a - b) / std::abs(b), worst(1) = shard_difference(resumed.model, one.model);
        pmt::comm::all_reduce(job, Host(), worst, pmt::comm::ReduceOp::Max);
        const bool resumed_equal = worst(0) <= 1e-10 && worst(1) <= 1e-10;
        if (root)
          std::printf(
              "checkpoint %s: saved on dp %d x tp %d x pp %d, resumed on one rank: step %d loss %.10f "
              "(one rank: %.10f); parameters %.2e from the one-rank run: %s\n",
              saved.c_str(), dp, tp, pp, steps, a, b, worst(1), resumed_equal ? "equal within 1e-10" : "DIFFERENT");
        equal = equal && resumed_equal;
      }
      return equal ? 0 : 1;
    } catch (const pmt::Error& e) {
      if (root) std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
  }
};

}  // namespace

int main(int argc, char* argv[]) {
  // Kokkos gets its own (--kokkos-...) flags only: Kokkos 3.4 would read --device as its own
  std::vector<std::string> args(argv + 1, argv + argc);
  pmt::run::KokkosFlags kokkos(argv[0]);
  try {
    kokkos.take(args, "01_custom_model");
  } catch (const pmt::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  pmt::ScopeGuard guard(kokkos.argc(), kokkos.argv());
#if PMT_ENABLE_MPI
  World world(MPI_COMM_WORLD);
#else
  World world;
#endif
  const bool zero = std::find(argv + 1, argv + argc, std::string("--zero")) != argv + argc;
  try {  // the same flags on every rank: every rank runs the same placement, or raises alike
    return pmt::run::with_placement("01_custom_model", flag(argc, argv, "--device", "default"),
                                    flag(argc, argv, "--comm", "auto"), [&](auto exec, auto backend) {
                                      using Program =
                                          Tutorial<typename decltype(exec)::type, typename decltype(backend)::type>;
                                      return zero ? Program::template train<typename Program::Zero>(world, argc, argv)
                                                  : Program::template train<typename Program::AdamW>(world, argc, argv);
                                    });
  } catch (const pmt::Error& e) {
    if (world.rank() == 0) std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
