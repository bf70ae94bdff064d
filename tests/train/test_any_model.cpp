// SPDX-License-Identifier: Apache-2.0
// Any model, not just the GPT: a user's Chain and loss (nn::StagedModel) trained by the Trainer
// on every dp x tp x pp layout of the world (pp 1, 2, 4), with GPipe and 1F1B, with one and two
// model chunks per stage (interleaved), with ZeRO-1, ZeRO-2 and ZeRO-3, gives the per-step global losses and
// final parameters of the one-rank run on the whole global batch (design invariant 4). The model
// is an 11-layer MLP, Linear<Col> -> Gelu -> Dropout<Sharded> -> Linear<Row> -> Relu ->
// Dropout -> Linear<Col> -> Silu -> Linear<Row> -> Tanh -> Linear<Replicate>, as a regressor
// (MseLoss) and as a 4-class classifier (CrossEntropyLoss): equal losses and parameters also
// prove the dropout masks layout-independent (over dp rows, tp columns, stages and
// microbatches). Bounds (double): per-step losses, each parameter norm-wise and every element
// relative <= 1e-10. Also: the contract's extents at every cut, the balanced plan, bad input to
// a stage, a plan of the wrong size, evaluation mode keeping no activation, and dropout's rate;
// recomputation's bit-for-bit parameters and lower peak; and steady-state steps allocating
// nothing (the workspace), with and without recomputation.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "../comm/comm_test.hpp"
#include "../nn/model_test.hpp"
#include "pmt/nn/activation.hpp"
#include "pmt/nn/chain.hpp"
#include "pmt/nn/dropout.hpp"
#include "pmt/nn/linear.hpp"
#include "pmt/nn/loss.hpp"
#include "pmt/nn/staged_model.hpp"
#include "pmt/obs/memory.hpp"
#include "pmt/optim/clip.hpp"
#include "pmt/optim/optimizers.hpp"
#include "pmt/optim/zero.hpp"
#include "pmt/optim/zero2.hpp"
#include "pmt/optim/zero3.hpp"
#include "pmt/train/trainer.hpp"
#include "train_test.hpp"

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

using Host    = Kokkos::DefaultHostExecutionSpace;
using Backend = pmt::test::World::backend;
using T       = double;

namespace {

template <class P>
using Linear                 = pmt::nn::Linear<T, P, Host, Backend>;
using Col                    = Linear<pmt::TensorSplit<pmt::Col>>;
using Row                    = Linear<pmt::TensorSplit<pmt::Row>>;
using Rep                    = Linear<pmt::Replicate>;
using Gelu                   = pmt::nn::Gelu<T, Host>;
using Relu                   = pmt::nn::Relu<T, Host>;
using Silu                   = pmt::nn::Silu<T, Host>;
using Tanh                   = pmt::nn::Tanh<T, Host>;
using DropS                  = pmt::nn::Dropout<T, Host, pmt::Sharded, Backend>;
using DropR                  = pmt::nn::Dropout<T, Host, pmt::Replicated, Backend>;
using Net                    = pmt::nn::Chain<Col, Gelu, DropS, Row, Relu, DropR, Col, Silu, Row, Tanh, Rep>;
constexpr std::size_t layers = 11;
using Act                    = pmt::Tensor<T, 2, Host>;

constexpr std::size_t d = 8, hidden = 16, N_global = 32, classes = 4;
constexpr std::uint64_t seed = 77;
constexpr int Steps          = 4;

Net make_net(const pmt::Mesh<Backend>& mesh, std::size_t out) {
  const auto key = [](std::uint32_t s) { return pmt::RngKey{seed, s}; };
  const pmt::nn::LinearOptions init{true, 0.3};
  return Net(Col(mesh, d, hidden, key(1), init), Gelu(), DropS(mesh, 0.25, key(11)), Row(mesh, hidden, d, key(2), init),
             Relu(), DropR(mesh, 0.125, key(12)), Col(mesh, d, hidden, key(3), init), Silu(),
             Row(mesh, hidden, d, key(4), init), Tanh(), Rep(mesh, d, out, key(5), init));
}

/// The loss, the target type and the output width of the regressor (MSE) and the classifier.
template <bool Classifier>
struct Task {
  using Loss  = std::conditional_t<Classifier, pmt::nn::CrossEntropyLoss<T, Host>, pmt::nn::MseLoss<T, Host>>;
  using Model = pmt::nn::StagedModel<Net, Loss>;
  using Batch = typename Model::Batch;
  static constexpr std::size_t out = Classifier ? classes : 1;

