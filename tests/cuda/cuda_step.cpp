// SPDX-License-Identifier: Apache-2.0
// pmt on Kokkos::Cuda: every op family on device Views (matmul through cuBLAS and through the
// portable team kernel, the bf16 product through cuBLAS's bf16 GEMM), then two training steps of a
// Gpt with AdamW on Kokkos::Cuda with NCCL collectives over the MPI ranks (one GPU each), compared
// with the same steps on the host.
//
// Built only where Kokkos has its CUDA backend (the CMake target `cuda_step`); the suite builds it
// on machines without a GPU too (scripts/test_kokkos_cuda.sh), so that the Cuda instantiation of
// every template below keeps compiling and linking.
//
//   mpiexec -n 1 ./cuda_step      (or -n 2 for dp 2 over NCCL)
// Exit status 0 when every comparison holds; prints what it compared.
#include "pmt/pmt.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#if !defined(KOKKOS_ENABLE_CUDA)
#error "cuda_step needs a Kokkos with its CUDA backend"
#endif

namespace {

using Dev  = Kokkos::Cuda;
using Host = Kokkos::DefaultHostExecutionSpace;

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

template <class V>
void fill(const V& v, unsigned seed) {
  auto h = Kokkos::create_mirror_view(v);
  auto f = pmt::detail::flat(h);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> d(-1, 1);
  for (std::size_t i = 0; i < f.extent(0); ++i) f(i) = static_cast<typename V::non_const_value_type>(d(gen));
  Kokkos::deep_copy(v, h);
}

/// max |a - b| / max(1, |b|), a on the device, b on the host.
template <class DV, class HV>
double rel_diff(const DV& a, const HV& b) {
  auto ha      = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
  auto fa      = pmt::detail::flat(ha);
  auto fb      = pmt::detail::flat(b);
  double worst = 0;
  for (std::size_t i = 0; i < fa.extent(0); ++i)
    worst = std::max(worst, std::abs(double(fa(i)) - double(fb(i))) / std::max(1.0, std::abs(double(fb(i)))));
  return worst;
}

template <class T>
using M = Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::CudaSpace>;
template <class T>
using HM = Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::HostSpace>;

/// C = A·Bᵀ on the device (vendor and portable) against the host's result.
template <class T, class Backend>
void check_matmul(const char* name, double tol) {
  const std::size_t m = 96, k = 80, n = 72;
  M<T> A("A", m, k), B("B", n, k), C("C", m, n);
  fill(A, 1), fill(B, 2);
  auto hA = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), A);
  auto hB = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), B);
  HM<T> hC("hC", m, n);
  pmt::ops::matmul<Backend>(Dev(), pmt::ops::Trans::N, pmt::ops::Trans::T, T(1), A, B, T(0), C);
  pmt::ops::matmul(Host(), pmt::ops::Trans::N, pmt::ops::Trans::T, T(1), hA, hB, T(0), hC);
  Kokkos::fence();
  expect(rel_diff(C, hC) < tol, pmt::detail::str("matmul ", name, " on Kokkos::Cuda = host"));
}

/// The bf16 product on the device (cuBLAS's bf16 GEMM, MatmulAuto) against the host's rounded
/// path: the same rounded operands, fp32 sums in another order.
void check_matmul_bf16() {
  const std::size_t m = 96, k = 80, n = 72;
  M<float> A("A", m, k), B("B", n, k), C("C", m, n);
  fill(A, 6), fill(B, 7);
  auto hA = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), A);
  auto hB = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), B);
  HM<float> hC("hC", m, n);
  expect(std::string(pmt::ops::bf16_matmul_isa<Dev>()) == "cublas-bf16",
         "matmul_bf16 on Kokkos::Cuda runs cuBLAS's bf16 GEMM");
  pmt::ops::matmul_bf16(Dev(), pmt::ops::Trans::N, pmt::ops::Trans::T, 1.0f, A, B, 0.0f, C);
  pmt::ops::matmul_bf16<pmt::ops::MatmulVendor>(Host(), pmt::ops::Trans::N, pmt::ops::Trans::T, 1.0f, hA, hB, 0.0f, hC);
  Kokkos::fence();
  expect(rel_diff(C, hC) < 1e-5, "matmul_bf16 (cuBLAS) on Kokkos::Cuda = the host's rounded path");
}

