// SPDX-License-Identifier: Apache-2.0
// Schedule tables and their checker, and stage plans (no communication: one rank).
// For every stages <= 8 and microbatches <= 16, GPipe and 1F1B pass the checker, their bubble
// with backward = 2 forward equals (p-1)/(m+p-1), GPipe keeps m microbatches alive on every
// stage and 1F1B min(p - s, m) on stage s. Hand-made broken tables are rejected with the reason.
// With v model chunks per stage (m a multiple of p), interleaved 1F1B and chunked GPipe pass the
// checker with bubble (p-1)/(v m + p-1); interleaved 1F1B keeps 2 (p-s-1) + (v-1) p + 1 (chunk,
// microbatch) pairs alive on stage s, GPipe all m v. Every built table (forward-only ones too)
// receives from each peer in the order the peer sends (NCCL's matching rule), and a hand-made
// 2-stage interleaved table that is right under MPI's tags but not under NCCL's order is refused.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "pmt/core/error.hpp"
#include "pmt/parallel/schedule.hpp"
#include "pmt/parallel/stages.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

using namespace pmt::parallel;
using Catch::Matchers::ContainsSubstring;

TEST_CASE("GPipe and 1F1B pass the checker for all stages <= 8 and microbatches <= 16", "[pipeline][schedule]") {
  int checked = 0;
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      const auto g = check(gpipe(p, m)), f = check(one_f_one_b(p, m));
      const double theory = ScheduleReport::theory(p, m);
      INFO("p " << p << ", m " << m << ": bubble gpipe " << g.bubble << ", 1f1b " << f.bubble << ", theory " << theory);
      CHECK(std::abs(g.bubble - theory) < 1e-12);
      CHECK(std::abs(f.bubble - theory) < 1e-12);
      CHECK(std::abs(g.makespan - 3.0 * (m + p - 1)) < 1e-12);
      for (int s = 0; s < p; ++s) {
        CHECK(g.peak_live[static_cast<std::size_t>(s)] == m);
        CHECK(f.peak_live[static_cast<std::size_t>(s)] == std::min(p - s, m));
      }
      checked += 2;
    }
  CHECK(checked == 2 * 8 * 16);
}

TEST_CASE("interleaved 1F1B and chunked GPipe pass the checker with the interleaved bubble", "[pipeline][schedule]") {
  int checked = 0;
  for (int v = 2; v <= 4; ++v)
    for (int p = 2; p <= 8; ++p)
      for (int m = p; m <= 16; m += p) {
        const auto f = check(one_f_one_b(p, m, v)), g = check(gpipe(p, m, v));
        const double theory = ScheduleReport::theory(p, m, v);
        INFO("v " << v << ", p " << p << ", m " << m << ": bubble interleaved 1f1b " << f.bubble << ", gpipe "
                  << g.bubble << ", theory " << theory);
        CHECK(std::abs(theory - double(p - 1) / double(v * m + p - 1)) < 1e-15);
        CHECK(std::abs(f.bubble - theory) < 1e-12);
        CHECK(std::abs(g.bubble - theory) < 1e-12);
        // stage 0 runs v chunks of 1F1B's actions, and receives and sends for chunks 1 ... v-1 too
        CHECK(one_f_one_b(p, m, v).per_stage[0].size() ==
              one_f_one_b(p, m).per_stage[0].size() * std::size_t(v) + 2 * std::size_t(m * (v - 1)));
        for (int s = 0; s < p; ++s) {
          // live (chunk, microbatch) pairs: the warm-up plus one (Megatron's interleaved memory)
          CHECK(f.peak_live[std::size_t(s)] == std::min(2 * (p - s - 1) + (v - 1) * p + 1, m * v));
          CHECK(g.peak_live[std::size_t(s)] == m * v);
        }
        checked += 2;
      }
  CHECK(checked > 100);
  // the same table without chunks is plain 1F1B
  CHECK(one_f_one_b(4, 8, 1).per_stage == one_f_one_b(4, 8).per_stage);
  CHECK_THROWS_WITH(one_f_one_b(4, 6, 2),
                    ContainsSubstring("6 microbatches on 4 stages with 2 chunks") && ContainsSubstring("use 8"));
  CHECK_THROWS_WITH(gpipe(1, 4, 2), ContainsSubstring("at least 2 stages"));
  CHECK_THROWS_AS(interleaved_one_f_one_b(2, 4, 1), pmt::ConfigError);
}