  /// Rows [row0, row0 + n) of step `step`'s global batch: x ~ N(0, 1) keyed by the global index.
  static Batch batch(int step, std::size_t row0, std::size_t n) {
    Batch b;
    b.rows  = n;
    b.input = Act("x", n, d);
    pmt::GlobalSlice rows;
    rows.extent[0] = N_global, rows.extent[1] = d, rows.offset[0] = row0;
    pmt::fill_normal(Host(), b.input, pmt::RngKey{seed, 1000u + static_cast<std::uint32_t>(step)}, 0.0, 1.0, rows);
    Host().fence();
    if constexpr (Classifier) {
      b.target = typename Loss::target_type("t", n);
      for (std::size_t i = 0; i < n; ++i) {
        const double s = b.input(i, 0) + 0.5 * b.input(i, 1) - b.input(i, 2) * b.input(i, 3);
        b.target(i)    = s < -0.5 ? 0 : s < 0.2 ? 1 : s < 0.9 ? 2 : 3;
      }
    } else {
      b.target = Act("t", n, 1);
      for (std::size_t i = 0; i < n; ++i)
        b.target(i, 0) = std::sin(b.input(i, 0) + b.input(i, 1)) + 0.5 * b.input(i, 2) * b.input(i, 3);
    }
    return b;
  }
};

pmt::train::StepOptions options(int step) {
  return {double(N_global), pmt::optim::warmup_cosine(step, 1, Steps, 3e-2, 3e-3), 0.5};
}
const pmt::optim::AdamWOptions hyper{0.9, 0.95, 1e-8, 0.1};

template <bool Classifier>
struct Reference {
  using Model = typename Task<Classifier>::Model;
  std::unique_ptr<pmt::Mesh<Backend>> mesh;
  std::unique_ptr<Model> model;
  std::vector<double> losses;
  std::map<std::string, pmt::Parameter<T, Host>*> params;

