// SPDX-License-Identifier: Apache-2.0
#pragma once
// Pipeline schedules as tables, and their checker.
// A Schedule holds, for each of p stages, the ordered list of actions that stage performs for m
// microbatches: Forward i, Backward i, SendAct i (activation to stage s+1), RecvAct i (from s-1),
// SendGrad i (activation gradient to s-1), RecvGrad i (from s+1). It is built before running;
// the runner executes it literally.
//   GPipe: all forwards, then all backwards (m microbatches of activations alive per stage).
//   1F1B:  warm-up of p-s-1 forwards on stage s, then one forward / one backward in turn, then a
//          cool-down of backwards (at most p-s microbatches alive on stage s, so p on stage 0).
// check() simulates the table for all stages together under the runner's semantics (sends do not
// block; a receive blocks until its message was sent; messages between two stages of one kind
// arrive in the order sent), with a forward costing `t_forward` and a backward `t_backward`
// time units, and proves: every action appears exactly where the data it needs exists (a forward
// after its input arrived, a backward after its forward and its gradient), every send has its
// receive in the same order on the other side, nothing is left unreceived, and no stage waits
// forever; and that the receives from each peer stage come in the order that peer issues its
// sends of both kinds together (NCCL's rule: messages between a pair match in issue order,
// whatever their tags), so the runner is right under MPI's tag matching and NCCL's alike; and
// that the table cannot deadlock under NCCL's stream order either: there each run of
// consecutive send/receive actions of a stage is one group, posted together, and a group
// completes only when every one of its messages is matched by a posted operation of the peer
// (sends are not buffered; a stage does nothing else until its group completes). A
// forward-only table (forward_only: evaluation) moves no gradient. It reports the makespan, each stage's busy time, the
// bubble (the idle fraction of stages x makespan; for GPipe and 1F1B with t_backward = 2 t_forward it is (p-1)/(m+p-1))
// and each stage's peak of microbatches whose forward is done and backward is not. Model chunks (interleaving,
// Megatron's virtual pipeline stages): with v chunks, rank s holds the v virtual stages s, p + s, ..., (v-1) p + s of a
// model cut into v p pieces; an action names its chunk. Activations and gradients then go round the ring of ranks (the
// last rank's chunk c feeds the first rank's chunk c + 1), each action costs 1/v of the stage's time, and:
//   GPipe, v chunks:  every forward in (chunk, microbatch) order, then every backward in reverse.
//   1F1B, v chunks:   interleaved 1F1B (Narayanan et al. 2021): microbatches in groups of p, a
//                     group runs through chunk 0, 1, ..., v-1 (forward; backward v-1, ..., 0);
//                     warm-up of 2 (p - s - 1) + (v - 1) p forwards on rank s. Bubble
//                     (p-1)/(v m + p-1), v times smaller than 1F1B's, for m a multiple of p (the
//                     builder requires it), at the price of v times as many messages.

#include "pmt/core/error.hpp"

#include <algorithm>
#include <cstddef>
#include <deque>
#include <string>
#include <utility>
#include <vector>

