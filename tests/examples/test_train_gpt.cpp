// SPDX-License-Identifier: Apache-2.0
// The main job, end to end: runs the train_gpt binary (under mpiexec where it takes several ranks)
// and checks what a user sees: its metrics, its checkpoints, its messages and exit codes.
//   - 1 rank, dp2 x tp2 and tp2 x pp2 on 4 ranks print the same per-step losses (float, 1e-5), with
//     the matmul path chosen by measurement and with each path pinned;
//   - 6 steps straight vs 3 + resume 3: the same losses and checkpoint (bit for bit: the losses
//     as printed with 17 digits, the shards' CRC-32s), the measured matmul paths carried by the
//     checkpoint; two runs pinned to one path repeat each other bit for bit; the first saves in
//     the background (the default), the resumed one with --no-async-save, to the same bytes;
//   - a crash in the middle of a save (the PMT_CHECKPOINT_TEST_ABORT hook) leaves the previous
//     checkpoint loadable, and the resumed run continues like an uninterrupted one; a flipped
//     byte in a shard is refused with the file's name;
//   - a checkpoint saved at dp2 x tp2 loads at tp4, at tp2 x pp2, at dp4 and into ZeRO-1 at dp4 with the same
//     parameters (a layout-free fingerprint, 1e-12) and the same next-step loss; a ZeRO-1
//     checkpoint with pipeline stages resumes as ZeRO-1, as AdamW at tp2 x pp2, as ZeRO-2 and as
//     ZeRO-3 at dp4 alike;
//   - --recompute (per-block activation recomputation), --recompute-attention and
//     --sequence-parallel on tp2 x pp2, and --recompute on the first of 2 stages, give the
//     one-rank losses;
//   - --zero (ZeRO-1), --zero2 (ZeRO-2) and --zero3 (ZeRO-3, and sharded in groups: HSDP) give
//     AdamW's losses; --auto calibrates, prints the planner's table and trains with its best
//     layout; the report and the metrics carry each rank's peak memory;
//   - each data-parallel mode (bf16-compressed gradients, local SGD, DiLoCo, bounded staleness)
//     resumes 3 + 3 steps bit for bit on dp 2, and reports its bytes (bf16: half of fp32's);
//   - each bad input gives its message on stderr and a non-zero exit, within a time limit.
// This binary is not an MPI program itself (it starts mpiexec), so it has its own main.
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "train_gpt_test.hpp"

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;
using Catch::Matchers::ContainsSubstring;

namespace {

struct Result {
  int rc;
  std::string out;
};

Result run(const std::string& args, int np = 1, const std::string& env = "") {
  std::string cmd =
      "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_PROC_BIND=false OMP_NUM_THREADS=1 "
      "OMPI_MCA_btl_vader_single_copy_mechanism=none " +
      env + " timeout 240 ";
  if (np > 1) cmd += std::string(PMT_MPIEXEC) + " -n " + std::to_string(np) + " --oversubscribe --bind-to none ";
  cmd += std::string(PMT_TRAIN_GPT) + " " + args + " 2>&1";
  Result r{0, ""};
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), p)) r.out += buf.data();
  const int status = pclose(p);
  r.rc             = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  UNSCOPED_INFO("$ " << cmd << "\n-> exit " << r.rc << "\n" << r.out);
  return r;
}

std::string tmp(const std::string& name) { return pmt::test::scratch("pmt_test_train_gpt_", name); }

using pmt::test::losses;

double rel(const std::string& a, const std::string& b) {
  const double x = std::stod(a), y = std::stod(b);
  return std::abs(x - y) / std::abs(y);
}

std::string shard_lines(const std::string& step_dir) {
  std::ifstream in(step_dir + "/MANIFEST");
  std::string line, out;
  while (std::getline(in, line))
    if (line.rfind("shard ", 0) == 0) out += line + "\n";
  return out;
}

double fingerprint(const std::string& out) {
  const std::regex re(R"(parameter fingerprint ([0-9.e+-]+))");
  std::smatch m;
  REQUIRE(std::regex_search(out, m, re));
  return std::stod(m[1]);
}

const std::string small = "--layers 2 --width 64 --heads 4 --context 32 --batch 8 --warmup 2 --val-every 0 ";

}  // namespace