  Reference() {
    const auto& w = pmt::test::world();
    mesh          = std::make_unique<pmt::Mesh<Backend>>(w.split(w.rank(), 0), pmt::MeshShape{});
    model = std::make_unique<Model>(*mesh, make_net(*mesh, Task<Classifier>::out), typename Task<Classifier>::Loss{},
                                    pmt::nn::StagedOptions{{}, 1, "mlp"});
    pmt::optim::AdamW<T, Host> opt(model->parameters(), hyper);
    pmt::train::Trainer<Model, pmt::optim::AdamW<T, Host>, Host, Backend> tr(*mesh, *model, opt);
    for (int step = 0; step < Steps; ++step)
      losses.push_back(tr.step({Task<Classifier>::batch(step, 0, N_global)}, options(step)));
    for (auto* p : model->parameters()) params[p->name] = p;
  }
};

/// Trains the layout and compares with the reference on this rank.
template <bool Classifier, int Zero = 0>
bool matches(const Reference<Classifier>& ref, pmt::MeshShape shape, pmt::parallel::ScheduleKind kind, int chunks) {
  using Model = typename Task<Classifier>::Model;
  using Opt =
      std::conditional_t<Zero == 3, pmt::optim::Zero3AdamW<T, Host, Backend>,
                         std::conditional_t<Zero == 2, pmt::optim::Zero2AdamW<T, Host, Backend>,
                                            std::conditional_t<Zero == 1, pmt::optim::ZeroAdamW<T, Host, Backend>,
                                                               pmt::optim::AdamW<T, Host>>>>;
  using Policy         = pmt::Hybrid<pmt::DataParallel<>, pmt::TensorSplit<>, pmt::Pipeline<>>;
  constexpr double tol = 1e-10;
  pmt::Mesh<Backend> mesh(pmt::test::world(), shape);
  Model par(mesh, make_net(mesh, Task<Classifier>::out), typename Task<Classifier>::Loss{},
            pmt::nn::StagedOptions{{}, chunks, "mlp"});
  Opt opt = [&] {
    if constexpr (Zero == 3)
      return Opt(par.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp), mesh.comm(pmt::Axis::pp));
    else if constexpr (Zero == 2)  // buckets of 1 KiB: several per stage
      return Opt(par.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp), mesh.comm(pmt::Axis::pp),
                 {}, 1 << 10);
    else if constexpr (Zero == 1)
      return Opt(par.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp), mesh.comm(pmt::Axis::pp));
    else
      return Opt(par.parameters(), hyper);
  }();
  pmt::train::Trainer<Model, Opt, Host, Backend, Policy> tr(mesh, par, opt, Host(), /*bucket_bytes=*/1 << 10);
  tr.set_schedule(kind);
  const std::size_t local = N_global / static_cast<std::size_t>(shape.dp);
  const std::size_t first = local * static_cast<std::size_t>(mesh.coord(pmt::Axis::dp));
  const std::size_t m = std::min<std::size_t>(4, local), per = local / m;
  double worst_loss = 0;
  for (int step = 0; step < Steps; ++step) {
    std::vector<typename Model::Batch> mbs;
    for (std::size_t i = 0; i < m; ++i) mbs.push_back(Task<Classifier>::batch(step, first + i * per, per));
    const double l = tr.step(mbs, options(step));
    const double r = ref.losses[static_cast<std::size_t>(step)];
    worst_loss     = std::max(worst_loss, std::abs(l - r) / std::abs(r));
  }
  if constexpr (Zero == 3) opt.gather_all();  // the parameters whole, to compare
  double worst_param = 0, worst_elem = 0;
  bool named = true;
  for (auto* p : par.parameters()) {
    auto it = ref.params.find(p->name);
    if (it == ref.params.end()) {
      named = false;
      continue;
    }
    worst_param = std::max(worst_param, pmt::test::shard_norm_error(*p, *it->second, 1e-6));
    worst_elem  = std::max(worst_elem, pmt::test::shard_error(*p, *it->second, false, 1e-6));
  }
  UNSCOPED_INFO("rank " << pmt::test::world().rank() << " (" << mesh.where() << ", " << par.plan().describe()
                        << "): worst loss difference " << worst_loss << ", worst parameter " << worst_param
                        << " (elementwise " << worst_elem << "), names matched " << named << ", "
                        << par.parameters().size() << " parameters here");
  return named && worst_loss <= tol && worst_param <= tol && worst_elem <= tol;
}

template <bool Classifier>
void every_layout() {
  const int n = pmt::test::world().size();
  const Reference<Classifier> ref;
  for (int pp = 1; pp <= std::min(n, 4); pp *= 2)
    for (int dp = 1; dp <= n / pp; dp *= 2) {
      const int tp = n / pp / dp;
      for (auto kind : {pmt::parallel::ScheduleKind::OneFOneB, pmt::parallel::ScheduleKind::GPipe})
        for (int chunks = 1; chunks <= 2; ++chunks) {
          if (pp == 1 && (kind == pmt::parallel::ScheduleKind::GPipe || chunks > 1)) continue;
          DYNAMIC_SECTION("dp " << dp << " x tp " << tp << " x pp " << pp << " x " << chunks << " chunks, "
                                << pmt::parallel::schedule_name(kind)) {
            CHECK(pmt::test::all_ranks(matches<Classifier>(ref, {dp, tp, pp}, kind, chunks)));
          }
        }
      DYNAMIC_SECTION("dp " << dp << " x tp " << tp << " x pp " << pp << ", ZeRO-1") {
        CHECK(
            pmt::test::all_ranks(matches<Classifier, 1>(ref, {dp, tp, pp}, pmt::parallel::ScheduleKind::OneFOneB, 1)));
      }
      DYNAMIC_SECTION("dp " << dp << " x tp " << tp << " x pp " << pp << ", ZeRO-2, "
                            << (pp > 1 ? "GPipe x 2 chunks" : "1F1B")) {
        const auto kind = pp > 1 ? pmt::parallel::ScheduleKind::GPipe : pmt::parallel::ScheduleKind::OneFOneB;
        CHECK(pmt::test::all_ranks(matches<Classifier, 2>(ref, {dp, tp, pp}, kind, pp > 1 ? 2 : 1)));
      }
      DYNAMIC_SECTION("dp " << dp << " x tp " << tp << " x pp " << pp << ", ZeRO-3, "
                            << (pp > 1 ? "1F1B x 2 chunks" : "1F1B")) {
        CHECK(pmt::test::all_ranks(
            matches<Classifier, 3>(ref, {dp, tp, pp}, pmt::parallel::ScheduleKind::OneFOneB, pp > 1 ? 2 : 1)));
      }
    }
}

}  // namespace