TEST_CASE("the checker follows chunks round the ring", "[pipeline][schedule]") {
  using A = Action;
  // 2 stages, 2 chunks, 1 microbatch: virtual stages 0 (s0 c0), 1 (s1 c0), 2 (s0 c1), 3 (s1 c1)
  auto sc = gpipe(2, 1, 2);
  const std::vector<A> s0{{A::Forward, 0, 0},  {A::SendAct, 0, 0},  {A::RecvAct, 0, 1},  {A::Forward, 0, 1},
                          {A::SendAct, 0, 1},  {A::RecvGrad, 0, 1}, {A::Backward, 0, 1}, {A::SendGrad, 0, 1},
                          {A::RecvGrad, 0, 0}, {A::Backward, 0, 0}};
  CHECK(sc.per_stage[0] == s0);
  CHECK_NOTHROW(check(sc));
  SECTION("stage 0's chunk 0 is the first virtual stage: it receives nothing") {
    sc.per_stage[0][2].chunk = 0;
    CHECK_THROWS_WITH(check(sc), ContainsSubstring("recv-activation of microbatch 0 in chunk 0") &&
                                     ContainsSubstring("the first stage has no previous stage"));
  }
  SECTION("the last virtual stage sends nothing on") {
    sc.per_stage[1].insert(sc.per_stage[1].begin() + 4, A{A::SendAct, 0, 1});
    CHECK_THROWS_WITH(check(sc), ContainsSubstring("the last stage has no next stage"));
  }
  SECTION("chunk out of range") {
    sc.per_stage[1][0].chunk = 2;
    CHECK_THROWS_WITH(check(sc), ContainsSubstring("chunk out of range"));
  }
  SECTION("crossing chunks: stage 1 takes chunk 1's activation before chunk 0's") {
    auto two = gpipe(2, 2, 2);  // stage 1: chunk 0 of microbatches 0 and 1, then chunk 1
    auto& s1 = two.per_stage[1];
    // swap the first forward group (recv, forward, send of chunk 0 mb 0) with chunk 1 mb 0's
    auto first = std::find(s1.begin(), s1.end(), A{A::RecvAct, 0, 1});
    REQUIRE(first != s1.end());
    std::swap(s1[0], *first);
    std::swap(s1[1], *(first + 1));
    CHECK_THROWS_WITH(check(two), ContainsSubstring("sends and receives cross") || ContainsSubstring("deadlock"));
  }
}

TEST_CASE("the checker rejects a crossing, a deadlock, a missing receive and an action out of order",
          "[pipeline][schedule]") {
  using A = Action;
  SECTION("crossing: stage 1 receives microbatch 1 before 0") {
    auto sc  = gpipe(2, 2);
    auto& s1 = sc.per_stage[1];
    // stage 1 starts: RecvAct 0, Forward 0, RecvAct 1, Forward 1 -> swap the microbatch order
    s1[0] = {A::RecvAct, 1}, s1[1] = {A::Forward, 1}, s1[2] = {A::RecvAct, 0}, s1[3] = {A::Forward, 0};
    CHECK_THROWS_WITH(check(sc), ContainsSubstring("sends and receives cross") && ContainsSubstring("stage 1"));
  }
  SECTION("deadlock: each stage receives before it sends") {
    Schedule sc{"hand-made", 2, 1, {}};
    sc.per_stage = {{{A::RecvGrad, 0}, {A::Forward, 0}, {A::SendAct, 0}, {A::Backward, 0}},
                    {{A::RecvAct, 0}, {A::Forward, 0}, {A::Backward, 0}, {A::SendGrad, 0}}};
    CHECK_THROWS_WITH(check(sc), ContainsSubstring("received before its forward"));
    sc.per_stage[0] = {{A::Forward, 0}, {A::RecvGrad, 0}, {A::SendAct, 0}, {A::Backward, 0}};
    CHECK_THROWS_WITH(check(sc), ContainsSubstring("never sent"));
    // a true wait cycle: stage 1 waits for a gradient it must itself send first
    Schedule cyc{"cycle", 3, 1, {}};
    cyc.per_stage = {
        {{A::Forward, 0}, {A::SendAct, 0}, {A::RecvGrad, 0}, {A::Backward, 0}},
        {{A::RecvAct, 0}, {A::Forward, 0}, {A::SendAct, 0}, {A::RecvGrad, 0}, {A::Backward, 0}, {A::SendGrad, 0}},
        {{A::RecvAct, 0}, {A::Forward, 0}, {A::Backward, 0}, {A::SendGrad, 0}}};
    CHECK_NOTHROW(check(cyc));
    std::swap(cyc.per_stage[2][0], cyc.per_stage[2][1]);  // forward before its input arrives
    CHECK_THROWS_WITH(check(cyc), ContainsSubstring("its activation was not received first"));
  }
  SECTION("a wait cycle between stages is reported as a deadlock naming every waiting stage") {
    Schedule sc = gpipe(2, 2);
    // stage 0 waits for microbatch 0's gradient before sending microbatch 1's activation,
    // while stage 1 runs all forwards before any backward: neither can go on.
    sc.per_stage[0] = {{A::Forward, 0}, {A::SendAct, 0},  {A::Forward, 1},  {A::RecvGrad, 0},
                       {A::SendAct, 1}, {A::Backward, 0}, {A::RecvGrad, 1}, {A::Backward, 1}};
    CHECK_THROWS_WITH(check(sc), ContainsSubstring("deadlock") && ContainsSubstring("stage 0 waits at recv-gradient") &&
                                     ContainsSubstring("stage 1 waits at recv-activation"));
  }
  SECTION("a message nobody receives, and a microbatch without its backward") {
    auto sc = gpipe(2, 1);
    sc.per_stage[1].pop_back();  // stage 1 never sends microbatch 0's gradient ...
    sc.per_stage[1].pop_back();  // ... nor runs its backward
    CHECK_THROWS_WITH(check(sc), ContainsSubstring("deadlock"));
    auto lost = gpipe(2, 1);
    lost.per_stage[0].push_back({A::SendAct, 0});
    CHECK_THROWS_WITH(check(lost), ContainsSubstring("sent twice"));
  }
  SECTION("sizes") {
    CHECK_THROWS_AS(gpipe(0, 4), pmt::ConfigError);
    CHECK_THROWS_AS(one_f_one_b(2, 0), pmt::ConfigError);
  }
}