TEST_CASE("one rank and two 4-rank layouts print the same losses", "[examples][train_gpt]") {
  const auto one = tmp("one.json"), dptp = tmp("dptp.json"), tppp = tmp("tppp.json");
  REQUIRE(run(small + "--steps 4 --metrics " + one).rc == 0);
  REQUIRE(run(small + "--steps 4 --dp 2 --tp 2 --microbatches 2 --metrics " + dptp, 4).rc == 0);
  const auto r = run(small + "--steps 4 --tp 2 --pp 2 --microbatches 4 --metrics " + tppp, 4);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, ContainsSubstring("validation loss") && ContainsSubstring("sample (prompt"));
  const auto a = losses(one), b = losses(dptp), c = losses(tppp);
  REQUIRE(a.size() == 4);
  REQUIRE((b.size() == 4 && c.size() == 4));
  for (const auto& [step, l] : a) {
    INFO("step " << step << ": " << l << " / " << b.at(step) << " / " << c.at(step));
    CHECK(rel(b.at(step), l) <= 1e-5);
    CHECK(rel(c.at(step), l) <= 1e-5);
  }
  CHECK(std::stod(a.at(3)) < std::stod(a.at(0)));  // it learns
  // each matmul path pinned: the 4-rank layout again gives the one-rank losses
  for (const std::string path : {"vendor", "portable"}) {
    const auto p1 = tmp("one_" + path + ".json"), p4 = tmp("tppp_" + path + ".json");
    REQUIRE(run(small + "--steps 4 --matmul " + path + " --metrics " + p1).rc == 0);
    const auto r4 = run(small + "--steps 4 --tp 2 --pp 2 --microbatches 4 --metrics " + p4, 4, "PMT_MATMUL=" + path);
    REQUIRE(r4.rc == 0);
    CHECK_THAT(r4.out, ContainsSubstring("matmul pinned: " + path) && ContainsSubstring("(" + path + ")"));
    const auto x = losses(p1), y = losses(p4);
    REQUIRE((x.size() == 4 && y.size() == 4));
    for (const auto& [step, l] : x) {
      INFO(path << " step " << step << ": " << l << " / " << y.at(step));
      CHECK(rel(y.at(step), l) <= 1e-5);
    }
  }
}

TEST_CASE("--chunks 2: interleaved 1F1B on 2 stages prints the one-rank losses and samples", "[examples][train_gpt]") {
  const auto one = tmp("one_l4.json"), inter = tmp("interleaved.json");
  const std::string four = small + "--layers 4 --steps 3 ";
  REQUIRE(run(four + "--metrics " + one).rc == 0);
  const auto r = run(four + "--pp 2 --chunks 2 --microbatches 4 --metrics " + inter, 2);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, ContainsSubstring("1f1b, 2 chunks per stage") &&
                        ContainsSubstring("layers [0,1) [1,2) [2,3) [3,4)") && ContainsSubstring("sample (prompt"));
  const auto a = losses(one), b = losses(inter);
  REQUIRE((a.size() == 3 && b.size() == 3));
  for (const auto& [step, l] : a) {
    INFO("step " << step << ": " << l << " / " << b.at(step));
    CHECK(rel(b.at(step), l) <= 1e-5);
  }
}