static_assert(pmt::parallel::check_stage_module<Task<false>::Model, Host>());

TEST_CASE("a user's Chain trains through the Trainer on every layout like one rank: regressor",
          "[train][any_model][mpi]") {
  every_layout<false>();
}

TEST_CASE("a user's Chain trains through the Trainer on every layout like one rank: classifier",
          "[train][any_model][mpi]") {
  every_layout<true>();
}

TEST_CASE("StagedModel: extents at the cuts, balanced plan, errors", "[train][any_model]") {
  const auto& w = pmt::test::world();
  const pmt::Mesh<Backend> one(w.split(w.rank(), 0), pmt::MeshShape{});
  using Model = Task<false>::Model;
  // the widths entering each layer on one rank
  Model whole(one, make_net(one, 1), {},
              pmt::nn::StagedOptions{pmt::parallel::explicit_stages(layers, {layers}), 1, ""});
  const auto b = Task<false>::batch(0, 0, 5);
  CHECK(whole.input_extent(0, b) == std::array<std::size_t, 2>{5, d});
  CHECK(whole.output_extent(0, b) == std::array<std::size_t, 2>{5, 1});
  CHECK(whole.net().widths(d) == std::vector<std::size_t>{d, hidden, hidden, hidden, d, d, d, hidden, hidden, d, d, 1});
  // a plan for another number of stages, and more virtual stages than layers
  CHECK_THROWS_WITH(
      Model(one, make_net(one, 1), {}, pmt::nn::StagedOptions{pmt::parallel::explicit_stages(layers, {4, 7}), 1, ""}),
      Catch::Matchers::ContainsSubstring("the stage plan (layers [0,4) [4,11) (uneven)) is for 2 stages"));
  CHECK_THROWS_AS(Model(one, make_net(one, 1), {}, pmt::nn::StagedOptions{{}, 12, ""}), pmt::ConfigError);
  // the default plan balances by parameters: each Linear weighs, the activations barely
  const pmt::nn::StagedOptions four{{}, 4, ""};
  Model quartered(one, make_net(one, 1), {}, four);
  CHECK(quartered.plan().stages() == 4);
  for (int k = 0; k < 4; ++k) CHECK(quartered.end(k) > quartered.begin(k));
  // a batch whose input is not (rows, d)
  auto bad    = Task<false>::batch(0, 0, 5);
  bad.rows    = 4;
  double loss = 0;
  CHECK_THROWS_WITH(whole.forward_chunk(Host(), 0, bad, Act(), 1.0, &loss),
                    Catch::Matchers::ContainsSubstring("the batch's input is (5, 8) for 4 rows; expected (4, 8)"));
  // an MSE target of the wrong shape (a forward by hand: its random keys from a RandomScope)
  const pmt::RandomScope keys(0, 0);
  auto wrong   = Task<false>::batch(0, 0, 5);
  wrong.target = Act("t", 5, 2);
  CHECK_THROWS_WITH(whole.forward_chunk(Host(), 0, wrong, Act(), 1.0, &loss),
                    Catch::Matchers::ContainsSubstring("pmt::nn::MseLoss"));
}