TEST_CASE("NCCL's rule: every table receives from a peer in the peer's issue order; a crossed one is refused",
          "[pipeline][schedule][nccl]") {
  int checked = 0;
  for (int p = 1; p <= 6; ++p)
    for (int v = 1; v <= 3; ++v)
      for (int m = 1; m <= 8; ++m)
        for (int k = 0; k < 3; ++k) {
          if (v > 1 && (p < 2 || (k == 1 && m % p != 0))) continue;
          const Schedule sc = k == 0 ? gpipe(p, m, v) : k == 1 ? one_f_one_b(p, m, v) : forward_only(p, m, v);
          CHECK_NOTHROW(check(sc));  // check() holds the receives to each peer's issue order
          ++checked;
        }
  CHECK(checked > 200);
  // Stage 1 sends the gradient of microbatch 0 (chunk 1) before the activation of microbatch 1
  // (chunk 0, round the ring to stage 0's chunk 1), but stage 0 receives that activation first:
  // right by MPI's tags (one queue per kind), wrong under NCCL (one queue per pair).
  using A = Action;
  Schedule crossed{"crossed", 2, 2, std::vector<std::vector<Action>>(2), 2};
  crossed.per_stage[0] = {{A::Forward, 0, 0},  {A::SendAct, 0, 0},  {A::Forward, 1, 0},  {A::SendAct, 1, 0},
                          {A::RecvAct, 0, 1},  {A::Forward, 0, 1},  {A::SendAct, 0, 1},  {A::RecvAct, 1, 1},
                          {A::Forward, 1, 1},  {A::SendAct, 1, 1},  {A::RecvGrad, 0, 1}, {A::Backward, 0, 1},
                          {A::SendGrad, 0, 1}, {A::RecvGrad, 1, 1}, {A::Backward, 1, 1}, {A::SendGrad, 1, 1},
                          {A::RecvGrad, 0, 0}, {A::Backward, 0, 0}, {A::RecvGrad, 1, 0}, {A::Backward, 1, 0}};
  crossed.per_stage[1] = {{A::RecvAct, 0, 0},  {A::Forward, 0, 0},  {A::SendAct, 0, 0},  {A::RecvAct, 1, 0},
                          {A::Forward, 1, 0},  {A::RecvAct, 0, 1},  {A::Forward, 0, 1},  {A::Backward, 0, 1},
                          {A::SendGrad, 0, 1}, {A::SendAct, 1, 0},  {A::RecvAct, 1, 1},  {A::Forward, 1, 1},
                          {A::Backward, 1, 1}, {A::SendGrad, 1, 1}, {A::RecvGrad, 0, 0}, {A::Backward, 0, 0},
                          {A::SendGrad, 0, 0}, {A::RecvGrad, 1, 0}, {A::Backward, 1, 0}, {A::SendGrad, 1, 0}};
  CHECK_THROWS_WITH(
      check(crossed),
      ContainsSubstring("stage 0, action 7 (recv-activation of microbatch 1 in chunk 1)") &&
          ContainsSubstring("stage 1 sent the gradient of microbatch 0 (its chunk 1) to this stage first") &&
          ContainsSubstring("NCCL matches the messages between two ranks in issue order"));
  // a forward-only table moves no gradient
  Schedule fwd = forward_only(2, 2);
  fwd.per_stage[0].push_back({A::RecvGrad, 0, 0});
  CHECK_THROWS_WITH(check(fwd), ContainsSubstring("a forward-only schedule moves no gradient"));
}