TEST_CASE("train_gpt --recompute, --recompute-attention and --sequence-parallel print the losses of one rank",
          "[examples][train_gpt]") {
  const auto one = tmp("one_recompute_ref.json");
  REQUIRE(run(small + "--steps 3 --metrics " + one).rc == 0);
  const auto a = losses(one);
  REQUIRE(a.size() == 3);
  struct Case {
    std::string flags;
    int np;
    std::string says;
  };
  const std::vector<Case> cases{
      {"--tp 2 --pp 2 --microbatches 2 --recompute", 4, "activations recomputed per block"},
      {"--tp 2 --pp 2 --microbatches 2 --sequence-parallel", 4, ", sequence-parallel"},
      {"--tp 2 --pp 2 --microbatches 2 --recompute-attention", 4, ", attention recomputed"},
      {"--pp 2 --microbatches 2 --recompute --recompute-stages 1", 2, "activations recomputed per block on stages < 1"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& c      = cases[i];
    const auto metrics = tmp("recompute_" + std::to_string(i) + ".json");
    const auto r       = run(small + "--steps 3 " + c.flags + " --metrics " + metrics, c.np);
    INFO(c.flags);
    REQUIRE(r.rc == 0);
    CHECK_THAT(r.out, ContainsSubstring(c.says) && ContainsSubstring("sample (prompt"));
    const auto b = losses(metrics);
    REQUIRE(b.size() == 3);
    for (const auto& [step, l] : a) {
      INFO("step " << step << ": " << l << " / " << b.at(step));
      CHECK(rel(b.at(step), l) <= 1e-5);
    }
  }
}

TEST_CASE("--zero, --zero2 and --zero3 train like AdamW; --auto runs the planner's best layout; the memory report",
          "[examples][train_gpt][plan]") {
  const auto one = tmp("one_zero_ref.json"), zero = tmp("zero.json"), zero2 = tmp("zero2.json"),
             zero3 = tmp("zero3.json"), hsdp = tmp("zero3_hsdp.json"), autom = tmp("auto.json");
  REQUIRE(run(small + "--steps 3 --metrics " + one).rc == 0);
  const auto z = run(small + "--steps 3 --dp 2 --tp 2 --zero --metrics " + zero, 4);
  REQUIRE(z.rc == 0);
  REQUIRE(run(small + "--steps 3 --dp 2 --pp 2 --microbatches 2 --zero2 --metrics " + zero2, 4).rc == 0);
  REQUIRE(run(small + "--steps 3 --dp 2 --pp 2 --microbatches 2 --zero3 --metrics " + zero3, 4).rc == 0);
  const auto h = run(small + "--steps 3 --dp 4 --zero3 --shard-size 2 --prefetch 2 --metrics " + hsdp, 4);
  REQUIRE(h.rc == 0);
  CHECK_THAT(h.out, ContainsSubstring("ZeRO-3 sharded in groups of 2, prefetch 2"));
  const auto a = losses(one), b = losses(zero), c = losses(zero2), d = losses(zero3), e = losses(hsdp);
  REQUIRE((a.size() == 3 && b.size() == 3 && c.size() == 3 && d.size() == 3 && e.size() == 3));
  for (const auto& [step, l] : a)
    CHECK((rel(b.at(step), l) <= 1e-5 && rel(c.at(step), l) <= 1e-5 && rel(d.at(step), l) <= 1e-5 &&
           rel(e.at(step), l) <= 1e-5));
  // ZeRO-3's flags: one stage at a time, its sharding only with it
  CHECK_THAT(run(small + "--steps 1 --dp 2 --zero2 --zero3", 2).out, ContainsSubstring("give one"));
  CHECK_THAT(run(small + "--steps 1 --dp 2 --shard-size 2", 2).out, ContainsSubstring("they need --zero3"));
  CHECK_THAT(run(small + "--steps 1 --dp 4 --zero3 --shard-size 3", 4).out,
             ContainsSubstring("shard size 3 does not divide dp 4"));
  // the per-rank report and the metrics carry each rank's peak memory
  CHECK_THAT(z.out, ContainsSubstring("peak MiB"));
  const auto lines = pmt::run::MetricsLog::read(zero);
  REQUIRE(!lines.empty());
  CHECK((lines.back().contains("peak_memory_bytes") && lines.back()["peak_memory_bytes"].size() == 4));
  // --auto: calibrates, prints the planner's top 5, trains with the best
  const auto r = run(small + "--steps 2 --auto --metrics " + autom, 4);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, ContainsSubstring("--auto: the planner's top 5 of") && ContainsSubstring("why rank 1:") &&
                        ContainsSubstring("pmt train_gpt: 4 ranks = dp"));
  CHECK(losses(autom).size() == 2);
}

