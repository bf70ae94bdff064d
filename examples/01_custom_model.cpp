// SPDX-License-Identifier: Apache-2.0
// Tutorial (docs/tutorial.md): your own model, not a GPT, spread over dp x tp ranks with pmt's
// layers, and checked against the one-rank run in the same job (design invariant 4).
//
//   mpiexec -n 4 ./01_custom_model --dp 2 --tp 2 [--zero] [--steps 40] [--ckpt DIR]
//   (or -n 1, -n 2 --tp 2, -n 8 --dp 2 --tp 4, ...)
//
// The model is a small regressor, x (N, 16) -> Linear<Col> -> Gelu -> Linear<Row> -> Gelu ->
// Linear<Replicate> -> prediction (N, 1), trained with a mean squared error that this file writes
// itself in Kokkos. Each step draws a new global batch; every dp rank takes its rows of it. The
// program trains the layout it was asked for and, on every rank, the same model on one rank over
// the whole batch, and compares the losses and every parameter shard with the one-rank run.
// It exits with 1 when they differ by more than 1e-10 (relative, double). With --ckpt DIR it
// also saves the layout's model and optimizer state as a sharded checkpoint, loads it into a
// fresh one-rank model, trains one more step there and compares that with the one-rank run.
// --zero trains the layout with ZeRO-1 (optim::ZeroAdamW) instead of AdamW + GradSync.
#include <pmt/pmt.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using T       = double;
using Exec    = Kokkos::DefaultHostExecutionSpace;
using Backend = pmt::comm::default_backend_t<Exec>;
template <class Policy>
using Linear = pmt::nn::Linear<T, Policy, Exec, Backend>;
using Gelu   = pmt::nn::Gelu<T, Exec>;

// The placements are checked when this type is instantiated: Col yields a tensor sharded over tp,
// Gelu keeps it so, Row takes the shards and all-reduces its product into a replicated tensor.
// Swapping the first two Linear layers, or putting a Col after a Col, does not compile
// (tests/compile_fail/chain_col_after_col.cpp shows the message).
using Model = pmt::nn::Chain<Linear<pmt::TensorSplit<pmt::Col>>, Gelu, Linear<pmt::TensorSplit<pmt::Row>>, Gelu,
                             Linear<pmt::Replicate>>;

constexpr std::size_t d = 16, hidden = 64;  // hidden must be divisible by tp
constexpr std::uint64_t seed = 2026;

// Every weight is drawn from the counter-based RNG keyed by (seed, stream, global index), so any
// layout holds exactly the slices of the one-rank model: nothing is broadcast at start-up.
Model make_model(const pmt::Mesh<Backend>& mesh) {
  return Model(Linear<pmt::TensorSplit<pmt::Col>>(mesh, d, hidden, pmt::RngKey{seed, 1}, true, 0.2), Gelu(),
               Linear<pmt::TensorSplit<pmt::Row>>(mesh, hidden, d, pmt::RngKey{seed, 2}, true, 0.2), Gelu(),
               Linear<pmt::Replicate>(mesh, d, 1, pmt::RngKey{seed, 3}, true, 0.2));
}

// Rows [row0, row0 + n) of step `step`'s global batch of N rows: x ~ N(0, 1), keyed by the global
// element index as the weights are, and the target t = sin(x0 + x1) + x2 x3 / 2.
void batch(const Exec& exec, int step, std::size_t N, std::size_t row0, const pmt::Tensor<T, 2, Exec>& x,
           const pmt::Tensor<T, 1, Exec>& t) {
  pmt::GlobalSlice rows;
  rows.extent[0] = N, rows.extent[1] = d, rows.offset[0] = row0;
  pmt::fill_normal(exec, x, pmt::RngKey{seed, 1000u + static_cast<std::uint32_t>(step)}, 0.0, 1.0, rows);
  Kokkos::parallel_for(
      "tutorial::target", Kokkos::RangePolicy<Exec>(exec, 0, x.extent(0)),
      KOKKOS_LAMBDA(std::size_t i) { t(i) = std::sin(x(i, 0) + x(i, 1)) + 0.5 * x(i, 2) * x(i, 3); });
}

using AdamW = pmt::optim::AdamW<T, Exec>;
using Zero  = pmt::optim::ZeroAdamW<T, Exec, Backend>;  // ZeRO-1: AdamW's state sharded over dp
const pmt::ops::AdamWParams hyper{/*lr: per step*/ 0, 0.9, 0.999, 1e-8, /*weight decay=*/0.01, 1};

// Everything one layout needs to train: the same code runs the requested layout and the one-rank
// reference, with a different mesh (and, with --zero, another optimizer).
template <class Opt>
struct Run {
  pmt::Mesh<Backend> mesh;
  Model model;
  Opt opt;
  pmt::parallel::GradSync<T, Exec, Backend> sync;  // dp gradient all-reduce, in buckets (not for ZeRO-1)

