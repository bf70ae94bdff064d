// SPDX-License-Identifier: Apache-2.0
#pragma once
// Calibration: the planner's Machine measured on the ranks that will train, for one Problem:
//   - pmt's own transformer blocks (nn::GptBlock, a stack of up to 4) split over each tp the
//     search will try, forward and backward of each microbatch size, and pmt's whole Gpt of up to
//     4 layers (forward_backward: the rest of a microbatch is its time minus the blocks'), with
//     every rank running them at once, back to back for 0.1 s, in 3 rounds over all shapes (the
//     median): the ranks' contention for cores and memory and the tp all-reduces are in them;
//   - the optimizer per parameter (zero_grad, the norm, AdamW) with every rank at once, over as
//     many values as a replicated rank updates (1 M to 8 M), as the ranks share the memory in a
//     step's update;
//   - on rank 0 alone (the others wait): a GEMM, a triad and a kernel launch; the model scales
//     these by the core share, cores / (ranks on the node x threads per rank), when all ranks
//     compute;
//   - all-reduces of 8 B, 256 KiB and 4 MiB and a reduce-scatter + all-gather of 4 MiB in groups
//     of g consecutive ranks (every group at once), each after a small GEMM, against the same
//     GEMMs alone: latency and bandwidths per group size (the tp and dp all-reduces, ZeRO's pair,
//     the pipeline's p2p);
//   - nodes, when the ranks span them (the launcher's local size, the same host name on blocks of
//     consecutive ranks) or CalibrateOptions::ranks_per_node says so: the link inside a node
//     (all-reduces among a node's ranks) and the network (among the ranks of the same local index
//     on every node, all at once), for Machine::intra and Machine::inter;
//   - the memory per rank: MemAvailable of /proc/meminfo over the ranks of this node (or given);
//     on a GPU, the device's free memory.
// Collective: every rank calls it with the same problem; every rank returns the same Machine
// (Machine::details lists what each piece took). 5-10 s for train_gpt's default model.
//   auto machine = pmt::plan::calibrate(world, problem);
//   auto plan    = pmt::plan::search(problem, machine);

#include <sched.h>
#include <unistd.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "pmt/comm/agree.hpp"
#include "pmt/comm/collectives.hpp"
#include "pmt/comm/communicator.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/core/precision.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/core/workspace.hpp"
#include "pmt/detail/cuda_runtime.hpp"
#include "pmt/nn/gpt.hpp"
#include "pmt/nn/layernorm.hpp"
#include "pmt/ops/detail/matmul_kokkos.hpp"
#include "pmt/ops/elementwise.hpp"
#include "pmt/ops/matmul.hpp"
#include "pmt/ops/reduction.hpp"
#include "pmt/ops/update.hpp"
#include "pmt/plan/planner.hpp"

namespace pmt::plan {

/// \brief How calibrate() measures the machine.
struct CalibrateOptions {
  double window_seconds       = 0.03;  ///< rank 0 repeats each piece timed alone this long (median)
  double block_window_seconds = 0.1;   ///< every rank runs each block shape back to back this long,
  int block_rounds            = 3;     ///< in this many rounds over all shapes (the median)
  double memory_bytes         = 0;     ///< per rank; 0: MemAvailable / ranks on this node
  /// nodes of this many consecutive ranks (Machine::ranks_per_node; their links measured apart);
  /// 0: as the launcher placed the ranks (OMPI_COMM_WORLD_LOCAL_SIZE ..., checked against the
  /// host names), none when all ranks share one node
  int ranks_per_node = 0;
};

namespace detail {

/// MemAvailable (bytes) of this machine, 0 when unknown.
inline double mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024.0;
  return 0;
}
/// Ranks on this node, from the launcher's environment (1 when unknown).
inline int local_ranks() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* s = std::getenv(v)) return std::max(1, std::atoi(s));
  return 1;
}