namespace pmt::parallel {

/// \brief What a stage does for one microbatch.
struct Action {
  enum Kind { Forward, Backward, SendAct, RecvAct, SendGrad, RecvGrad };
  Kind kind;
  int mb;
  int chunk = 0;  ///< the model chunk (virtual stage chunk * stages + rank); 0 without interleaving
  friend bool operator==(const Action& a, const Action& b) {
    return a.kind == b.kind && a.mb == b.mb && a.chunk == b.chunk;
  }
};

/// \brief "F", "B", "SendAct" ...: an action's name in tables and traces.
inline const char* kind_name(Action::Kind k) {
  switch (k) {
    case Action::Forward:
      return "forward";
    case Action::Backward:
      return "backward";
    case Action::SendAct:
      return "send-activation";
    case Action::RecvAct:
      return "recv-activation";
    case Action::SendGrad:
      return "send-gradient";
    case Action::RecvGrad:
      return "recv-gradient";
  }
  return "?";
}

/// \brief Which schedule (run time counterpart of pmt::GPipe / pmt::OneFOneB).
enum class ScheduleKind { GPipe, OneFOneB };

/// \brief "gpipe" or "1f1b".
inline const char* schedule_name(ScheduleKind k) { return k == ScheduleKind::GPipe ? "gpipe" : "1f1b"; }

/// \brief One action list per stage (rank of the pp axis).
struct Schedule {
  std::string name;
  int stages = 0, microbatches = 0;
  std::vector<std::vector<Action>> per_stage;
  int chunks    = 1;     ///< model chunks per stage (virtual stages: stages * chunks)
  bool backward = true;  ///< false: a forward-only pass (evaluation), no backward and no gradient
};

namespace detail {

inline void check_sizes(const char* op, int stages, int microbatches, int chunks = 1) {
  pmt::detail::require<ConfigError>(
      stages >= 1 && microbatches >= 1 && chunks >= 1 && (chunks == 1 || stages >= 2), op, [&] {
        return pmt::detail::str("stages ", stages, ", microbatches ", microbatches, " and chunks ", chunks,
                                ": each must be >= 1, and more than one chunk per stage needs at least 2 stages");
      });
}

// Rank s's forward / backward of microbatch i in chunk c (virtual stage c p + s of p v) with
// its receive before and its send after.
inline void push_forward(std::vector<Action>& a, int s, int p, int i, int c = 0, int v = 1) {
  const int vs = c * p + s;
  if (vs > 0) a.push_back({Action::RecvAct, i, c});
  a.push_back({Action::Forward, i, c});
  if (vs + 1 < p * v) a.push_back({Action::SendAct, i, c});
}
inline void push_backward(std::vector<Action>& a, int s, int p, int i, int c = 0, int v = 1) {
  const int vs = c * p + s;
  if (vs + 1 < p * v) a.push_back({Action::RecvGrad, i, c});
  a.push_back({Action::Backward, i, c});
  if (vs > 0) a.push_back({Action::SendGrad, i, c});
}

// The (chunk, microbatch) order of an interleaved schedule: groups of p microbatches, each group
// through chunks 0, 1, ..., v-1 (forward) or v-1, ..., 0 (backward).
inline std::vector<std::pair<int, int>> chunk_order(int p, int m, int v, bool backward) {
  std::vector<std::pair<int, int>> order;
  for (int g = 0; g < m; g += p)
    for (int k = 0; k < v; ++k)
      for (int i = g; i < std::min(g + p, m); ++i) order.emplace_back(backward ? v - 1 - k : k, i);
  return order;
}

/// NCCL's stream order over a table whose messages check() matches in issue order per pair (per
/// ordered pair of stages (from, to), the k-th send of `from` to `to` is the k-th receive of `to`
/// from `from`): each run of consecutive sends and receives of a stage is one group, posted
/// together; a group completes once each of its sends has its receive posted and each receive its
/// send; a stage does nothing else until then. With `pair` false, a table that deadlocks raises
/// pmt::ConfigError naming where every stage waits. With `pair` true, where a send waits for a
/// receive its peer has not posted, that receive (with the peer's earlier ones from the same
/// stage) moves up into the group the peer waits in: the peer then holds the message until the
/// action that needs it, as MPI's buffering would have; a table still deadlocked raises.
/// Where each unfinished stage waits, `pc[s]` its next action: "stage 0 waits at recv-gradient
/// of microbatch 3; stage 1 waits at ..." (the deadlock messages of check and stream_order).
inline std::string waiting_stages(const Schedule& sc, const std::vector<std::size_t>& pc) {
  std::string w;
  for (std::size_t t = 0; t < sc.per_stage.size(); ++t)
    if (pc[t] < sc.per_stage[t].size()) {
      const Action& a = sc.per_stage[t][pc[t]];
      w += pmt::detail::str(w.empty() ? "" : "; ", "stage ", t, " waits at ", kind_name(a.kind), " of microbatch ",
                            a.mb, sc.chunks > 1 ? pmt::detail::str(" in chunk ", a.chunk) : std::string());
    }
  return w;
}

inline void stream_order(Schedule& sc, const char* op, bool pair) {
  const auto P = static_cast<std::size_t>(sc.stages);
  if (P < 2) return;
  const auto sends   = [](Action::Kind k) { return k == Action::SendAct || k == Action::SendGrad; };
  const auto moves   = [&](Action::Kind k) { return sends(k) || k == Action::RecvAct || k == Action::RecvGrad; };
  const auto peer_of = [&](std::size_t s, Action::Kind k) {
    return (k == Action::SendAct || k == Action::RecvGrad) ? (s + 1) % P : (s + P - 1) % P;
  };
  // posted[from * P + to]: sends from `from` to `to` posted so far; taken[to * P + from]: receives
  std::vector<std::size_t> posted(P * P, 0), taken(P * P, 0), pc(P, 0), group_end(P, 0);
  std::vector<bool> in_group(P, false);
  // index[s][e]: the message's place in its pair (set when its group is posted)
  std::vector<std::vector<std::size_t>> index(P);
  for (std::size_t s = 0; s < P; ++s) index[s].assign(sc.per_stage[s].size(), 0);
  // when[s][e]: the action's start in MPI's model (buffered sends; forward 1, backward 2, each
  // chunk's 1/v), to choose which receive to move up when several would break a deadlock
  std::vector<std::vector<double>> when(P);
  if (pair) {
    const double v = sc.chunks;
    std::vector<std::vector<double>> sent_at(P * P);  // per (from, to): each send's time
    std::vector<std::size_t> at(P, 0), got(P * P, 0);
    std::vector<double> clock(P, 0.0);
    for (std::size_t s = 0; s < P; ++s) when[s].assign(sc.per_stage[s].size(), 1e300);
    for (bool more = true; more;) {
      more = false;
      for (std::size_t s = 0; s < P; ++s)
        for (auto& list = sc.per_stage[s]; at[s] < list.size(); ++at[s], more = true) {
          const Action& a = list[at[s]];
          if (moves(a.kind) && !sends(a.kind)) {
            const std::size_t q = peer_of(s, a.kind);
            if (got[s * P + q] >= sent_at[q * P + s].size()) break;
            clock[s] = std::max(clock[s], sent_at[q * P + s][got[s * P + q]++]);
          }
          when[s][at[s]] = clock[s];
          if (sends(a.kind)) sent_at[s * P + peer_of(s, a.kind)].push_back(clock[s]);
          if (a.kind == Action::Forward) clock[s] += 1.0 / v;
          if (a.kind == Action::Backward) clock[s] += 2.0 / v;
        }
    }
  }
  const auto deadlock = [&] {
    throw ConfigError(op, pmt::detail::str(sc.name, " (", sc.stages, " stages, ", sc.microbatches,
                                           " microbatches): deadlock under NCCL's stream order (each run of sends "
                                           "and receives one group, sends not buffered): ",
                                           waiting_stages(sc, pc), "; group each send with the receive it waits for"));
  };
  for (;;) {
    bool progress = true;
    while (progress) {
      progress = false;
      for (std::size_t s = 0; s < P; ++s) {
        const auto& list = sc.per_stage[s];
        while (pc[s] < list.size()) {
          if (!moves(list[pc[s]].kind)) {  // compute: always runs
            ++pc[s];
            progress = true;
            continue;
          }
          if (!in_group[s]) {  // post the whole run of sends and receives
            std::size_t e = pc[s];
            for (; e < list.size() && moves(list[e].kind); ++e) {
              const std::size_t q = peer_of(s, list[e].kind);
              index[s][e]         = sends(list[e].kind) ? posted[s * P + q]++ : taken[s * P + q]++;
            }
            group_end[s] = e;
            in_group[s]  = true;
            progress     = true;
          }
          bool complete = true;
          for (std::size_t e = pc[s]; e < group_end[s] && complete; ++e) {
            const std::size_t q = peer_of(s, list[e].kind);
            complete = sends(list[e].kind) ? taken[q * P + s] > index[s][e] : posted[q * P + s] > index[s][e];
          }
          if (!complete) break;
          pc[s]       = group_end[s];
          in_group[s] = false;
          progress    = true;
        }
      }
    }
    bool done = true;
    for (std::size_t s = 0; s < P; ++s) done = done && pc[s] == sc.per_stage[s].size();
    if (done) return;
    if (!pair) deadlock();
    // a send that waits for its receive: move the receive up into the group its peer waits in;
    // of several, the one whose message MPI's model sends earliest against when the peer waits
    std::size_t from = P, at = 0;
    double best = 0;
    for (std::size_t s = 0; s < P; ++s) {
      if (!in_group[s]) continue;
      for (std::size_t e = pc[s]; e < group_end[s]; ++e) {
        const std::size_t q = peer_of(s, sc.per_stage[s][e].kind);
        if (!sends(sc.per_stage[s][e].kind) || taken[q * P + s] > index[s][e] || !in_group[q]) continue;
        const double late = when[s][e] - when[q][pc[q]];
        if (from == P || late < best) from = s, at = e, best = late;
      }
    }
    if (from == P) deadlock();
    const std::size_t s = from, q = peer_of(s, sc.per_stage[s][at].kind);
    auto& list             = sc.per_stage[q];
    const std::size_t need = index[s][at] + 1 - taken[q * P + s];
    std::vector<Action> up, rest;
    std::vector<double> up_when, rest_when;
    for (std::size_t j = group_end[q]; j < list.size(); ++j) {
      const bool take =
          !sends(list[j].kind) && moves(list[j].kind) && peer_of(q, list[j].kind) == s && up.size() < need;
      (take ? up : rest).push_back(list[j]);
      (take ? up_when : rest_when).push_back(when[q][j]);
    }
    if (up.size() < need) deadlock();
    list.resize(group_end[q]);
    list.insert(list.end(), up.begin(), up.end());
    list.insert(list.end(), rest.begin(), rest.end());
    when[q].resize(group_end[q]);
    when[q].insert(when[q].end(), up_when.begin(), up_when.end());
    when[q].insert(when[q].end(), rest_when.begin(), rest_when.end());
    index[q].resize(list.size(), 0);
    for (std::size_t j = 0; j < need; ++j) index[q][group_end[q] + j] = taken[q * P + s]++;
    group_end[q] += need;
  }
}
}  // namespace detail

/// \brief GPipe: every forward, then every backward (in the same microbatch order); with
/// `chunks` > 1 every forward of chunk 0, then of chunk 1, ..., then the backwards in reverse.
/// \throws pmt::ConfigError for stages, microbatches or chunks < 1, or chunks > 1 on one stage.
inline Schedule gpipe(int stages, int microbatches, int chunks = 1) {
  detail::check_sizes("pmt::parallel::gpipe", stages, microbatches, chunks);
  Schedule sc{chunks == 1 ? std::string("gpipe") : pmt::detail::str("gpipe-", chunks, "chunks"), stages, microbatches,
              std::vector<std::vector<Action>>(static_cast<std::size_t>(stages)), chunks};
  for (int s = 0; s < stages; ++s) {
    auto& a = sc.per_stage[static_cast<std::size_t>(s)];
    for (int c = 0; c < chunks; ++c)
      for (int i = 0; i < microbatches; ++i) detail::push_forward(a, s, stages, i, c, chunks);
    for (int c = chunks - 1; c >= 0; --c)
      for (int i = 0; i < microbatches; ++i) detail::push_backward(a, s, stages, i, c, chunks);
  }
  detail::stream_order(sc, "pmt::parallel::gpipe", /*pair=*/true);
  return sc;
}

/// \brief A forward-only pass (evaluation and inference): GPipe's forwards, chunk after chunk,
/// and no backward; every activation slot is free again as soon as its forward has run.
/// \throws pmt::ConfigError for stages, microbatches or chunks < 1, or chunks > 1 on one stage.
inline Schedule forward_only(int stages, int microbatches, int chunks = 1) {
  detail::check_sizes("pmt::parallel::forward_only", stages, microbatches, chunks);
  Schedule sc{chunks == 1 ? std::string("forward-only") : pmt::detail::str("forward-only-", chunks, "chunks"),
              stages,
              microbatches,
              std::vector<std::vector<Action>>(static_cast<std::size_t>(stages)),
              chunks,
              false};
  for (int s = 0; s < stages; ++s)
    for (int c = 0; c < chunks; ++c)
      for (int i = 0; i < microbatches; ++i)
        detail::push_forward(sc.per_stage[static_cast<std::size_t>(s)], s, stages, i, c, chunks);
  detail::stream_order(sc, "pmt::parallel::forward_only", /*pair=*/true);
  return sc;
}

/// \brief Interleaved 1F1B over `chunks` model chunks per stage (see the file comment).
/// \throws pmt::ConfigError for chunks < 2, stages < 2, or microbatches not a multiple of stages.
inline Schedule interleaved_one_f_one_b(int stages, int microbatches, int chunks) {
  const char* op = "pmt::parallel::interleaved_one_f_one_b";
  detail::check_sizes(op, stages, microbatches, chunks);
  pmt::detail::require<ConfigError>(chunks >= 2 && microbatches % stages == 0, op, [&] {
    return pmt::detail::str(microbatches, " microbatches on ", stages, " stages with ", chunks,
                            " chunks each: interleaving needs at least 2 chunks and a number of microbatches that is "
                            "a multiple of the stages (use ",
                            (microbatches + stages - 1) / stages * stages, ")");
  });
  Schedule sc{pmt::detail::str("1f1b-interleaved-", chunks, "chunks"), stages, microbatches,
              std::vector<std::vector<Action>>(static_cast<std::size_t>(stages)), chunks};
  const auto fwd  = detail::chunk_order(stages, microbatches, chunks, false);
  const auto bwd  = detail::chunk_order(stages, microbatches, chunks, true);
  const int total = microbatches * chunks;
  for (int s = 0; s < stages; ++s) {
    auto& a          = sc.per_stage[static_cast<std::size_t>(s)];
    const int warmup = std::min(2 * (stages - s - 1) + (chunks - 1) * stages, total);
    const auto F     = [&](int k) {
      detail::push_forward(a, s, stages, fwd[std::size_t(k)].second, fwd[std::size_t(k)].first, chunks);
    };
    const auto B = [&](int k) {
      detail::push_backward(a, s, stages, bwd[std::size_t(k)].second, bwd[std::size_t(k)].first, chunks);
    };
    int f = 0, b = 0;
    for (; f < warmup; ++f) F(f);
    for (; f < total; ++f, ++b) F(f), B(b);
    for (; b < total; ++b) B(b);
  }
  detail::stream_order(sc, op, /*pair=*/true);
  return sc;
}

/// \brief 1F1B (PipeDream-flush): warm-up, steady one-forward-one-backward, cool-down. With fewer
/// microbatches than stages it is still correct (warm-up is cut to m) but its bubble is GPipe's.
/// With `chunks` > 1: interleaved_one_f_one_b.
/// \throws pmt::ConfigError for stages or microbatches < 1 (and see interleaved_one_f_one_b).
inline Schedule one_f_one_b(int stages, int microbatches, int chunks = 1) {
  if (chunks != 1) return interleaved_one_f_one_b(stages, microbatches, chunks);
  detail::check_sizes("pmt::parallel::one_f_one_b", stages, microbatches);
  Schedule sc{"1f1b", stages, microbatches, std::vector<std::vector<Action>>(static_cast<std::size_t>(stages))};
  for (int s = 0; s < stages; ++s) {
    auto& a           = sc.per_stage[static_cast<std::size_t>(s)];
    const int warmup  = std::min(stages - s - 1, microbatches);
    int next_forward  = 0;
    int next_backward = 0;
    for (; next_forward < warmup; ++next_forward) detail::push_forward(a, s, stages, next_forward);
    for (; next_forward < microbatches; ++next_forward, ++next_backward) {
      detail::push_forward(a, s, stages, next_forward);
      detail::push_backward(a, s, stages, next_backward);
    }
    for (; next_backward < microbatches; ++next_backward) detail::push_backward(a, s, stages, next_backward);
  }
  return sc;
}

/// \brief The schedule of a kind (`chunks` model chunks per stage).
inline Schedule make_schedule(ScheduleKind kind, int stages, int microbatches, int chunks = 1) {
  return kind == ScheduleKind::GPipe ? gpipe(stages, microbatches, chunks) : one_f_one_b(stages, microbatches, chunks);
}

/// \brief What check() proved and measured.
struct ScheduleReport {
  double makespan = 0;         ///< time until the last stage finishes
  double bubble   = 0;         ///< 1 - sum(busy) / (stages * makespan)
  std::vector<double> busy;    ///< per stage
  std::vector<int> peak_live;  ///< per stage: most microbatches between forward and backward
  /// \brief The theoretical bubble of GPipe and 1F1B, (p - 1) / (m + p - 1); of interleaved
  /// 1F1B with v chunks, (p - 1) / (v m + p - 1).
  static double theory(int stages, int microbatches, int chunks = 1) {
    return static_cast<double>(stages - 1) / static_cast<double>(chunks * microbatches + stages - 1);
  }
};

/// \brief Simulates the schedule for all stages together (see the file comment).
/// \throws pmt::ConfigError naming the stage, the action and the reason for a table that would
/// deadlock, mismatch a send with its receive, run an action before its data exists, or leave
/// a microbatch without its forward and backward.
/// Per-stage times: stage s's forward costs t_forward[s] and its backward t_backward[s] (for
/// the bubble expected from measured, unequal stages); with v chunks each chunk's action 1/v.
inline ScheduleReport check(const Schedule& sc, const std::vector<double>& t_forward,
                            const std::vector<double>& t_backward) {
  const char* op = "pmt::parallel::check(schedule)";
  const int p = sc.stages, m = sc.microbatches, v = sc.chunks;
  pmt::detail::require<ConfigError>(
      p >= 1 && m >= 1 && v >= 1 && (v == 1 || p >= 2) && sc.per_stage.size() == static_cast<std::size_t>(p) &&
          t_forward.size() == static_cast<std::size_t>(p) && t_backward.size() == static_cast<std::size_t>(p),
      op, [&] {
        return pmt::detail::str(sc.name, ": ", sc.per_stage.size(), " action lists and ", t_forward.size(), "/",
                                t_backward.size(), " stage times for ", p, " stages, ", m, " microbatches and ", v,
                                " chunks");
      });
  const auto P = static_cast<std::size_t>(p), M = static_cast<std::size_t>(m), V = static_cast<std::size_t>(v);
  struct Message {
    int mb, chunk;  // the sender's chunk
    double time;
  };
  // acts[s]: activations from stage s to (s+1) mod p; grads[s]: gradients into stage s from (s+1) mod p.
  std::vector<std::deque<Message>> acts(P), grads(P);
  // pairs[src * P + dst]: every message from src to dst in issue order, both kinds (NCCL matches
  // the messages between a pair in that order, whatever their tags)
  struct Sent {
    bool act;
    int mb, chunk;
  };
  std::vector<std::deque<Sent>> pairs(P * P);
  std::vector<std::size_t> pc(P, 0);
  std::vector<double> clock(P, 0.0);
  // per stage, per (chunk, microbatch): 0 nothing, 1 input received, 2 forward done, 3 grad
  // received, 4 backward done, 5 gradient sent
  std::vector<std::vector<int>> state(P, std::vector<int>(M * V, 0));
  std::vector<std::vector<bool>> sent(P, std::vector<bool>(M * V, false));
  std::vector<int> live(P, 0);
  ScheduleReport r;
  r.busy.assign(P, 0.0);
  r.peak_live.assign(P, 0);
  const auto fail = [&](std::size_t s, const Action& a, const std::string& why) {
    throw ConfigError(
        op, pmt::detail::str(sc.name, " (", p, " stages, ", m, " microbatches",
                             v > 1 ? pmt::detail::str(", ", v, " chunks") : std::string(), "): stage ", s, ", action ",
                             pc[s], " (", kind_name(a.kind), " of microbatch ", a.mb,
                             v > 1 ? pmt::detail::str(" in chunk ", a.chunk) : std::string(), "): ", why));
  };
  const auto expect_front = [&](std::size_t s, const Action& a, const std::deque<Message>& q, int chunk,
                                std::size_t from, const char* what) {
    if (q.front().mb != a.mb || q.front().chunk != chunk)
      fail(s, a,
           pmt::detail::str("the next ", what, " from stage ", from, " is microbatch ", q.front().mb,
                            v > 1 ? pmt::detail::str(" of its chunk ", q.front().chunk) : std::string(),
                            " (sends and receives cross)"));
  };
  const auto issue_order = [&](std::size_t s, const Action& a, std::size_t from, bool act, int chunk) {
    auto& q = pairs[from * P + s];
    if (q.empty() || q.front().act != act || q.front().mb != a.mb || q.front().chunk != chunk)
      fail(s, a,
           q.empty() ? std::string("no message from stage ") + std::to_string(from)
                     : pmt::detail::str("stage ", from, " sent ", q.front().act ? "the activation" : "the gradient",
                                        " of microbatch ", q.front().mb,
                                        v > 1 ? pmt::detail::str(" (its chunk ", q.front().chunk, ")") : std::string(),
                                        " to this stage first: NCCL matches the messages between two ranks in issue "
                                        "order, whatever their tags"));
    q.pop_front();
  };
  bool progress = true;
  while (progress) {
    progress = false;
    for (std::size_t s = 0; s < P; ++s) {
      const auto& list = sc.per_stage[s];
      while (pc[s] < list.size()) {
        const Action a = list[pc[s]];
        if (a.mb < 0 || a.mb >= m) fail(s, a, "microbatch out of range");
        if (a.chunk < 0 || a.chunk >= v) fail(s, a, "chunk out of range");
        const int vs     = a.chunk * p + static_cast<int>(s);  // the virtual stage
        const auto i     = static_cast<std::size_t>(a.chunk) * M + static_cast<std::size_t>(a.mb);
        const bool first = vs == 0, last = vs + 1 == p * v;
        const std::size_t prev = (s + P - 1) % P, next = (s + 1) % P;
        int& st      = state[s][i];
        bool blocked = false;
        switch (a.kind) {
          case Action::RecvAct: {
            if (first) fail(s, a, "the first stage has no previous stage to receive from");
            if (st != 0) fail(s, a, "received twice");
            auto& q = acts[prev];
            if (q.empty()) {
              blocked = true;
              break;
            }
            expect_front(s, a, q, s == 0 ? a.chunk - 1 : a.chunk, prev, "activation");
            issue_order(s, a, prev, true, s == 0 ? a.chunk - 1 : a.chunk);
            clock[s] = std::max(clock[s], q.front().time);
            q.pop_front();
            st = 1;
            break;
          }
          case Action::Forward:
            if (st != (first ? 0 : 1))
              fail(s, a, first ? "forward done twice" : "its activation was not received first");
            clock[s] += t_forward[s] / v;
            r.busy[s] += t_forward[s] / v;
            st             = 2;
            r.peak_live[s] = std::max(r.peak_live[s], sc.backward ? ++live[s] : 1);
            break;
          case Action::SendAct:
            if (last) fail(s, a, "the last stage has no next stage to send to");
            if (st < 2 || sent[s][i]) fail(s, a, "sent before its forward, or sent twice");
            acts[s].push_back({a.mb, a.chunk, clock[s]});
            pairs[s * P + next].push_back({true, a.mb, a.chunk});
            sent[s][i] = true;
            break;
          case Action::RecvGrad: {
            if (!sc.backward) fail(s, a, "a forward-only schedule moves no gradient");
            if (last) fail(s, a, "the last stage has no next stage to receive a gradient from");
            if (st != 2) fail(s, a, "received before its forward, or twice");
            if (!sent[s][i]) fail(s, a, "its activation was never sent");
            auto& q = grads[s];
            if (q.empty()) {
              blocked = true;
              break;
            }
            expect_front(s, a, q, next == 0 ? a.chunk + 1 : a.chunk, next, "gradient");
            issue_order(s, a, next, false, next == 0 ? a.chunk + 1 : a.chunk);
            clock[s] = std::max(clock[s], q.front().time);
            q.pop_front();
            st = 3;
            break;
          }
          case Action::Backward:
            if (!sc.backward) fail(s, a, "a forward-only schedule has no backward");
            if (st != (last ? 2 : 3))
              fail(s, a, last ? "backward before its forward, or twice" : "its gradient was not received first");
            clock[s] += t_backward[s] / v;
            r.busy[s] += t_backward[s] / v;
            st = 4;
            --live[s];
            break;
          case Action::SendGrad:
            if (first) fail(s, a, "the first stage has no previous stage to send a gradient to");
            if (st != 4) fail(s, a, "sent before its backward");
            grads[prev].push_back({a.mb, a.chunk, clock[s]});
            pairs[s * P + prev].push_back({false, a.mb, a.chunk});
            st = 5;
            break;
          default:
            fail(s, a, "unknown action");
        }
        if (blocked) break;
        ++pc[s];
        progress = true;
      }
    }
  }
  for (std::size_t s = 0; s < P; ++s)
    if (pc[s] < sc.per_stage[s].size()) fail(s, sc.per_stage[s][pc[s]], "deadlock: " + detail::waiting_stages(sc, pc));
  for (std::size_t s = 0; s < P; ++s) {
    for (std::size_t i = 0; i < M * V; ++i) {
      // the first virtual stage sends no gradient; a forward-only pass ends at the forward, sent on
      // unless it is the last virtual stage's
      const bool last_virtual = i / M + 1 == V && s + 1 == P;
      const int done          = !sc.backward ? 2 : (s == 0 && i < M) ? 4 : 5;
      if (state[s][i] != done || (!sc.backward && !last_virtual && !sent[s][i]))
        throw ConfigError(
            op,
            pmt::detail::str(sc.name, ": stage ", s, " leaves microbatch ", i % M,
                             v > 1 ? pmt::detail::str(" of chunk ", i / M) : std::string(),
                             sc.backward ? " unfinished (every stage must run each microbatch's forward and backward)"
                                         : " unfinished (every stage must run and send on each microbatch's forward)"));
    }
    if (!acts[s].empty() || !grads[s].empty())
      throw ConfigError(op, pmt::detail::str(sc.name, ": a message from or to stage ", s, " is never received"));
  }
  {
    Schedule copy = sc;
    detail::stream_order(copy, op, /*pair=*/false);
  }
  double busy = 0;
  for (std::size_t s = 0; s < P; ++s) {
    r.makespan = std::max(r.makespan, clock[s]);
    busy += r.busy[s];
  }
  r.bubble = r.makespan > 0 ? 1.0 - busy / (static_cast<double>(p) * r.makespan) : 0.0;
  return r;
}

/// \brief check() with every stage's forward costing `t_forward` and backward `t_backward`.
inline ScheduleReport check(const Schedule& sc, double t_forward = 1.0, double t_backward = 2.0) {
  const auto P = static_cast<std::size_t>(std::max(sc.stages, 0));
  return check(sc, std::vector<double>(P, t_forward), std::vector<double>(P, t_backward));
}

}  // namespace pmt::parallel