TEST_CASE("evaluation mode keeps no activation; dropout drops at its rate and is the identity there",
          "[nn][any_model]") {
  const auto& w = pmt::test::world();
  const pmt::Mesh<Backend> one(w.split(w.rank(), 0), pmt::MeshShape{});
  using Model = Task<false>::Model;
  Model model(one, make_net(one, 1), {}, {});
  const auto b = Task<false>::batch(0, 0, N_global);
  auto& mem    = pmt::obs::MemoryTracker::instance();
  {
    double unused = 0;
    CHECK_THROWS_WITH(model.forward_chunk(Host(), 0, b, Act(), double(N_global), &unused),
                      Catch::Matchers::ContainsSubstring("pmt::nn::Dropout::forward") &&
                          Catch::Matchers::ContainsSubstring("pmt::RandomScope"));
  }
  model.predict(Host(), b.input);  // the first products choose their matmul path (and keep its buffers)
  mem.enable();
  // predict (pmt::NoGrad inside): only the output (N, 1) outlives the call
  const auto before = mem.current_bytes();
  Act y             = model.predict(Host(), b.input);
  CHECK(mem.current_bytes() - before == y.size() * sizeof(T));
  // the same forward with gradients on keeps every layer's input for the backward (run by hand,
  // outside a Trainer: the random keys come from a RandomScope, and without one Dropout refuses)
  double loss = 0;
  const pmt::RandomScope keys(/*step=*/0, /*first global row=*/0);
  const auto before_train = mem.current_bytes();
  model.forward_chunk(Host(), 0, b, Act(), double(N_global), &loss);
  const auto kept = mem.current_bytes() - before_train;
  UNSCOPED_INFO("training forward keeps " << kept << " bytes");
  CHECK(kept > N_global * (d + hidden) * sizeof(T));
  model.backward_chunk(Host(), 0, Act());
  mem.enable(false);
  // dropout: the share of zeros is p; under NoGrad the output is the input itself
  DropR drop(one, 0.25, pmt::RngKey{seed, 99});
  Act x("x", 400, 50);
  Kokkos::deep_copy(x, 1.0);
  const Act z = drop.forward(Host(), x);
  Host().fence();
  std::size_t zeros = 0, unscaled = 0;  // kept elements are scaled by 1 / (1 - p)
  for (std::size_t i = 0; i < z.extent(0); ++i)
    for (std::size_t j = 0; j < z.extent(1); ++j) {
      zeros += z(i, j) == 0;
      unscaled += z(i, j) != 0 && z(i, j) != 1.0 / 0.75;
    }
  CHECK(unscaled == 0);
  CHECK(std::abs(double(zeros) / 20000 - 0.25) < 0.02);
  drop.backward(Host(), z);
  {
    const pmt::NoGrad eval;
    CHECK(drop.forward(Host(), x).data() == x.data());
  }
  CHECK_THROWS_AS(DropR(one, 1.0, pmt::RngKey{}), pmt::ConfigError);
}