template <class Backend>
double max_over(const comm::Communicator<Backend>& world, double x, comm::ReduceOp op = comm::ReduceOp::Max) {
  Kokkos::View<double, Kokkos::HostSpace> v("pmt::plan::calibrate::max");
  v() = x;
  comm::all_reduce(world, Kokkos::DefaultHostExecutionSpace(), v, op);
  return v();
}

/// This host's name as a number (FNV-1a, 32 bits: exact in a double).
inline double host_id() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return 0;
  std::uint32_t h = 2166136261u;
  for (const char* c = name; *c; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 16777619u;
  return double(h);
}

/// Ranks per node when the ranks span nodes in blocks of consecutive ranks (every rank agrees);
/// 0 otherwise (one node, or a placement the Mesh's order cannot use), with why in `why`.
template <class Backend>
int spanned_nodes(const comm::Communicator<Backend>& world, std::string& why) {
  const int local = local_ranks();
  const int lo = int(max_over(world, double(local), comm::ReduceOp::Min)), hi = int(max_over(world, double(local)));
  if (hi >= world.size() || hi <= 0) return 0;  // one node (or the launcher does not say)
  if (lo != hi || world.size() % hi != 0) {
    why = pmt::detail::str("the ranks span nodes with ", lo, " to ", hi, " ranks each: one link model for all");
    return 0;
  }
  // consecutive blocks of `hi` ranks must share a host (mpiexec --map-by ppr:N:node, srun block)
  const auto node = world.split(world.rank() / hi, world.rank());
  const double id = host_id();
  if (max_over(world, double(max_over(node, id) != max_over(node, id, comm::ReduceOp::Min))) > 0) {
    why = pmt::detail::str("the ranks span nodes of ", hi,
                           " but not in blocks of consecutive ranks: one link model for all");
    return 0;
  }
  return hi;
}

/// Rank 0 runs `piece` (returns the seconds of its parts) again and again for `window` seconds,
/// at least 3 times after a warm-up, while the other ranks wait; every rank gets the median of
/// each part. Alone, the numbers are stable; calibrate() scales them by the ranks' share of the
/// cores when they compute at once.
template <class Backend, class Piece>
std::vector<double> timed_alone(const comm::Communicator<Backend>& world, double window, Piece&& piece) {
  std::vector<double> result;
  std::size_t parts = 0;
  if (world.rank() == 0) {
    result = piece();  // warm-up (first touch, allocator)
    parts  = result.size();
    std::vector<std::vector<double>> runs(parts);
    Kokkos::Timer timer;
    do {
      const auto t = piece();
      for (std::size_t i = 0; i < parts; ++i) runs[i].push_back(t[i]);
    } while (runs[0].size() < 3 || timer.seconds() < window);
    for (std::size_t i = 0; i < parts; ++i) {
      std::sort(runs[i].begin(), runs[i].end());
      result[i] = runs[i][runs[i].size() / 2];
    }
  }
  Kokkos::View<double*, Kokkos::HostSpace> v("pmt::plan::calibrate::times", 16);
  for (std::size_t i = 0; i < result.size() && i < 16; ++i) v(i) = result[i];
  v(15) = double(parts);
  comm::broadcast(world, Kokkos::DefaultHostExecutionSpace(), v, 0);
  result.assign(static_cast<std::size_t>(v(15)), 0.0);
  for (std::size_t i = 0; i < result.size(); ++i) result[i] = v(i);
  return result;
}

/// Every rank runs `piece` (returns its seconds) at once, after a warm-up, as many times as fit
/// `window` on rank 0 (at least 3), each time after a barrier; returns the slowest rank's median.
template <class Backend, class Piece>
double timed_together(const comm::Communicator<Backend>& world, double window, Piece&& piece) {
  piece();  // first touch, allocator
  world.barrier();
  const double first = piece();
  const int reps     = static_cast<int>(
      max_over(world, world.rank() == 0 ? std::clamp(window / std::max(first, 1e-6), 3.0, 1000.0) : 0.0));
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    world.barrier();
    t.push_back(piece());
  }
  std::sort(t.begin(), t.end());
  return max_over(world, t[t.size() / 2]);
}