TEST_CASE(
    "NCCL's stream order: a table whose sends would wait for receives posted later is refused; the "
    "builders move those receives up and keep the bubble",
    "[pipeline][schedule][nccl]") {
  // chunked GPipe as written (every chunk-0 forward first) relies on buffered sends: stage 1's
  // chunk-0 outputs go round the ring to stage 0, which takes them only after its own chunk-0
  // forwards; under NCCL's stream order stage 1's first send then waits for stage 0 while stage 0
  // waits for stage 1 to take its later activations
  using A     = Action;
  const int p = 2, m = 4, v = 2;
  Schedule raw{"chunked gpipe as written", p, m, std::vector<std::vector<Action>>(p), v};
  for (int s = 0; s < p; ++s) {
    for (int c = 0; c < v; ++c)
      for (int i = 0; i < m; ++i) pmt::parallel::detail::push_forward(raw.per_stage[std::size_t(s)], s, p, i, c, v);
    for (int c = v - 1; c >= 0; --c)
      for (int i = 0; i < m; ++i) pmt::parallel::detail::push_backward(raw.per_stage[std::size_t(s)], s, p, i, c, v);
  }
  CHECK_THROWS_WITH(check(raw), ContainsSubstring("deadlock under NCCL's stream order") &&
                                    ContainsSubstring("stage 0 waits at send-activation of microbatch 2 in chunk 0") &&
                                    ContainsSubstring("stage 1 waits at send-activation of microbatch 0 in chunk 0"));
  // the builder's table: stage 0 takes chunk 1's first input in the group of its third send
  const Schedule built = gpipe(p, m, v);
  const auto& s0       = built.per_stage[0];
  const auto third     = std::find(s0.begin(), s0.end(), A{A::SendAct, 2, 0});
  REQUIRE(third != s0.end());
  REQUIRE(third + 1 != s0.end());
  CHECK(*(third + 1) == A{A::RecvAct, 0, 1});
  const auto r = check(built);
  CHECK(std::abs(r.bubble - ScheduleReport::theory(p, m, v)) < 1e-12);
}

TEST_CASE("stage plans cover every layer exactly once", "[pipeline][stages]") {
  const auto p = explicit_stages(5, {3, 2});
  CHECK(p.stages() == 2);
  CHECK((p.begin(0) == 0 && p.end(0) == 3 && p.begin(1) == 3 && p.end(1) == 5));
  CHECK_FALSE(p.even());
  CHECK(p.describe() == "layers [0,3) [3,5) (uneven)");
  CHECK(explicit_stages(4, {2, 2}).even());
  CHECK_THROWS_WITH(explicit_stages(5, {3, 3}), ContainsSubstring("3 + 3 = 6 but the model has 5 layers"));
  CHECK_THROWS_WITH(explicit_stages(5, {5, 0}), ContainsSubstring("stage 1 would hold layers [5, 5)"));
  CHECK_THROWS_WITH(StagePlan({0, 2, 4}, 5), ContainsSubstring("every layer must belong to exactly one stage"));

  const std::vector<LayerCost> equal(8, {1, 10});
  CHECK(balanced_stages(equal, 4).bounds() == std::vector<std::size_t>{0, 2, 4, 6, 8});
  CHECK(balanced_stages(equal, 8).even());
  // a heavy tail (the LM head) moves layers to the earlier stages
  const auto tail = balanced_stages(equal, 2, {}, {0, 20});
  CHECK(tail.bounds() == std::vector<std::size_t>{0, 5, 8});
  CHECK(tail.cost(0, equal, {}, {0, 20}).flops == 50);
  CHECK(tail.cost(1, equal, {}, {0, 20}).flops == 50);
  // 5 equal layers on 2 stages: an uneven plan, every layer once
  const auto five = balanced_stages(std::vector<LayerCost>(5, {1, 1}), 2);
  CHECK((five.count(0) + five.count(1) == 5 && !five.even()));
  CHECK_THROWS_WITH(balanced_stages(std::vector<LayerCost>(3, {1, 1}), 4),
                    ContainsSubstring("3 layers on 4 pipeline stages"));
}
