// SPDX-License-Identifier: Apache-2.0
// The trace of a 2-stage 1F1B step with m = 4, with one and with two model chunks per stage
// (interleaved; every message round the ring of stages): each rank's compute events are exactly the
// forwards and backwards its schedule table predicts, in the table's order; every send has its
// receive (4 activations and 4 gradients between the two stages; 12 and 12 with two chunks; flow
// ids matched) and starts
// before that receive ends on the aligned clocks; the JSON written for it parses (nlohmann-json). Also: with the
// recorder off nothing is recorded; a rank's own trace (write_rank_trace: what a rank that failed
// alone keeps) parses and holds its compute events.
#include <catch2/catch_test_macros.hpp>

#include "../comm/comm_test.hpp"
#include "../train/train_test.hpp"
#include "pmt/nn/gpt.hpp"
#include "pmt/obs/trace.hpp"
#include "pmt/optim/optimizers.hpp"
#include "pmt/train/trainer.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

using Host    = Kokkos::DefaultHostExecutionSpace;
using Backend = pmt::test::World::backend;

namespace {

/// One traced 1F1B step of a 2-stage Gpt with `chunks` chunks per stage and 4 microbatches,
/// checked as the file comment says; true on this rank when everything holds.
bool traced_step_matches(int chunks) {
  using Model             = pmt::nn::Gpt<double, Host, Backend>;
  using Ids               = Model::Ids;
  using Opt               = pmt::optim::AdamW<double, Host>;
  const auto& w           = pmt::test::world();
  constexpr std::size_t V = 64, Tn = 8;
  pmt::Mesh<Backend> mesh(w, {1, 1, 2});
  Model model(mesh, {V, Tn, static_cast<std::size_t>(2 * chunks), 16, 2, 3}, {}, chunks);
  Opt opt(model.parameters(), {0.9, 0.95, 1e-8, 0.0});
  pmt::train::Trainer<Model, Opt, Host, Backend> tr(mesh, model, opt);
  std::vector<pmt::train::Microbatch<Ids>> mbs;
  for (int i = 0; i < 4; ++i)
    mbs.push_back(pmt::test::synthetic_batch<Ids>(0, 2 * static_cast<std::size_t>(i), 2, Tn, V));
  auto& rec = pmt::TraceRecorder::instance();
  rec.clear();
  tr.step(mbs, {8 * Tn, 1e-3, 1.0});  // recorder off: nothing recorded
  bool ok = rec.events().empty();
  rec.enable();
  tr.step(mbs, {8 * Tn, 1e-3, 1.0});
  rec.enable(false);
  // this rank's compute events against its stage's table
  std::vector<std::string> expected, got;
  const auto table = pmt::parallel::one_f_one_b(2, 4, chunks);
  for (const auto& a : table.per_stage[static_cast<std::size_t>(model.stage())])
    if (a.kind == pmt::parallel::Action::Forward || a.kind == pmt::parallel::Action::Backward)
      expected.push_back(std::string(pmt::parallel::kind_name(a.kind)) + " " + std::to_string(a.mb) +
                         (chunks > 1 ? " chunk " + std::to_string(a.chunk) : ""));
  for (const auto& e : rec.events())
    if (e.track == pmt::Track::Compute) got.push_back(e.name);
  UNSCOPED_INFO("rank " << w.rank() << ": " << got.size() << " compute events, " << expected.size() << " expected");
  ok          = ok && got == expected;
  bool tracks = false;
  for (const auto& e : rec.events()) tracks = tracks || e.track == pmt::Track::Optimizer;
  ok             = ok && tracks;
  const auto all = pmt::obs::gather_trace(mesh);
  if (w.rank() == 0) {
    std::map<std::int64_t, double> send_begin, recv_end;
    for (const auto& r : all)
      for (const auto& e : r.events) {
        if (e.flow_out >= 0) send_begin[e.flow_out] = e.begin;
        if (e.flow_in >= 0) recv_end[e.flow_in] = e.end;
      }
    UNSCOPED_INFO(send_begin.size() << " sends, " << recv_end.size() << " receives");
    // every virtual stage but the last sends 4 activations, every one but the first 4 gradients
    const std::size_t messages = 2 * 4 * static_cast<std::size_t>(2 * chunks - 1);
    ok                         = ok && all.size() == 2 && send_begin.size() == messages && recv_end.size() == messages;
    for (const auto& [id, b] : send_begin) ok = ok && recv_end.count(id) == 1 && b < recv_end[id];
    const std::string json = pmt::obs::trace_json(all);
    ok                     = ok && nlohmann::json::accept(json) && json.find("\"traceEvents\"") != std::string::npos &&
         json.find("\"ph\":\"s\"") != std::string::npos &&
         json.find("rank 1 (dp 0/1, tp 0/1, pp 1/2)") != std::string::npos;
  }
  // this rank alone, without the others
  const std::string own = pmt::test::shared_temp_path(w, "pmt-rank-trace") + ".rank-" + std::to_string(w.rank());
  pmt::obs::write_rank_trace(own, w.rank(), mesh.where());
  std::ifstream in(own);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ok = ok && nlohmann::json::accept(text) && text.find("\"name\":\"" + expected.front() + "\"") != std::string::npos &&
       text.find("rank " + std::to_string(w.rank()) + " (dp 0/1") != std::string::npos;
  std::remove(own.c_str());
  rec.clear();
  return ok;
}

}  // namespace

TEST_CASE("a 2-stage 1F1B trace holds the table's actions, matched sends and valid JSON", "[obs][trace][mpi]") {
  if (pmt::test::world().size() != 2) return;  // the 2-stage case
  CHECK(pmt::test::all_ranks(traced_step_matches(1)));
}

TEST_CASE("an interleaved 1F1B trace (2 chunks per stage) matches its sends round the ring", "[obs][trace][mpi]") {
  if (pmt::test::world().size() != 2) return;
  CHECK(pmt::test::all_ranks(traced_step_matches(2)));
}