  explicit Run(const pmt::Mesh<Backend>& m)
      : mesh(m), model(make_model(mesh)), opt(make_optimizer()),
        sync(mesh.comm(pmt::Axis::dp),
             Opt::shards_over_dp ? std::vector<pmt::nn::Parameter<T, Exec>*>{} : model.parameters()) {
    // Checkpoints match parameters by name; Linear's default names repeat for layers of one
    // policy. These names ("regressor.0", ...) are the same on every layout.
    pmt::nn::name_parameters(model.parameters(), "regressor");
  }

  Opt make_optimizer() {
    if constexpr (Opt::shards_over_dp)
      return Opt(model.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp));
    else
      return Opt(model.parameters(), hyper);
  }

  /// One step on this rank's rows of the global batch; returns the global loss.
  double step(const Exec& exec, int step, std::size_t N, double lr) {
    const int dp = mesh.degree(pmt::Axis::dp), dp_i = mesh.coord(pmt::Axis::dp);
    const std::size_t n = N / static_cast<std::size_t>(dp);  // main() checks that dp divides N
    pmt::Tensor<T, 2, Exec> x("tutorial::x", n, d);
    pmt::Tensor<T, 1, Exec> t("tutorial::t", n);
    batch(exec, step, N, static_cast<std::size_t>(dp_i) * n, x, t);

    opt.zero_grad(exec);
    const pmt::Tensor<T, 2, Exec> p = model.forward(exec, x);  // (n, 1), the same on every tp rank

    // Mean squared error over the GLOBAL batch: each rank divides by N, not by its n, so that the
    // dp ranks' gradients sum to the gradient of the whole batch (pmt sums over dp, never averages).
    pmt::Tensor<T, 2, Exec> dpred("tutorial::dloss", n, 1);
    Kokkos::View<T*, Kokkos::HostSpace> loss("tutorial::loss", 1);
    Kokkos::parallel_reduce(
        "tutorial::mse", Kokkos::RangePolicy<Exec>(exec, 0, n),
        KOKKOS_LAMBDA(std::size_t i, T & sum) {
          const T e   = p(i, 0) - t(i);
          dpred(i, 0) = 2 * e / static_cast<T>(N);
          sum += e * e / static_cast<T>(N);
        },
        loss(0));

    if constexpr (Opt::shards_over_dp) {
      // ZeRO-1 reduce-scatters the gradients over dp itself, clips by the global norm, updates
      // this rank's part and all-gathers the values.
      model.backward(exec, dpred);
      opt.step(exec, lr, /*max_norm=*/1.0);
    } else {
      sync.arm(true);  // this backward's gradients are the step's last: synchronise them
      model.backward(exec, dpred);
      sync.ready(exec, model.parameters());  // a model with per-layer hooks calls this per layer
      sync.finish(exec);                     // gradients now summed over dp

      // The global norm: tp shards summed over tp, tp-replicated parameters counted once.
      pmt::optim::clip_grad_norm(exec, model.parameters(), mesh.comm(pmt::Axis::tp), /*max_norm=*/1.0);
      opt.step(exec, lr);
    }

    pmt::comm::all_reduce(mesh.comm(pmt::Axis::dp), exec, loss);  // the dp ranks' shares of the mean
    exec.fence();
    return loss(0);
  }
};

/// The largest relative difference between this rank's shard of each parameter and the same
/// block of the one-rank model's parameter (Parameter::slice says where the shard sits).
double shard_difference(Model& mine, Model& whole) {
  const auto ps = mine.parameters(), qs = whole.parameters();
  double worst  = 0;
  for (std::size_t k = 0; k < ps.size(); ++k) {
    const auto a = ps[k]->value2d(), b = qs[k]->value2d();
    const std::size_t r0 = ps[k]->slice.offset[0], c0 = ps[k]->local_shape.size() > 1 ? ps[k]->slice.offset[1] : 0;
    for (std::size_t i = 0; i < a.extent(0); ++i)
      for (std::size_t j = 0; j < a.extent(1); ++j) {
        const double ref = b(r0 + i, c0 + j);
        worst            = std::max(worst, std::abs(a(i, j) - ref) / std::max(1e-3, std::abs(ref)));
      }
  }
  return worst;
}

std::string flag(int argc, char* argv[], const std::string& name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == name) return argv[i + 1];
  return fallback;
}
int flag(int argc, char* argv[], const std::string& name, int fallback) {
  return std::atoi(flag(argc, argv, name, std::to_string(fallback)).c_str());
}

}  // namespace