/// Row-wise and elementwise ops on the device against the host.
template <class T>
void check_ops(double tol) {
  const std::size_t rows = 96, cols = 96;  // square: the causal mask compares row and column
  M<T> x("x", rows, cols), y("y", rows, cols), dx("dx", rows, cols);
  using V = Kokkos::View<T*, Kokkos::LayoutRight, Kokkos::CudaSpace>;
  V w("w", cols), b("b", cols), mean("mean", rows), rstd("rstd", rows);
  fill(x, 3), fill(w, 4), fill(b, 5);
  auto hx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
  Kokkos::View<T*, Kokkos::LayoutRight, Kokkos::HostSpace> hw("hw", cols), hb("hb", cols);
  Kokkos::deep_copy(hw, w);
  Kokkos::deep_copy(hb, b);
  HM<T> hy("hy", rows, cols);
  Kokkos::View<T*, Kokkos::LayoutRight, Kokkos::HostSpace> hmean("hmean", rows), hrstd("hrstd", rows);

  pmt::ops::layernorm_forward(Dev(), x, w, b, y, mean, rstd);
  pmt::ops::layernorm_forward(Host(), hx, hw, hb, hy, hmean, hrstd);
  Kokkos::fence();
  expect(rel_diff(y, hy) < tol, "layernorm_forward on Kokkos::Cuda = host");

  pmt::ops::softmax(Dev(), x, y, pmt::ops::Mask::Causal);
  pmt::ops::softmax(Host(), hx, hy, pmt::ops::Mask::Causal);
  Kokkos::fence();
  expect(rel_diff(y, hy) < tol, "causal softmax on Kokkos::Cuda = host");

  pmt::ops::gelu(Dev(), x, y);
  pmt::ops::gelu(Host(), hx, hy);
  pmt::ops::gelu_backward(Dev(), x, y, dx);
  HM<T> hdx("hdx", rows, cols);
  pmt::ops::gelu_backward(Host(), hx, hy, hdx);
  Kokkos::fence();
  expect(rel_diff(dx, hdx) < tol, "gelu and its backward on Kokkos::Cuda = host");

  Kokkos::View<T, Kokkos::LayoutRight, Kokkos::CudaSpace> s("s");
  Kokkos::View<T, Kokkos::LayoutRight, Kokkos::HostSpace> hs("hs");
  pmt::ops::squared_norm(Dev(), x, s);
  pmt::ops::squared_norm(Host(), hx, hs);
  Kokkos::fence();
  expect(rel_diff(s, hs) < tol, "squared_norm on Kokkos::Cuda = host");
}

using Backend = pmt::comm::Nccl;
template <class Exec, class B>
using Model = pmt::nn::Gpt<float, Exec, B>;

/// Two steps of a small Gpt on `Exec` with AdamW (or ZeRO-1's AdamW), dp = world size, data-parallel
/// mode Mode; the per-step losses.
template <class Exec, class B, bool zero = false, class Mode = pmt::Synchronous>
std::vector<double> train(const pmt::comm::Communicator<B>& world, const pmt::train::TrainerOptions& options = {}) {
  using G  = Model<Exec, B>;
  using Op = std::conditional_t<zero, pmt::optim::ZeroAdamW<float, Exec, B>, pmt::optim::AdamW<float, Exec>>;
  using P  = pmt::Hybrid<pmt::DataParallel<Mode>, pmt::TensorSplit<>, pmt::Pipeline<>>;
  pmt::Mesh<B> mesh(world, pmt::MeshShape{world.size(), 1, 1});
  const pmt::nn::GptConfig cfg{96, 32, 2, 64, 4, 7};
  G model(mesh, cfg);
  const pmt::optim::AdamWOptions hyper{0.9, 0.95, 1e-8, 0.1};
  Op opt = [&] {
    if constexpr (zero)
      return Op(model.parameters(), hyper, mesh.comm(pmt::Axis::dp), mesh.comm(pmt::Axis::tp), std::nullopt);
    else
      return Op(model.parameters(), hyper);
  }();
  pmt::train::Trainer<G, Op, Exec, B, P> trainer(mesh, model, opt, Exec(), options);
  const std::size_t per = 2, T = cfg.context;
  std::vector<pmt::train::Microbatch<typename G::Ids>> mbs{
      {typename G::Ids("ids", per * T), typename G::Ids("targets", per * T), per, T}};
  std::vector<double> losses;
  for (int step = 0; step < 2; ++step) {
    auto ids = Kokkos::create_mirror_view(mbs[0].ids), tgt = Kokkos::create_mirror_view(mbs[0].targets);
    for (std::size_t i = 0; i < per * T; ++i) {
      const std::size_t g = (std::size_t(world.rank()) * per * T + i) * 7919 + std::size_t(step) * 104729;
      ids(i)              = static_cast<typename G::Ids::value_type>(g % cfg.vocab);
      tgt(i)              = static_cast<typename G::Ids::value_type>((g / 3) % cfg.vocab);
    }
    Kokkos::deep_copy(mbs[0].ids, ids);
    Kokkos::deep_copy(mbs[0].targets, tgt);
    const double tokens = double(per * T) * world.size();
    losses.push_back(trainer.step(mbs, pmt::train::StepOptions{tokens, 1e-3, 1.0}));
  }
  return losses;
}

}  // namespace

