// SPDX-License-Identifier: Apache-2.0
// MatmulAuto chooses by measurement: a pinned path is that path bit for bit and measures nothing;
// in one rank the first use decides; in a job of several ranks the key stays pending (the vendor
// path runs) until comm::agree_choices, which gives every rank the same path, also when the
// ranks' own timings disagree (forced here through the table's timing hook).
#include <catch2/catch_test_macros.hpp>

#include "comm/comm_test.hpp"
#include "ops/ops_test.hpp"
#include "pmt/comm/agree.hpp"
#include "pmt/core/random.hpp"
#include "pmt/ops/attention.hpp"
#include "pmt/ops/matmul.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

using pmt::ops::MatmulPath;
using pmt::ops::Trans;
using Host = Kokkos::DefaultHostExecutionSpace;

namespace {

struct Operands {
  Kokkos::View<float**, Kokkos::LayoutRight, Host::memory_space> A, B;
  explicit Operands(int M, int N, int K) : A("A", M, K), B("B", K, N) {
    Host exec;
    pmt::fill_uniform(exec, A, {7, 0}, -1, 1);
    pmt::fill_uniform(exec, B, {7, 1}, -1, 1);
    exec.fence();
  }
};

template <class Tag = pmt::ops::MatmulAuto>
Kokkos::View<float**, Kokkos::LayoutRight, Host::memory_space> product(const Operands& o, Tag = {}) {
  Host exec;
  Kokkos::View<float**, Kokkos::LayoutRight, Host::memory_space> C("C", o.A.extent(0), o.B.extent(1));
  Kokkos::deep_copy(C, 0.5f);  // beta = 1: C is read
  pmt::ops::matmul(exec, Trans::N, Trans::N, 1.0f, o.A, o.B, 1.0f, C, Tag{});
  exec.fence();
  return C;
}

template <class V>
bool same_bits(const V& x, const V& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

/// Restores Auto, the timing hook and an empty table when a test case ends.
struct Reset {
  Reset() { clear(); }
  ~Reset() { clear(); }
  static void clear() {
    pmt::ops::set_matmul_path(MatmulPath::Auto);
    pmt::detail::choice_table().timing_hook = nullptr;
    pmt::clear_measured_choices();
  }
};

std::size_t count_op(std::int64_t op) {
  std::size_t n = 0;
  for (const auto& e : pmt::measured_choices()) n += e.first.op == op ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("matmul path: PMT_MATMUL words parse, others are a ConfigError naming the value", "[matmul][auto]") {
  CHECK(pmt::ops::parse_matmul_path("vendor") == MatmulPath::Vendor);
  CHECK(pmt::ops::parse_matmul_path("portable") == MatmulPath::Portable);
  CHECK(pmt::ops::parse_matmul_path("auto") == MatmulPath::Auto);
  try {
    pmt::ops::parse_matmul_path("blas");
    FAIL("no error");
  } catch (const pmt::ConfigError& e) {
    CHECK(std::string(e.what()).find("PMT_MATMUL is 'blas'; expected vendor, portable or auto") != std::string::npos);
  }
}

#if PMT_ENABLE_CBLAS
TEST_CASE("matmul path: a pinned path is that path bit for bit and measures nothing", "[matmul][auto]") {
  Reset reset;
  const Operands o(67, 45, 129);
  const auto vendor = product(o, pmt::ops::MatmulVendor{}), portable = product(o, pmt::ops::MatmulPortable{});
  pmt::ops::set_matmul_path(MatmulPath::Vendor);
  CHECK(same_bits(product(o), vendor));
  CHECK(pmt::ops::matmul_path_summary() == "matmul pinned: vendor");
  pmt::ops::set_matmul_path(MatmulPath::Portable);
  CHECK(same_bits(product(o), portable));
  CHECK(count_op(pmt::ops::matmul_choice_op) == 0);
}

TEST_CASE("matmul path: auto measures a shape class once; the job agrees on one path", "[matmul][auto][mpi]") {
  Reset reset;
  auto& w     = pmt::test::world();
  const int r = w.rank(), n = w.size();
  const Operands o(64, 96, 80);
  const auto vendor = product(o, pmt::ops::MatmulVendor{}), portable = product(o, pmt::ops::MatmulPortable{});
  // forced disagreement: the vendor path takes 1 s everywhere; the portable path 1.5 s on rank 0
  // (which alone would keep vendor) and 0.1 s elsewhere, so the mean picks portable when n > 1
  pmt::detail::choice_table().timing_hook = [r](const pmt::ChoiceKey&, int path, double) {
    return path == 0 ? 1.0 : (r == 0 ? 1.5 : 0.1);
  };
  const auto first = product(o);
  const auto table = pmt::measured_choices();
  REQUIRE(table.size() == 1);
  const pmt::Choice& c = table[0].second;
  CHECK(c.shape == "64x96x80 NN fp32");
  CHECK(c.seconds[0] == 1.0);
  if (n == 1) {
    CHECK(c.decided());
    CHECK(c.path == 0);  // rank 0 alone: the vendor path is faster
    CHECK(same_bits(first, vendor));
  } else {
    CHECK(!c.decided());  // pending: the vendor path runs, the same on every rank
    CHECK(same_bits(first, vendor));
  }
  // an agreement on a communicator that is not the whole job decides nothing
  pmt::comm::Communicator<pmt::comm::Self> self;
  if (n > 1) CHECK(pmt::comm::agree_choices(self, Host()) == 0);
  // a second shape class, measured on odd ranks only: agreed everywhere all the same
  const Operands small(8, 8, 8);
  if (r % 2 == 1) product(small);
  const int decided = pmt::comm::agree_choices(w, Host());
  CHECK(decided == (n == 1 ? 0 : 2));
  const auto agreed = pmt::measured_choices();
  REQUIRE(agreed.size() == (n > 1 ? 2u : 1u));
  Kokkos::View<std::int64_t*, Kokkos::HostSpace> paths("paths", 2);
  for (std::size_t i = 0; i < agreed.size(); ++i) {
    CHECK(agreed[i].second.decided());
    paths(i) = agreed[i].second.path;
  }
  const int big = agreed.size() == 2 && agreed[0].first.b > agreed[1].first.b ? 0 : (agreed.size() == 2 ? 1 : 0);
  CHECK(agreed[std::size_t(big)].second.path == (n > 1 ? 1 : 0));
  // every rank holds the same paths
  Kokkos::View<std::int64_t*, Kokkos::HostSpace> lo("lo", 2), hi("hi", 2);
  Kokkos::deep_copy(lo, paths);
  Kokkos::deep_copy(hi, paths);
  pmt::comm::all_reduce_host_values(w, Host(), lo, pmt::comm::ReduceOp::Min);
  pmt::comm::all_reduce_host_values(w, Host(), hi, pmt::comm::ReduceOp::Max);
  CHECK((lo(0) == hi(0) && lo(1) == hi(1)));
  // the product now takes the agreed path, bit for bit, and measures nothing more
  CHECK(same_bits(product(o), n > 1 ? portable : vendor));
  CHECK(pmt::measured_choices().size() == agreed.size());
  const std::string summary = pmt::ops::matmul_path_summary(100.0);
  CHECK(summary.find("matmul auto: portable for") == 0);
  CHECK(summary.find("0 pending") != std::string::npos);
}

namespace {
/// Attention forward and backward of fixed inputs (B 2, T 40, C 64, 4 heads: B*H = 8 tasks, as
/// many or more than the threads) on whatever path the settings choose: out, dqkv, and how many
/// of the two calls took the fused path.
struct AttentionRun {
  std::vector<float> out, dqkv;
  std::int64_t fused = 0;
};
AttentionRun attention_run() {
  const std::int64_t fused0 = pmt::detail::attention_fused_calls();
  Host exec;
  const int B = 2, Tn = 40, C = 64, H = 4;
  Kokkos::View<float***, Kokkos::LayoutRight, Host::memory_space> qkv("qkv", B, Tn, 3 * C), dqkv("dqkv", B, Tn, 3 * C);
  Kokkos::View<float***, Kokkos::LayoutRight, Host::memory_space> out("out", B, Tn, C), dout("dout", B, Tn, C);
  pmt::fill_uniform(exec, qkv, {9, 0}, -1, 1);
  pmt::fill_uniform(exec, dout, {9, 1}, -1, 1);
  auto cache = pmt::ops::make_attention_cache<float, Host>(B, Tn, C, H);
  pmt::ops::attention_forward(exec, qkv, out, cache);
  pmt::ops::attention_backward(exec, dout, dqkv, cache);
  exec.fence();
  return {std::vector<float>(out.data(), out.data() + out.size()),
          std::vector<float>(dqkv.data(), dqkv.data() + dqkv.size()), pmt::detail::attention_fused_calls() - fused0};
}
}  // namespace

TEST_CASE("attention path: vendor pins fused, portable pins batched; auto measures the forward once and keeps it",
          "[matmul][auto][attention]") {
  Reset reset;
  if (Host().concurrency() > 8) return;  // fewer heads than threads: only the batched path exists
  pmt::ops::set_matmul_path(MatmulPath::Vendor);
  const auto fused = attention_run();
  pmt::ops::set_matmul_path(MatmulPath::Portable);
  const auto batched = attention_run();
  CHECK(count_op(pmt::ops::attention_choice_op) == 0);
  CHECK((fused.fused == 2 && batched.fused == 0));
  for (const int forced : {0, 1}) {
    Reset again;
    // the timing hook makes `forced` the faster path of attention (and of every product)
    pmt::detail::choice_table().timing_hook = [forced](const pmt::ChoiceKey&, int path, double) {
      return path == forced ? 0.1 : 1.0;
    };
    const auto first = attention_run();
    REQUIRE(count_op(pmt::ops::attention_choice_op) == 1);
    const auto table = pmt::measured_choices();
    const auto entry = *std::find_if(table.begin(), table.end(),
                                     [](const auto& e) { return e.first.op == pmt::ops::attention_choice_op; });
    CHECK(entry.second.shape == "8 heads x T 40 x hs 16 fp32");
    if (pmt::test::world().size() > 1) {
      CHECK(!entry.second.decided());  // pending: the fused (default) path runs until agreement
      CHECK(first.fused == 2);
      CHECK((first.out == fused.out && first.dqkv == fused.dqkv));
      continue;
    }
    CHECK(entry.second.path == forced);
    // forward and backward both took the chosen path, bit for bit; a second call measures nothing
    const AttentionRun& want = forced == 0 ? fused : batched;
    CHECK(first.fused == want.fused);
    CHECK((first.out == want.out && first.dqkv == want.dqkv));
    const AttentionRun again_run = attention_run();
    CHECK((again_run.fused == want.fused && again_run.out == first.out && again_run.dqkv == first.dqkv));
    CHECK(count_op(pmt::ops::attention_choice_op) == 1);
    CHECK(pmt::ops::matmul_path_summary().find(forced == 0 ? "; attention: batched for 0 shape classes, fused for 1"
                                                           : "; attention: batched for 1 shape class, fused for 0") !=
          std::string::npos);
  }
}

TEST_CASE("matmul path: a decided choice is never changed by a later agreement or load", "[matmul][auto]") {
  Reset reset;
  pmt::Choice c;
  c.path  = 1;
  c.state = pmt::Choice::State::Loaded;
  pmt::set_measured_choices({{pmt::ChoiceKey{pmt::ops::matmul_choice_op, 1, 2}, c}});
  c.path = 0;
  pmt::set_measured_choices({{pmt::ChoiceKey{pmt::ops::matmul_choice_op, 1, 2}, c}});
  REQUIRE(pmt::measured_choices().size() == 1);
  CHECK(pmt::measured_choices()[0].second.path == 1);
}

TEST_CASE("bf16 products: where the BLAS has a bf16 GEMM, auto times it against pmt's kernel and takes the faster",
          "[matmul][auto][bf16][mpi]") {
  Reset reset;
  using pmt::ops::Bf16Kernel;
  const auto& gemm = pmt::detail::cblas_bf16_gemm();
  INFO("the BLAS's bf16 GEMM: " << gemm.name << (gemm.failed ? " (failed its check)" : ""));
  CHECK_FALSE(gemm.failed);
#if PMT_CBLAS_MKL
  CHECK(std::string(gemm.name) == "cblas_gemm_bf16bf16f32");
#elif PMT_HAVE_OPENBLAS_INFO
  int major = 0, minor = 0, patch = 0;
  REQUIRE(std::sscanf(openblas_get_config(), "OpenBLAS %d.%d.%d", &major, &minor, &patch) == 3);
  // OpenBLAS has sbgemm since 0.3.10 where built with it: Debian 12's 0.3.21 is not, Debian 13's
  // 0.3.29 (scripts/openblas.sh) is
  if (major > 0 || minor > 3 || (minor == 3 && patch >= 29)) CHECK(std::string(gemm.name) == "cblas_sbgemm");
  CHECK((std::string(gemm.name) == "cblas_sbgemm" || std::string(gemm.name) == "none"));
#endif
  auto& w     = pmt::test::world();
  const int n = w.size();
  const Operands o(64, 96, 80);
  const auto bf16_product = [&] {
    Host exec;
    Kokkos::View<float**, Kokkos::LayoutRight, Host::memory_space> C("C", o.A.extent(0), o.B.extent(1));
    Kokkos::deep_copy(C, 0.5f);  // beta = 1: C is read
    pmt::ops::matmul_bf16(exec, Trans::N, Trans::N, 1.0f, o.A, o.B, 1.0f, C);
    exec.fence();
    return C;
  };
  // the other choices a bf16 product may measure take their default path (vendor sgemm for the
  // rounded path's product, the rounded path before AVX512-BF16), as pending keys do; so pmt's
  // kernel gives the same bits before and after an agreement
  const auto others = [](const pmt::ChoiceKey& key, int path, double s) {
    return key.op == pmt::ops::matmul_choice_op || key.op == pmt::ops::bf16_choice_op ? (path == 0 ? 0.1 : 1.0) : s;
  };
  pmt::detail::choice_table().timing_hook = others;
  // a pinned matmul path measures nothing: pmt's kernel
  pmt::ops::set_matmul_path(MatmulPath::Vendor);
  const auto own = bf16_product();
  pmt::ops::set_matmul_path(MatmulPath::Auto);
  CHECK(count_op(pmt::ops::bf16_vendor_choice_op) == 0);
  if (gemm.fn == nullptr) {  // nothing to time against: pmt's kernel, nothing measured
    CHECK(same_bits(bf16_product(), own));
    CHECK(count_op(pmt::ops::bf16_vendor_choice_op) == 0);
    return;
  }
  pmt::ops::set_bf16_kernel(Bf16Kernel::vendor);
  CHECK(pmt::ops::bf16_kernel<Host>() == Bf16Kernel::vendor);
  CHECK(std::string(pmt::ops::bf16_matmul_isa<Host>()) == "vendor-bf16");
  const auto vendor = bf16_product();
  pmt::ops::set_bf16_kernel(Bf16Kernel::automatic);
  CHECK(count_op(pmt::ops::bf16_vendor_choice_op) == 0);
  CHECK(pmt::test::max_rel_diff(vendor, own) <= 1e-5);  // the same exact products, summed in another order
  for (int forced : {1, 0}) {
    DYNAMIC_SECTION("the " << (forced == 1 ? "vendor's GEMM" : "pmt's kernel") << " timed faster") {
      pmt::detail::choice_table().timing_hook = [forced, others](const pmt::ChoiceKey& key, int path, double s) {
        return key.op != pmt::ops::bf16_vendor_choice_op ? others(key, path, s) : (path == forced ? 0.1 : 1.0);
      };
      const auto first = bf16_product();  // measures; pending (pmt's kernel) in a job of several ranks
      CHECK(count_op(pmt::ops::bf16_vendor_choice_op) == 1);
      CHECK(same_bits(first, n == 1 && forced == 1 ? vendor : own));
      pmt::comm::agree_choices(w, Host());
      const auto again = bf16_product();
      CHECK(same_bits(again, forced == 1 ? vendor : own));
      CHECK(count_op(pmt::ops::bf16_vendor_choice_op) == 1);
      CHECK(pmt::ops::matmul_path_summary().find(
                forced == 1 ? "; bf16: vendor for 1 shape class, pmt for 0 shape classes"
                            : "; bf16: vendor for 0 shape classes, pmt for 1 shape class") != std::string::npos);
    }
  }
}
#endif