/// Trains dp x tp with Opt beside the one-rank run (plain AdamW) and compares; 0 when equal.
template <class Opt>
int train(const pmt::comm::Communicator<Backend>& world, int argc, char* argv[]) {
  // --dp and --tp: either one alone takes the rest of the world for the other; neither: all tp.
  const int dp_flag = flag(argc, argv, "--dp", 0), tp_flag = flag(argc, argv, "--tp", 0);
  const int tp = tp_flag > 0 ? tp_flag : (dp_flag > 0 ? std::max(1, world.size() / dp_flag) : world.size());
  const int dp = dp_flag > 0 ? dp_flag : std::max(1, world.size() / std::max(tp, 1));
  const int steps        = flag(argc, argv, "--steps", 40);
  const std::string ckpt = flag(argc, argv, "--ckpt", "");
  const std::size_t N = 64;  // the global batch
  const bool root     = world.rank() == 0;
  try {
    // The Mesh throws pmt::ConfigError naming every factor when dp * tp != world size, the split
    // Linear layers pmt::ShapeError when tp does not divide `hidden`: on every rank alike, before
    // any collective, so no rank is left waiting.
    pmt::Mesh<Backend> mesh(world, pmt::MeshShape{dp, tp, 1});
    if (N % static_cast<std::size_t>(dp) != 0)
      throw pmt::ConfigError("01_custom_model", "dp = " + std::to_string(dp) + " must divide the batch of " +
                                                    std::to_string(N) + " rows");
    Run<Opt> layout(mesh);
    Run<AdamW> one(pmt::Mesh<Backend>(world.split(world.rank(), 0), pmt::MeshShape{}));  // this rank alone

    if (root) std::printf("01_custom_model: %d rank(s) = dp %d x tp %d%s; batch %zu, width %zu, hidden %zu\n",
                          world.size(), dp, tp, Opt::shards_over_dp ? ", ZeRO-1" : "", N, d, hidden);
    Exec exec;
    double loss_diff = 0;
    for (int s = 0; s < steps; ++s) {
      const double lr = 3e-3;
      const double a = layout.step(exec, s, N, lr), b = one.step(exec, s, N, lr);
      loss_diff = std::max(loss_diff, std::abs(a - b) / std::abs(b));
      if (root && (s % 10 == 0 || s + 1 == steps)) std::printf("step %3d  loss %.10f  (one rank: %.10f)\n", s, a, b);
    }
    // Each rank checks its own shards; the job agrees on the worst.
    Kokkos::View<double*, Kokkos::HostSpace> worst("worst", 2);
    worst(0) = loss_diff, worst(1) = shard_difference(layout.model, one.model);
    pmt::comm::all_reduce(world, exec, worst, pmt::comm::ReduceOp::Max);
    bool equal = worst(0) <= 1e-10 && worst(1) <= 1e-10;
    if (root)
      std::printf("largest relative difference from the one-rank run: losses %.2e, parameters %.2e: %s\n", worst(0),
                  worst(1), equal ? "equal within 1e-10" : "DIFFERENT");

    if (!ckpt.empty()) {
      // Every rank writes its shards (and AdamW's moments; ZeRO-1 gathers its parts of them first):
      // any layout, with either optimizer, can load them.
      pmt::io::CheckpointInfo info;
      info.step  = steps;
      info.model = "01_custom_model d=16 hidden=64";
      const std::string saved = pmt::io::save_checkpoint(ckpt, layout.mesh, layout.opt, info);
      // A fresh model on one rank (initialised from another seed would do as well) takes them,
      // then trains one more step beside the one-rank run: equal only if the moments and the
      // step count came back too.
      Run<AdamW> resumed(pmt::Mesh<Backend>(world.split(world.rank(), 0), pmt::MeshShape{}));
      pmt::io::load_checkpoint(saved, resumed.mesh, resumed.opt, info.model);
      const double a = resumed.step(exec, steps, N, 3e-3), b = one.step(exec, steps, N, 3e-3);
      worst(0) = std::abs(a - b) / std::abs(b), worst(1) = shard_difference(resumed.model, one.model);
      pmt::comm::all_reduce(world, exec, worst, pmt::comm::ReduceOp::Max);
      const bool resumed_equal = worst(0) <= 1e-10 && worst(1) <= 1e-10;
      if (root)
        std::printf("checkpoint %s: saved on dp %d x tp %d, resumed on one rank: step %d loss %.10f (one rank: %.10f); "
                    "parameters %.2e from the one-rank run: %s\n",
                    saved.c_str(), dp, tp, steps, a, b, worst(1), resumed_equal ? "equal within 1e-10" : "DIFFERENT");
      equal = equal && resumed_equal;
    }
    return equal ? 0 : 1;
  } catch (const pmt::Error& e) {
    if (root) std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

int main(int argc, char* argv[]) {
  pmt::ScopeGuard guard(argc, argv);
#if PMT_ENABLE_MPI
  pmt::comm::Communicator<Backend> world(MPI_COMM_WORLD);
#else
  pmt::comm::Communicator<Backend> world;
#endif
  const bool zero = std::find(argv + 1, argv + argc, std::string("--zero")) != argv + argc;
  return zero ? train<Zero>(world, argc, argv) : train<AdamW>(world, argc, argv);
}