/// True when this rank may run on more cores than it has threads (not bound to its own cores).
inline bool unbound(int threads_per_rank) {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > std::max(1, threads_per_rank);
}

/// The share of its speed alone that a rank keeps when every rank of this node computes at once:
/// cores / (ranks on the node x threads per rank), at most 1. The node is the ranks of this host
/// name; its cores are those any of its ranks may run on (the union of their affinity masks:
/// bound one rank per core, or all free on every core, the node's cores count once), at most the
/// online cores. Collective over `world`.
template <class Backend>
double compute_share(const comm::Communicator<Backend>& world, int threads_per_rank) {
  constexpr int max_cpus = 1024;
  const auto node        = world.split(static_cast<int>(static_cast<std::uint32_t>(host_id()) >> 1), world.rank());
  Kokkos::View<std::uint8_t*, Kokkos::HostSpace> mask("pmt::plan::calibrate::cpus", max_cpus);
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < max_cpus && c < CPU_SETSIZE; ++c) mask(c) = CPU_ISSET(c, &set) ? 1 : 0;
  comm::all_reduce(node, Kokkos::DefaultHostExecutionSpace(), mask, comm::ReduceOp::Max);
  int cores = 0;
  for (int c = 0; c < max_cpus; ++c) cores += mask(c);
  const int online = static_cast<int>(std::thread::hardware_concurrency());
  if (online > 0) cores = cores > 0 ? std::min(cores, online) : online;
  if (cores <= 0) return 1.0;
  return std::min(1.0, double(cores) / (double(node.size()) * std::max(1, threads_per_rank)));
}

/// pmt's own transformer blocks (nn::GptBlock) split over tp: a stack of up to 4 (as in the model:
/// each block's weights and activations leave the cache before its backward), forward and
/// backward of a microbatch of b sequences, with every rank of `world` doing the same at once
/// (dp x tp = all ranks), back to back for about `window` seconds (long against the scheduler's
/// time slices when ranks share cores), sequence-parallel or not. Returns the slowest rank's mean
/// forward and backward per block, tp communication and the ranks' contention included.
template <class Backend, class Exec>
std::vector<double> block_on_mesh(const comm::Communicator<Backend>& world, const Exec& exec, const nn::GptConfig& c,
                                  std::size_t b, int tp, bool seq, double window) {
  using T = float;
  const Mesh<Backend> mesh(world, MeshShape{world.size() / tp, tp, 1});
  std::vector<std::unique_ptr<nn::GptBlock<T, Exec, Backend>>> stack;
  for (std::size_t i = 0; i < std::min<std::size_t>(c.layers, 4); ++i)
    stack.push_back(std::make_unique<nn::GptBlock<T, Exec, Backend>>(mesh, c, i, seq));
  const std::size_t N = b * c.context / (seq ? static_cast<std::size_t>(tp) : 1);  // this rank's rows
  Tensor<T, 2, Exec> x("pmt::plan::calibrate::x", N, c.width);
  Kokkos::deep_copy(x, T(0.1));
  double t_f = 0, t_b = 0;
  const auto run = [&] {
    const WorkspaceScope step;  // the buffers a training step reuses (core/workspace.hpp), not new ones
    Kokkos::Timer timer;
    auto y = x;
    for (auto& blk : stack) y = blk->forward(exec, y, b, c.context);
    exec.fence();
    t_f += timer.seconds();
    timer.reset();
    for (auto it = stack.rbegin(); it != stack.rend(); ++it) y = (*it)->backward(exec, y);
    exec.fence();
    t_b += timer.seconds();
  };
  run();  // warm-up; it also sizes the run (the same count on every rank: tp groups stay in step)
  comm::agree_choices(world, exec);  // the matmul paths measured in the warm-up, as training takes them
  const int reps = static_cast<int>(std::clamp(window / std::max(1e-6, max_over(world, t_f + t_b)), 2.0, 1000.0));
  t_f = t_b = 0;
  comm::barrier(world);
  for (int r = 0; r < reps; ++r) run();
  Workspace::instance().release();  // the calibration's buffers do not stay for what runs next
  const double per = double(reps) * double(stack.size());
  return {max_over(world, t_f / per), max_over(world, t_b / per)};
}

