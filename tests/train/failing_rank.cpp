// SPDX-License-Identifier: Apache-2.0
// A program whose own model fails on one rank, written as a user writes one (docs/tutorial.md):
// main catches pmt::Error and std::exception, prints the message and returns 1. ctest runs it on
// every layout and expects every rank to end within seconds, with a non-zero exit, the original
// message, and pmt's line naming the rank (and, on a pipeline, the stage and microbatch).
//
//   failing_rank --dp D --tp T --pp P --rank R --where forward|backward|loss|evaluate|save [--std]
//
// World rank R throws at step 3 (pmt::ConfigError; --std: std::runtime_error) in the forward or
// the backward of a layer of the user's, in the loss, in an evaluation; `save`: R's parameters
// hold a nan, so its shard of the checkpoint is refused (every rank raises, none is left waiting).
#include <pmt/pmt.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using T       = double;
using Exec    = Kokkos::DefaultHostExecutionSpace;
using Backend = pmt::comm::default_backend_t<Exec>;
template <class P>
using Linear = pmt::nn::Linear<T, P, Exec, Backend>;
using Act    = pmt::Tensor<T, 2, Exec>;

struct Plan {
  int rank = -1;
  std::string where;
  bool std_error = false;
};
Plan plan;

[[noreturn]] void fail(const char* what) {
  if (plan.std_error) throw std::runtime_error(std::string("user code: ") + what + " failed at step 3");
  throw pmt::ConfigError("Tripwire", std::string(what) + " failed at step 3");
}
bool armed(const char* where) {
  return plan.where == where && pmt::world_rank() == plan.rank && pmt::step_context().random.step == 3;
}

/// A user's layer: the identity, which throws where the plan says (on a tensor placed as P).
template <class P>
struct Tripwire {
  using value_type                = T;
  using execution_space           = Exec;
  using input_placement           = P;
  using output_placement          = P;
  static constexpr bool nonlinear = false;
  Act forward(const Exec&, const Act& x) {
    if (armed("forward") && pmt::grad_enabled()) fail("forward");
    if (plan.where == "evaluate" && pmt::world_rank() == plan.rank && !pmt::grad_enabled()) fail("evaluation");
    return x;
  }
  Act backward(const Exec&, const Act& dy) {
    if (armed("backward")) fail("backward");
    return dy;
  }
  std::vector<pmt::Parameter<T, Exec>*> parameters() { return {}; }
  std::size_t output_width(std::size_t in) const noexcept { return in; }
};

struct Loss {
  using target_type = Act;
  double operator()(const Exec& exec, const Act& y, const Act& t, double N, const Act& dy) const {
    if (armed("loss")) fail("the loss");
    return pmt::nn::MseLoss<T, Exec>()(exec, y, t, N, dy);
  }
};

// ten layers, a tripwire on every stage of pp 1, 2 and 4 (stage_plan)
using Gelu = pmt::nn::Gelu<T, Exec>;
using Net  = pmt::nn::Chain<Linear<pmt::TensorSplit<pmt::Col>>, Tripwire<pmt::Sharded>, Gelu,
                           Linear<pmt::TensorSplit<pmt::Row>>, Tripwire<pmt::Replicated>, Linear<pmt::Replicate>, Gelu,
                           Tripwire<pmt::Replicated>, Linear<pmt::Replicate>, Tripwire<pmt::Replicated>>;
pmt::parallel::StagePlan stage_plan(int pp) {
  if (pp == 2) return pmt::parallel::explicit_stages(10, {5, 5});
  if (pp == 4) return pmt::parallel::explicit_stages(10, {2, 3, 3, 2});
  return {};
}
using Model = pmt::nn::StagedModel<Net, Loss>;

int flag(int argc, char* argv[], const std::string& name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == name) return std::atoi(argv[i + 1]);
  return fallback;
}

}  // namespace

int main(int argc, char* argv[]) {
  pmt::ScopeGuard guard(argc, argv);
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--where") plan.where = argv[i + 1];
  for (int i = 1; i < argc; ++i) plan.std_error = plan.std_error || std::string(argv[i]) == "--std";
  plan.rank = flag(argc, argv, "--rank", 0);
  const pmt::MeshShape shape{flag(argc, argv, "--dp", 1), flag(argc, argv, "--tp", 1), flag(argc, argv, "--pp", 1)};
  constexpr std::size_t d = 8, hidden = 16, N = 16;
  try {
#if PMT_ENABLE_MPI
    pmt::comm::Communicator<Backend> world(MPI_COMM_WORLD);
#else
    pmt::comm::Communicator<Backend> world;
#endif
    pmt::Mesh<Backend> mesh(world, shape);
    const pmt::nn::LinearOptions init{true, 0.3};
    Model model(mesh,
                Net(Linear<pmt::TensorSplit<pmt::Col>>(mesh, d, hidden, pmt::RngKey{5, 1}, init), {}, {},
                    Linear<pmt::TensorSplit<pmt::Row>>(mesh, hidden, d, pmt::RngKey{5, 2}, init), {},
                    Linear<pmt::Replicate>(mesh, d, d, pmt::RngKey{5, 3}, init), {}, {},
                    Linear<pmt::Replicate>(mesh, d, 1, pmt::RngKey{5, 4}, init), {}),
                Loss{}, pmt::nn::StagedOptions{stage_plan(shape.pp), 1, "failing"});
    pmt::optim::AdamW<T, Exec> opt(model.parameters(), {});
    pmt::train::Trainer<Model, pmt::optim::AdamW<T, Exec>, Exec, Backend,
                        pmt::Hybrid<pmt::DataParallel<>, pmt::TensorSplit<>, pmt::Pipeline<>>>
        trainer(mesh, model, opt);
    const std::size_t n = N / static_cast<std::size_t>(shape.dp);
    std::vector<Model::Batch> mbs;
    for (int i = 0; i < 4; ++i) {
      Model::Batch b{Act("x", n / 4, d), Act("t", n / 4, 1), n / 4};
      Kokkos::deep_copy(b.input, 0.5);
      Kokkos::deep_copy(b.target, 0.25);
      mbs.push_back(b);
    }
    for (int step = 0; step < 6; ++step) {
      const double loss = trainer.step(mbs, {double(N), 1e-3, 1.0});
      if (world.rank() == 0) std::printf("step %d loss %.6f\n", step, loss);
      if (step == 3 && plan.where == "evaluate") trainer.evaluate(mbs, double(N));
      if (step == 3 && plan.where == "save") {
        if (world.rank() == plan.rank && !model.parameters().empty()) {
          auto v = model.parameters().front()->value;
          Kokkos::deep_copy(Kokkos::subview(v, 0), std::numeric_limits<T>::quiet_NaN());
        }
        pmt::io::CheckpointInfo info;
        info.step  = step;
        info.model = "failing";
        pmt::io::save_checkpoint("failing_rank_ckpt", mesh, opt, info);
      }
    }
    if (world.rank() == 0) std::printf("no failure\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error on rank %d: %s\n", pmt::world_rank(), e.what());
    return 1;
  }
}
