// SPDX-License-Identifier: Apache-2.0
// Schedule tables and their checker, and stage plans (no communication: one rank).
// For every stages <= 8 and microbatches <= 16, GPipe and 1F1B pass the checker, their bubble
// with backward = 2 forward equals (p-1)/(m+p-1), GPipe keeps m microbatches alive on every
// stage and 1F1B min(p - s, m) on stage s. Hand-made broken tables are rejected with the reason.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "pmt/core/error.hpp"
#include "pmt/parallel/schedule.hpp"
#include "pmt/parallel/stages.hpp"

#include <algorithm>
#include <cmath>
#include <string>

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

TEST_CASE("the checker rejects a crossing, a deadlock, a missing receive and an action out of order", "[pipeline][schedule]") {
  using A = Action;
  SECTION("crossing: stage 1 receives microbatch 1 before 0") {
    auto sc = gpipe(2, 2);
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
    cyc.per_stage = {{{A::Forward, 0}, {A::SendAct, 0}, {A::RecvGrad, 0}, {A::Backward, 0}},
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
    sc.per_stage[0] = {{A::Forward, 0}, {A::SendAct, 0}, {A::Forward, 1}, {A::RecvGrad, 0}, {A::SendAct, 1},
                       {A::Backward, 0}, {A::RecvGrad, 1}, {A::Backward, 1}};
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