int main(int argc, char* argv[]) {
  pmt::ScopeGuard guard(argc, argv);
  const bool root = pmt::world_rank() == 0;
  if (root) {
    check_matmul<float, pmt::ops::MatmulVendor>("vendor (cuBLAS) float", 1e-4);
    check_matmul<double, pmt::ops::MatmulVendor>("vendor (cuBLAS) double", 1e-12);
    check_matmul<float, pmt::ops::MatmulPortable>("portable float", 1e-4);
    check_matmul<double, pmt::ops::MatmulPortable>("portable double", 1e-12);
    check_ops<float>(1e-5);
    check_ops<double>(1e-12);
    check_matmul_bf16();
  }
  pmt::comm::Communicator<pmt::comm::Mpi> world(MPI_COMM_WORLD);
  pmt::comm::Communicator<Backend> nccl(world);
  const auto dev  = train<Dev, Backend>(nccl);
  const auto zero = train<Dev, Backend, true>(nccl);
  const auto host = train<Host, pmt::comm::Mpi>(world);
  // the other data-parallel modes on the device: bf16-compressed gradients (with dp > 1), DiLoCo
  // and bounded staleness; their first step's loss is the synchronous one's
  pmt::train::TrainerOptions packed(
      pmt::parallel::GradSyncOptions{std::size_t(1) << 20, pmt::parallel::GradCompression::bf16});
  pmt::train::TrainerOptions period;
  period.period = 2, period.staleness = 1;
  const auto bf16   = train<Dev, Backend>(nccl, packed);
  const auto diloco = train<Dev, Backend, false, pmt::DiLoCo<>>(nccl, period);
  const auto stale  = train<Dev, Backend, false, pmt::BoundedStaleness<>>(nccl, period);
  if (root)
    for (const auto* other : {&bf16, &diloco, &stale})
      expect(std::abs((*other)[0] - dev[0]) <= 1e-5 * std::abs(dev[0]),
             pmt::detail::str("first step of a data-parallel mode on Kokkos::Cuda + NCCL: loss ", (*other)[0],
                              ", synchronous ", dev[0]));
  for (std::size_t s = 0; s < dev.size(); ++s)
    if (root) {
      expect(std::abs(dev[s] - host[s]) <= 1e-5 * std::abs(host[s]),
             pmt::detail::str("Gpt step ", s, " on Kokkos::Cuda + NCCL: loss ", dev[s], ", host ", host[s]));
      expect(
          std::abs(zero[s] - dev[s]) <= 1e-5 * std::abs(dev[s]),
          pmt::detail::str("Gpt step ", s, " with ZeRO-1 on Kokkos::Cuda + NCCL: loss ", zero[s], ", AdamW ", dev[s]));
    }
  if (root) std::printf("%s\n", failures == 0 ? "cuda_step: all checks hold" : "cuda_step: FAILED");
  return failures == 0 ? 0 : 1;
}