TEST_CASE("3 steps + resume 3 equals 6 steps, bit for bit", "[examples][train_gpt][checkpoint]") {
  // The 6-step run with a checkpoint at step 3 is the uninterrupted run; a resumed run continues it
  // from that checkpoint bit for bit, the matmul paths its first step measured included (they are
  // in the manifest). Two runs of their own measure and may choose other paths: pinned, they agree.
  // The first run saves in the background (the default), the resumed one with --no-async-save:
  // their final shards are the same bytes.
  const std::string layout = "--tp 2 --pp 2 --microbatches 2 ";
  const auto straight = tmp("straight"), split = tmp("split");
  const auto first =
      run(small + layout + "--steps 6 --ckpt-every 3 --ckpt-dir " + split + " --metrics " + split + ".json", 4);
  REQUIRE(first.rc == 0);
  CHECK_THAT(first.out, ContainsSubstring("checkpoint: step 3 copied in") &&
                            ContainsSubstring("step-00000003 (written in the background in"));
  fs::rename(split + "/step-00000006", split + "-step6");
  { std::ofstream(split + "/LATEST") << "step-00000003\n"; }
  const auto r = run(
      small + layout + "--steps 6 --resume --no-async-save --ckpt-dir " + split + " --metrics " + split + "2.json", 4);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, ContainsSubstring("resumed from") && ContainsSubstring("step 3") &&
                        ContainsSubstring("shape classes from the checkpoint") &&
                        !ContainsSubstring("in the background"));
  const auto a = losses(split + ".json"), b = losses(split + "2.json");
  REQUIRE(b.size() == 3);
  for (const auto& [step, l] : b) CHECK(l == a.at(step));
  CHECK(!shard_lines(split + "-step6").empty());
  CHECK(shard_lines(split + "/step-00000006") == shard_lines(split + "-step6"));
  // pinned to one path, two separate runs repeat each other bit for bit
  const auto p1 = run(small + layout + "--steps 3 --matmul portable --metrics " + straight + ".json", 4);
  REQUIRE(p1.rc == 0);
  CHECK_THAT(p1.out, ContainsSubstring("matmul pinned: portable") && ContainsSubstring("(portable)"));
  REQUIRE(run(small + layout + "--steps 3 --metrics " + straight + "2.json", 4, "PMT_MATMUL=portable").rc == 0);
  CHECK(losses(straight + ".json") == losses(straight + "2.json"));
  fs::remove_all(split + "-step6");
}