/// pmt's whole Gpt (nn::Gpt, up to 4 layers, split over tp, no pipeline): forward_backward of a
/// microbatch of b sequences with every rank at once (sequence-parallel or not), back to back for
/// about `window` seconds. Returns the slowest rank's mean seconds.
template <class Backend, class Exec>
double model_on_mesh(const comm::Communicator<Backend>& world, const Exec& exec, nn::GptConfig c, std::size_t b, int tp,
                     bool seq, double window) {
  c.layers = std::min<std::size_t>(c.layers, 4);
  const Mesh<Backend> mesh(world, MeshShape{world.size() / tp, tp, 1});
  nn::Gpt<float, Exec, Backend> model(mesh, c, nn::GptOptions{{}, 1, false, seq});
  using Ids           = typename nn::Gpt<float, Exec, Backend>::Ids;
  const std::size_t N = b * c.context;
  Ids ids("pmt::plan::calibrate::ids", N), targets("pmt::plan::calibrate::targets", N);
  auto hi = Kokkos::create_mirror_view(ids);
  auto ht = Kokkos::create_mirror_view(targets);
  for (std::size_t n = 0; n < N; ++n) {
    hi(n) = static_cast<std::int32_t>((n * 7 + 3) % c.vocab);
    ht(n) = static_cast<std::int32_t>((n * 7 + 10) % c.vocab);
  }
  Kokkos::deep_copy(ids, hi);
  Kokkos::deep_copy(targets, ht);
  double t       = 0;
  const auto run = [&] {
    const WorkspaceScope step;  // as a Trainer's step: its buffers reused from the previous run
    Kokkos::Timer timer;
    model.forward_backward(exec, ids, targets, b, c.context, double(N));
    exec.fence();
    t += timer.seconds();
  };
  run();
  comm::agree_choices(world, exec);  // the matmul paths measured in the warm-up, as training takes them
  const int reps = static_cast<int>(std::clamp(window / std::max(1e-6, max_over(world, t)), 2.0, 1000.0));
  t              = 0;
  comm::barrier(world);
  for (int r = 0; r < reps; ++r) run();
  Workspace::instance().release();
  return max_over(world, t / reps);
}

}  // namespace detail

/// \brief Bytes a rank's Kokkos keeps for the portable matmul kernel once the kernel ran on Exec:
/// its team scratch (the packed panels of ops::detail's tiling). On host spaces every thread of
/// the pool keeps the request for the rest of the process, plus about 12 KiB of thread data:
/// twice the request before Kokkos 4, once from Kokkos 4 on (measured for float on AVX-512,
/// 1,179,648 bytes a team: 2,371,344 bytes per thread on Kokkos 3.4, 1,191,728 on Kokkos 5.2;
/// Kokkos 4.x is taken to behave as 5.2, unmeasured). So a MatmulAuto process holds it from its
/// first measurement on, even where the vendor path then wins. 0 when the process' path is
/// pinned to a vendor BLAS that serves Exec (the kernel never runs) and on device spaces (team
/// scratch there is not kept per thread).
template <class Exec, class T = float>
double portable_matmul_scratch_bytes(const Exec& exec = Exec()) {
  if constexpr (!is_host_space_v<Exec>) {
    return 0.0;
  } else {
    if (ops::has_vendor_matmul_v<Exec, T> && ops::matmul_path() == ops::MatmulPath::Vendor) return 0.0;
    constexpr double copies = KOKKOS_VERSION < 40000 ? 2.0 : 1.0;
    return double(exec.concurrency()) *
           (copies * double(pmt::detail::matmul_portable_scratch_bytes<Exec, T>()) + 12288.0);
  }
}