TEST_CASE("activation recomputation: the same parameters bit for bit, a lower peak on a pipeline stage",
          "[train][any_model][recompute][mpi]") {
  const auto& w = pmt::test::world();
  const int n   = w.size();
  if (n < 2) return;  // the saving shows where a stage holds several microbatches: pp 2, GPipe
  using Model  = Task<false>::Model;
  using Opt    = pmt::optim::AdamW<T, Host>;
  using Policy = pmt::Hybrid<pmt::DataParallel<>, pmt::TensorSplit<>, pmt::Pipeline<>>;
  const pmt::MeshShape shape{1, n / 2, 2};
  auto& mem = pmt::obs::MemoryTracker::instance();
  struct Result {
    std::vector<std::vector<T>> values;
    std::uint64_t peak = 0;
  };
  // recomputation as a policy type: Recompute<Full> in the Hybrid, the model built with its options
  using Recomputing = pmt::Hybrid<pmt::DataParallel<>, pmt::TensorSplit<>, pmt::Pipeline<>, pmt::Recompute<pmt::Full>>;
  const auto train  = [&](auto policy) {
    using P = decltype(policy);
    pmt::Mesh<Backend> mesh(w, shape);
    Model model(mesh, make_net(mesh, 1), {}, pmt::nn::staged_options<P>(mesh, pmt::nn::StagedOptions{{}, 1, "mlp"}));
    CHECK(model.recomputes() == pmt::activation_policy<P>::full);
    Opt opt(model.parameters(), hyper);
    pmt::train::Trainer<Model, Opt, Host, Backend, P> tr(mesh, model, opt);
    tr.set_schedule(pmt::parallel::ScheduleKind::GPipe);  // all 8 microbatches live on stage 0
    Result r;
    for (int step = 0; step < 3; ++step) {
      std::vector<Model::Batch> mbs;
      for (std::size_t i = 0; i < 8; ++i) mbs.push_back(Task<false>::batch(step, i * 4, 4));
      mem.enable();
      pmt::Workspace::instance().release();  // the step allocates its memory afresh, and is measured
      mem.reset_peak();
      const auto base = mem.current_bytes();
      tr.step(mbs, options(step));
      r.peak = std::max<std::uint64_t>(r.peak, mem.peak_bytes() - base);
      mem.enable(false);
    }
    for (auto* p : model.parameters()) {
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), p->value);
      r.values.emplace_back(h.data(), h.data() + h.size());
    }
    return r;
  };
  train(Policy{});  // the first products measure their matmul paths; both runs below use the decided ones
  const Result plain = train(Policy{}), recomputed = train(Recomputing{});
  UNSCOPED_INFO("rank " << w.rank() << ": step peak above the model " << plain.peak << " bytes, with recomputation "
                        << recomputed.peak);
  CHECK(pmt::test::all_ranks(plain.values == recomputed.values));
  // stage 0 keeps 8 microbatches' activations of its layers without, 8 inputs with recomputation
  const pmt::Mesh<Backend> probe(w, shape);
  if (probe.coord(pmt::Axis::pp) == 0) CHECK(recomputed.peak < plain.peak);
}

TEST_CASE("a user's Chain: a training step after the first allocates nothing (with recomputation too)",
          "[train][any_model][workspace][mpi]") {
  const auto& w              = pmt::test::world();
  const int n                = w.size();
  using Model                = Task<true>::Model;  // the classifier: cross-entropy, dropout
  using Opt                  = pmt::optim::AdamW<T, Host>;
  using Policy               = pmt::Hybrid<pmt::DataParallel<>, pmt::TensorSplit<>, pmt::Pipeline<>>;
  const pmt::MeshShape shape = n >= 2 ? pmt::MeshShape{1, n / 2, 2} : pmt::MeshShape{};
  for (bool recompute : {false, true}) {
    DYNAMIC_SECTION("tp " << shape.tp << " x pp " << shape.pp << (recompute ? ", recomputation" : "")) {
      pmt::Mesh<Backend> mesh(w, shape);
      Model model(mesh, make_net(mesh, Task<true>::out), {}, pmt::nn::StagedOptions{{}, 1, "mlp", recompute});
      Opt opt(model.parameters(), hyper);
      pmt::train::Trainer<Model, Opt, Host, Backend, Policy> tr(mesh, model, opt);
      tr.set_schedule(pmt::parallel::ScheduleKind::GPipe);
      std::vector<std::vector<Model::Batch>> steps(4);
      for (int step = 0; step < 4; ++step)
        for (std::size_t i = 0; i < 4; ++i) steps[std::size_t(step)].push_back(Task<true>::batch(step, i * 8, 8));
      for (int step = 0; step < 2; ++step) tr.step(steps[std::size_t(step)], options(step));
      const auto a = pmt::test::allocations_of([&] {
        for (int step = 2; step < 4; ++step) tr.step(steps[std::size_t(step)], options(step));
      });
      UNSCOPED_INFO("rank " << w.rank() << ": " << a.count << " allocations in steps 3 and 4:" << a.names());
      CHECK(pmt::test::all_ranks(a.steady(shape.pp)));
    }
  }
}