TEST_CASE("a crash during a save leaves the previous checkpoint; a flipped byte is refused",
          "[examples][train_gpt][checkpoint]") {
  const auto dir = tmp("crash"), ref = tmp("crash_ref");
  // pinned: the reference measures its own matmul paths, which may differ where two are close
  const std::string args = small + "--steps 4 --ckpt-every 2 --matmul vendor --ckpt-dir ";
  REQUIRE(run(args + ref + " --metrics " + ref + ".json", 2).rc == 0);
  const auto crashed = run(args + dir, 2, "PMT_CHECKPOINT_TEST_ABORT=1:4");
  CHECK(crashed.rc != 0);
  CHECK_THAT(crashed.out, ContainsSubstring("aborting in the middle of"));
  std::string latest;
  std::ifstream(dir + "/LATEST") >> latest;
  CHECK(latest == "step-00000002");
  CHECK_FALSE(fs::exists(dir + "/step-00000004/MANIFEST"));
  const auto resumed = run(args + dir + " --resume --metrics " + dir + ".json", 2);
  REQUIRE(resumed.rc == 0);
  CHECK_THAT(resumed.out, ContainsSubstring("resumed from " + dir + "/step-00000002"));
  const auto a = losses(ref + ".json"), b = losses(dir + ".json");
  for (const auto& [step, l] : b) CHECK(l == a.at(step));
  CHECK(shard_lines(dir + "/step-00000004") == shard_lines(ref + "/step-00000004"));
  // flip one byte of rank 1's shard
  {
    std::fstream f(dir + "/step-00000004/shard-00001.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(5000);
    char c = 0;
    f.get(c);
    f.seekp(5000);
    f.put(static_cast<char>(c ^ 0x5a));
  }
  const auto damaged = run(small + "--steps 6 --resume --ckpt-dir " + dir, 2);
  CHECK(damaged.rc != 0);
  CHECK_THAT(damaged.out, ContainsSubstring("step-00000004/shard-00001.bin: damaged"));
}

TEST_CASE("a checkpoint saved at dp2 x tp2 loads at other layouts and into ZeRO-1 with the same parameters",
          "[examples][train_gpt][checkpoint]") {
  const auto dir = tmp("reshard");
  REQUIRE(run(small + "--steps 3 --dp 2 --tp 2 --ckpt-dir " + dir, 4).rc == 0);
  double fp0 = 0;
  std::string loss0;
  for (const std::string layout : {"--dp 2 --tp 2", "--tp 4", "--tp 2 --pp 2", "--dp 4", "--dp 4 --zero"}) {
    const auto copy = dir + "_" + std::to_string(std::hash<std::string>{}(layout));
    fs::remove_all(copy);
    fs::copy(dir, copy, fs::copy_options::recursive);
    const auto r = run(small + "--steps 4 --allow-changed-config --resume " + layout + " --ckpt-dir " + copy +
                           " --metrics " + copy + ".json",
                       4);
    REQUIRE(r.rc == 0);
    const double fp = fingerprint(r.out);
    const auto l    = losses(copy + ".json");
    REQUIRE(l.count(3) == 1);
    if (loss0.empty()) fp0 = fp, loss0 = l.at(3);
    INFO(layout << ": fingerprint " << fp << " vs " << fp0 << ", next loss " << l.at(3) << " vs " << loss0);
    CHECK(std::abs(fp - fp0) <= 1e-12 * std::abs(fp0));
    CHECK(rel(l.at(3), loss0) <= 1e-5);
  }
}

TEST_CASE(
    "a ZeRO-1 checkpoint with pipeline stages resumes as ZeRO-1, as ZeRO-2, as ZeRO-3 and as AdamW at another "
    "layout",
    "[examples][train_gpt][checkpoint]") {
  const auto dir = tmp("zero_pp");
  REQUIRE(run(small + "--steps 3 --dp 2 --pp 2 --zero --ckpt-dir " + dir, 4).rc == 0);
  std::vector<double> fps;
  std::vector<std::string> next;
  for (const std::string layout :
       {"--dp 2 --pp 2 --zero", "--tp 2 --pp 2", "--dp 2 --pp 2 --zero2", "--dp 4 --zero3"}) {
    const auto copy = dir + "_" + std::to_string(std::hash<std::string>{}(layout));
    fs::remove_all(copy);
    fs::copy(dir, copy, fs::copy_options::recursive);
    const auto r = run(small + "--steps 4 --allow-changed-config --resume " + layout + " --ckpt-dir " + copy +
                           " --metrics " + copy + ".json",
                       4);
    REQUIRE(r.rc == 0);
    fps.push_back(fingerprint(r.out));
    const auto l = losses(copy + ".json");
    REQUIRE(l.count(3) == 1);
    next.push_back(l.at(3));
  }
  INFO("fingerprints " << fps[0] << " / " << fps[1] << " / " << fps[2] << ", next losses " << next[0] << " / "
                       << next[1] << " / " << next[2]);
  CHECK(std::abs(fps[1] - fps[0]) <= 1e-12 * std::abs(fps[0]));
  CHECK(std::abs(fps[2] - fps[0]) <= 1e-12 * std::abs(fps[0]));
  CHECK(std::abs(fps[3] - fps[0]) <= 1e-12 * std::abs(fps[0]));
  CHECK(rel(next[1], next[0]) <= 1e-5);
  CHECK(rel(next[2], next[0]) <= 1e-5);
  CHECK(rel(next[3], next[0]) <= 1e-5);
}

TEST_CASE("the data-parallel modes resume bit for bit and report their bytes",
          "[examples][train_gpt][checkpoint][dp]") {
  // each mode's own state (the bf16 residuals, DiLoCo's anchor and momentum, the stale sums in
  // flight) travels with the checkpoint: 3 + resume 3 equals 6 steps; bf16 products too
  static std::map<std::string, double> mib;  // over the sections (Catch enters the test once per section)
  for (const std::string mode :
       {"", "--compress bf16", "--local-sgd 2", "--diloco 2", "--staleness 2", "--precision bf16"}) {
    DYNAMIC_SECTION("mode '" << mode << "'") {
      const auto dir = tmp("dp_mode");
      const auto r   = run(small + mode + " --dp 2 --steps 6 --ckpt-every 3 --overwrite --ckpt-dir " + dir +
                               " --metrics " + dir + ".json",
                           2);
      REQUIRE(r.rc == 0);
      const std::regex re(R"(dp communication: ([0-9.]+) MiB)");
      std::smatch m;
      REQUIRE(std::regex_search(r.out, m, re));
      mib[mode] = std::stod(m[1]);
      fs::remove_all(dir + "/step-00000006");
      { std::ofstream(dir + "/LATEST") << "step-00000003\n"; }
      const auto again =
          run(small + mode + " --dp 2 --steps 6 --resume --ckpt-dir " + dir + " --metrics " + dir + "2.json", 2);
      REQUIRE(again.rc == 0);
      const auto a = losses(dir + ".json"), b = losses(dir + "2.json");
      REQUIRE(b.size() == 3);
      for (const auto& [step, l] : b) CHECK(l == a.at(step));
    }
  }
  if (mib.size() == 6) {
    CHECK(mib.at("--compress bf16") == Catch::Approx(mib.at("") / 2).epsilon(0.01));  // half the bytes
    CHECK(mib.at("--local-sgd 2") < mib.at(""));                                      // parameters every 2nd step
    CHECK(mib.at("--staleness 2") == Catch::Approx(mib.at("")).epsilon(0.01));        // every step, applied late
    CHECK(mib.at("--precision bf16") == Catch::Approx(mib.at("")).epsilon(0.01));     // fp32 gradients all the same
  }
}

TEST_CASE("bad input: a message on stderr, a non-zero exit, no hang", "[examples][train_gpt][errors]") {
  const auto short_file = tmp("short.txt");
  { std::ofstream(short_file) << "too short"; }
  const auto ckpt = tmp("other_model");
  REQUIRE(run(small + "--steps 1 --overwrite --ckpt-dir " + ckpt).rc == 0);  // (again for each section)
  struct Case {
    std::string args;
    int np;
    std::string message;
  };
  const std::vector<Case> cases{
      {"--data /no/such/file", 1, "/no/such/file: no such file"},
      {"--data " + short_file, 1, "holds 9 bytes, shorter than one context"},
      {"--dp 2 --tp 2", 2, "dp(2) * tp(2) * pp(1) = 4 but there are 2 ranks"},
      {"--tp 2 --heads 3 --width 96", 2, "heads 3 are not divisible by tp 2"},
      {"--width 100 --heads 3", 1, "width 100 is not divisible by heads 3"},
      {"--tp 3 --heads 3 --width 96", 3, "vocabulary 256 is not divisible by tp 3"},
      {"--pp 2 --layers 1", 2, "1 layers cannot fill pp 2 stages"},
      {"--chunks 2", 1, "2 model chunks per stage need pp > 1"},
      {"--pp 2 --chunks 2", 2, "2 layers cannot fill pp 2 x 2 chunks"},
      {"--pp 2 --chunks 2 --layers 4 --microbatches 1", 2,
       "interleaved 1F1B needs microbatches (1) a multiple of pp 2"},
      {"--width 0", 1, "--width 0: expected an integer >= 1"},
      {"--steps -3", 1, "--steps -3: expected an integer >= 1"},
      {"--lr -1", 1, "--lr -1: expected a positive number"},
      {"--frobnicate 1", 2, "unknown flag --frobnicate"},
      {"--steps", 1, "--steps needs a value"},
      {"--batch 6 --dp 4", 4, "batch 6 is not divisible by dp 4"},
      {"--resume", 1, "--resume needs --ckpt-dir"},
      {"--matmul blas", 2, "--matmul is 'blas'; expected vendor, portable or auto"},
      {"--precision fp16", 1, "--precision is 'fp16'; expected fp32 or bf16"},
      {"--auto --dp 2", 2, "--auto chooses the layout; drop --dp"},
      {"--zero", 1, "ZeRO-1 shards over dp, and dp is 1"},
      {"--pp 2 --recompute-stages 1", 2, "recompute_stages 1 names stages that recompute, and nothing recomputes"},
      {"--pp 2 --recompute --recompute-stages 3", 2, "recompute_stages 3 is not in [0, pp 2]"},
      {"--tp 2 --sequence-parallel --batch 1 --context 3", 2,
       "sequence parallelism splits a microbatch's 3 tokens over tp 2, which does not divide them"},
      {"--local-sgd 2 --diloco 2", 1, "three data-parallel modes: give one"},
      {"--compress gzip", 1, "--compress gzip: expected none or bf16"},
      {"--compress bf16 --local-sgd 2", 2, "this run does not all-reduce gradients"},
      {"--outer-lr 0.5", 1, "--outer-lr and --outer-momentum set DiLoCo's outer step: they need --diloco H"},
      {"--diloco 2 --outer-momentum 1", 1, "--outer-momentum 1: expected 0 <= X < 1"},
      {"--staleness 1 --zero", 2, "--staleness applies whole fp32 gradient sums late"},
      {"--resume --steps 2 --width 128 --ckpt-dir " + ckpt, 1, "holds a different model"},
  };
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.args) {
      const auto r = run("--layers 2 --context 32 --val-every 0 " + c.args, c.np);
      CHECK(r.rc != 0);
      CHECK(r.rc != 124);  // timeout's code: no hang
      CHECK_THAT(r.out, ContainsSubstring("train_gpt: error:") && ContainsSubstring(c.message));
    }
  }
  // --help documents the default data
  const auto help = run("--help");
  CHECK(help.rc == 0);
  CHECK_THAT(help.out, ContainsSubstring("--ckpt-dir") && ContainsSubstring("the project's documentation"));
}