/// \brief The Machine measured on `world` for `problem` (see the file comment). Collective.
template <class Backend, class Exec = Kokkos::DefaultHostExecutionSpace>
Machine calibrate(const comm::Communicator<Backend>& world, const Problem& problem, const CalibrateOptions& o = {},
                  const Exec& exec = Exec()) {
  using namespace detail;
  const PrecisionScope products(problem.precision);  // blocks, model and GEMM timed in the planned precision
  Machine mc;
  mc.ranks                = world.size();
  mc.matmul_scratch_bytes = portable_matmul_scratch_bytes<Exec>(exec);
  if (problem.precision == Precision::bf16) {  // what the bf16 products copy
    const ops::Bf16Kernel k = ops::bf16_kernel<Exec>();
    const bool pinned       = ops::bf16_kernel_setting() != ops::Bf16Kernel::automatic;
    mc.bf16_copy_bytes      = k == ops::Bf16Kernel::amx || (k == ops::Bf16Kernel::avx512bf16 && pinned) ? 0.0
                              : k == ops::Bf16Kernel::cublas || k == ops::Bf16Kernel::vendor            ? 2.0
                                                                                                        : 4.0;
  }
  // 1. what the search will ask for (blocks and heads per microbatch size and tp): run it once
  //    with a recording machine, then measure exactly those
  using Key = std::tuple<std::size_t, int, bool>;  // b, tp, sequence-parallel
  std::set<Key> blocks;
  {
    Machine rec       = mc;
    rec.block_seconds = [&blocks](std::size_t b, int tp, bool seq) {
      blocks.insert({b, tp, seq});
      return std::pair<double, double>(1e-3, 2e-3);
    };
    rec.head_seconds = [](std::size_t, int, bool) { return 1e-3; };
    search(problem, rec);
  }
  const auto& c      = problem.model;
  const double share = compute_share(world, exec.concurrency());
  mc.core_share      = share;  // the pieces are timed alone; the model shares the cores
  if (share < 1 && max_over(world, unbound(exec.concurrency()) ? 1.0 : 0.0) > 0)
    mc.advice =
        "the ranks share cores and may run on any of them: the operating system can leave the ranks of "
        "one pipeline stage on one core while those of the next wait on the other (steps up to 2x "
        "slower, from run to run). Bind them, e.g. mpiexec --map-by core --bind-to core:overload-allowed: "
        "rank r then runs on core r mod cores, as the predictions assume";
  std::map<Key, std::pair<double, double>> block_table;
  std::map<Key, double> head_table;
  {  // rounds over all shapes (a slow moment of the machine hits one round of each, not one shape)
    std::map<Key, std::vector<double>> fs, bs, ms;
    const std::size_t L = std::min<std::size_t>(c.layers, 4);
    for (int round = 0; round < o.block_rounds; ++round)
      for (const auto& key : blocks) {
        const auto [b, tp, seq] = key;
        const auto t            = block_on_mesh(world, exec, c, b, tp, seq, o.block_window_seconds);
        fs[key].push_back(t[0]), bs[key].push_back(t[1]);
        ms[key].push_back(model_on_mesh(world, exec, c, b, tp, seq, o.block_window_seconds));
      }
    const auto median = [](std::vector<double>& v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    for (const auto& key : blocks) {
      block_table[key] = {median(fs[key]), median(bs[key])};
      // the rest of a microbatch: embeddings, final norm, LM head, loss, and what surrounds them
      const double whole = median(ms[key]);
      const double rest  = whole - double(L) * (block_table[key].first + block_table[key].second);
      head_table[key]    = std::max(0.05 * whole, rest);
      mc.details += pmt::detail::str("b ", std::get<0>(key), " tp ", std::get<1>(key),
                                     std::get<2>(key) ? " sequence-parallel" : "", " (all ranks at once, median of ",
                                     fs[key].size(), "): block forward ", 1e3 * block_table[key].first,
                                     " ms, backward ", 1e3 * block_table[key].second, " ms; a ", L, "-layer Gpt ",
                                     1e3 * whole, " ms, the rest ", 1e3 * head_table[key], " ms\n");
    }
  }
  mc.block_seconds = [block_table](std::size_t b, int tp, bool seq) { return block_table.at({b, tp, seq}); };
  mc.head_seconds  = [head_table](std::size_t b, int tp, bool seq) { return head_table.at({b, tp, seq}); };
  // one GEMM of the MLP's shape (tokens of one rank's share of the batch x width x 4 width), for
  // the machine's description and the analytic fallback of shapes not measured
  {
    const std::size_t M = std::max<std::size_t>(c.context,
                                                problem.batch * c.context / static_cast<std::size_t>(world.size())),
                      K = c.width, N = 4 * c.width;
    Tensor<float, 2, Exec> A("pmt::plan::calibrate::A", M, K), B("pmt::plan::calibrate::B", K, N),
        C("pmt::plan::calibrate::C", M, N);
    Kokkos::deep_copy(A, 0.5f);
    Kokkos::deep_copy(B, 0.25f);
    ops::matmul(exec, ops::Trans::N, ops::Trans::N, 1.0f, A, B, 0.0f, C);  // measures its path (auto)
    comm::agree_choices(world, exec);
    const double t = timed_alone(world, o.window_seconds, [&] {
      Kokkos::Timer timer;
      ops::matmul(exec, ops::Trans::N, ops::Trans::N, 1.0f, A, B, 0.0f, C);
      exec.fence();
      return std::vector<double>{timer.seconds()};
    })[0];
    mc.gemm_gflops = 2.0 * double(M) * double(N) * double(K) / t / 1e9;
    mc.matmul      = problem.precision == Precision::bf16
                         ? pmt::detail::str("bf16 products (", ops::bf16_matmul_isa<Exec>(), ")")
                         : ops::matmul_path_summary();
  }
  // the optimizer per parameter: zero_grad, the squared norm and AdamW, with every rank at once
  // (a step's ranks update together and share the memory bandwidth) over as many values as a
  // replicated rank updates, 1 M to 8 M (as the model's arrays, beyond the caches), kept as
  // seconds alone (times the share: estimate() divides by it)
  {
    const double P = problem.spec.empty()
                         ? detail::stage_parameters(c, parallel::explicit_stages(c.layers, {c.layers}), 0, 1)
                         : problem.spec.parameters();
    const std::size_t n =
        std::clamp<std::size_t>(static_cast<std::size_t>(P), std::size_t(1) << 20, std::size_t(8) << 20);
    Tensor<float, 1, Exec> w("pmt::plan::calibrate::w", n), g("pmt::plan::calibrate::g", n),
        m("pmt::plan::calibrate::m", n), v("pmt::plan::calibrate::v", n);
    ops::AdamWParams h{1e-3, 0.9, 0.95, 1e-8, 0.1, 1};
    mc.optimizer_seconds_per_value = timed_together(world, o.window_seconds,
                                                    [&] {
                                                      Kokkos::Timer timer;
                                                      Kokkos::deep_copy(exec, g, 0.001f);
                                                      const double norm = ops::squared_norm_value(exec, g);
                                                      ops::adamw_update(exec, w, g, m, v, h);
                                                      exec.fence();
                                                      return timer.seconds() + 0 * norm;
                                                    }) *
                                     share / double(n);
  }
  // 2. memory bandwidth (triad) and kernel launch cost
  {
    const std::size_t n = std::size_t(2) << 20;  // 8 MiB per float array
    Tensor<float, 1, Exec> a("pmt::plan::calibrate::a", n), b("pmt::plan::calibrate::b", n),
        c("pmt::plan::calibrate::c", n);
    Kokkos::deep_copy(b, 1.0f);
    Kokkos::deep_copy(c, 2.0f);
    const auto triad = [&] {
      Kokkos::parallel_for(
          "pmt::plan::calibrate::triad", Kokkos::RangePolicy<Exec>(exec, 0, n),
          KOKKOS_LAMBDA(std::size_t i) { a(i) = b(i) + 0.5f * c(i); });
      exec.fence();
    };
    mc.memory_gbps = 3.0 * 4.0 * double(n) /
                     timed_alone(world, o.window_seconds,
                                 [&] {
                                   Kokkos::Timer timer;
                                   triad();
                                   return std::vector<double>{timer.seconds()};
                                 })[0] /
                     1e9;
    Kokkos::Timer timer;
    comm::barrier(world);
    timer.reset();
    const int launches = 200;
    for (int r = 0; r < launches; ++r) {
      Kokkos::parallel_for(
          "pmt::plan::calibrate::launch", Kokkos::RangePolicy<Exec>(exec, 0, 1),
          KOKKOS_LAMBDA(std::size_t i) { a(i) = 0.0f; });
      exec.fence();
    }
    mc.kernel_seconds = max_over(world, timer.seconds()) / launches;
  }
  // 3. the links: all-reduces of 8 bytes, 256 KiB and 4 MiB, and a reduce-scatter + all-gather of
  //    4 MiB (ZeRO's pair), in groups of g consecutive ranks (as tp groups; every group at once),
  //    each after a GEMM of about 0.1 ms so that the ranks compute in between as in training (on
  //    shared cores a collective then waits for its peers to be scheduled); what they add to the
  //    same GEMMs without them gives latency and bandwidths. Gradient buffers are megabytes: a
  //    shared-memory all-reduce of them runs at a lower rate than of 256 KiB, and Open MPI's
  //    reduce-scatter costs about a whole all-reduce there, not half of one.
  if (world.size() > 1) {
    const std::size_t n = 128;
    Tensor<float, 2, Exec> A("pmt::plan::calibrate::A", n, n), B("pmt::plan::calibrate::B", n, n),
        C("pmt::plan::calibrate::C", n, n);
    Kokkos::View<float*, Kokkos::HostSpace> small("pmt::plan::calibrate::small", 2),
        big("pmt::plan::calibrate::big", 65536), large("pmt::plan::calibrate::large", std::size_t(1) << 20);
    // the link of `group` (g ranks; every rank of the world in a group of g at once)
    const auto time_link = [&](const comm::Communicator<Backend>& group, int g, const std::string& what) {
      Kokkos::View<float*, Kokkos::HostSpace> part("pmt::plan::calibrate::part", large.size() / std::size_t(g));
      const auto whole = Kokkos::subview(large, std::make_pair(std::size_t(0), part.size() * std::size_t(g)));
      // per-iteration seconds without a collective, with each kind: medians of 5 rounds
      constexpr int kinds    = 5;
      const int iters[kinds] = {40, 40, 40, 10, 10};
      std::vector<double> t[kinds];
      for (int round = 0; round < 5; ++round)
        for (int kind = 0; kind < kinds; ++kind) {
          comm::barrier(world);
          Kokkos::Timer timer;
          for (int k = 0; k < iters[kind]; ++k) {
            ops::matmul(exec, ops::Trans::N, ops::Trans::N, 1.0f, A, B, 0.0f, C);
            exec.fence();
            const Kokkos::DefaultHostExecutionSpace host;
            if (kind == 1) comm::all_reduce(group, host, small);
            if (kind == 2) comm::all_reduce(group, host, big);
            if (kind == 3) comm::all_reduce(group, host, large);
            if (kind == 4) {
              comm::reduce_scatter(group, host, whole, part);
              comm::all_gather(group, host, part, whole);
            }
          }
          t[kind].push_back(max_over(world, timer.seconds()) / iters[kind]);
        }
      for (auto& v : t) std::sort(v.begin(), v.end());
      const double ring = 2.0 * (g - 1) / g;
      const double base = t[0][2], lat = std::max(1e-7, t[1][2] - base), big_s = std::max(lat * 1.01, t[2][2] - base),
                   large_s = std::max(lat * 1.01, t[3][2] - base), pair_s = std::max(2 * lat * 1.01, t[4][2] - base);
      const double big_bytes = 4.0 * double(big.size()), large_bytes = 4.0 * double(large.size());
      Machine::Link link{g, lat, ring * big_bytes / (big_s - lat) / 1e9};
      // the bytes beyond the first 256 KiB at the large-buffer rate (Machine::all_reduce)
      link.big_gbps     = ring * (large_bytes - big_bytes) / std::max(1e-9, large_s - big_s) / 1e9;
      link.sharded_gbps = ring * 4.0 * double(whole.size()) / (pair_s - 2 * lat) / 1e9;
      mc.details += pmt::detail::str(what, ": 8 B ", 1e6 * lat, " us, 256 KiB ", 1e6 * big_s, " us (", link.gbps,
                                     " GB/s), 4 MiB ", 1e6 * large_s, " us (", link.big_gbps,
                                     " GB/s beyond 256 KiB); reduce-scatter + all-gather of 4 MiB ", 1e6 * pair_s,
                                     " us (", link.sharded_gbps, " GB/s as one all-reduce)\n");
      return link;
    };
    for (int g = 2; g <= world.size(); ++g) {
      if (world.size() % g) continue;
      mc.links.push_back(time_link(world.split(world.rank() / g, world.rank()), g,
                                   pmt::detail::str("all-reduce of ", g, " ranks amid compute")));
    }
    // 4. nodes: the link inside one (among a node's ranks: the measured group of that size) and
    //    the network (among the ranks of one local index on every node, every index at once, as
    //    the inter-node phase of a hierarchical all-reduce runs), as the ring model's per-step
    //    latency and bandwidth of Machine::intra and Machine::inter
    std::string why;
    const int per_node = o.ranks_per_node > 0 ? o.ranks_per_node : spanned_nodes(world, why);
    pmt::detail::require<ConfigError>(
        per_node >= world.size() || world.size() % std::max(per_node, 1) == 0, "pmt::plan::calibrate",
        [&] { return pmt::detail::str("nodes of ", per_node, " ranks do not divide ", world.size(), " ranks"); });
    if (!why.empty()) mc.details += why + "\n";
    if (per_node > 0 && per_node < world.size()) {
      const int nodes     = world.size() / per_node;
      const auto per_step = [](const Machine::Link& l, int g) {
        return Machine::Link{0, l.latency / (2.0 * (g - 1)), l.big_gbps > 0 ? l.big_gbps : l.gbps};
      };
      mc.ranks_per_node = per_node;
      if (per_node > 1) mc.intra = per_step(*mc.link(per_node), per_node);
      const auto across = time_link(
          world.split(world.rank() % per_node, world.rank()), nodes,
          pmt::detail::str("all-reduce of ", nodes, " ranks on ", nodes, " nodes (every local index at once)"));
      mc.inter = per_step(across, nodes);
      if (per_node == 1) mc.intra = mc.inter;  // never used: no group has two ranks on a node
    }
  }
  mc.memory_bytes = o.memory_bytes > 0 ? o.memory_bytes : mem_available() / local_ranks();
#if PMT_ENABLE_CUDA
  if constexpr (!is_host_space_v<Exec>)  // a GPU rank holds its model in its device's memory
    if (o.memory_bytes <= 0) mc.memory_bytes = pmt::detail::cuda_device_free_bytes();
#endif
  mc.source = pmt::detail::str("calibrated: ", blocks.size(),
                               " block and model shapes and AdamW with all ranks at once; a GEMM, triad, "
                               "launch on rank 0 alone");
  return mc;
}

}  // namespace pmt::plan
