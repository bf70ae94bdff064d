// SPDX-License-Identifier: Apache-2.0
// train_gpt never loses work: each way a user's run can be interrupted, misused or damaged, tried
// on the binary (under mpiexec where it takes several ranks), with the message, the exit code, a
// bound on the time it takes, and that the last good checkpoint still loads and resumes bit for
// bit (the losses, printed with 17 digits, equal an uninterrupted run's):
//   - preflight: unwritable --metrics, --trace and --ckpt-dir fail before training;
//     --ckpt-every without --ckpt-dir; the final checkpoint is written before the trace;
//   - preemption: SIGTERM to one rank, SIGUSR1 to mpiexec (which forwards it): every rank stops
//     at one step with a checkpoint and a whole --trace (exit 75); a second signal ends the job
//     at once; a signal while a save is written in the background finishes that save first; a
//     rank killed then leaves LATEST naming the checkpoint before;
//   - one writer: a second run on a directory in use is refused; the lock of a killed run is
//     taken over; a fresh run into old checkpoints needs --overwrite; --resume with LATEST
//     missing, damaged or naming an incomplete step takes the newest step that verifies;
//   - hardened loading: a manifest edited by hand, a crafted shard whose sizes overflow, a
//     changed --seed on resume (refused unless --allow-changed-config);
//   - numerics: a huge learning rate makes the loss nan: the run stops (exit 3, its --trace
//     written) or skips steps, and no checkpoint holds nan;
//   - hangs: a rank stopped with SIGSTOP: the watchdog names it (exit 4) and the rank it ends
//     keeps its own --trace; ranks started with other flags (an MPMD launch) get one error;
//   - small ones: --threads, the thread count picked for ranks sharing cores, --kokkos typos,
//     metrics after a resume, --keep, leftovers of an interrupted save, a device as data.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "train_gpt_test.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;
using Catch::Matchers::ContainsSubstring;
using clock_type = std::chrono::steady_clock;

namespace {

const std::string base_env =
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_PROC_BIND=false "
    "OMPI_MCA_btl_vader_single_copy_mechanism=none";

std::string command(const std::string& args, int np, const std::string& env, bool threads = true) {
  std::string cmd = std::string(threads ? "env " : "env -u OMP_NUM_THREADS ") + base_env +
                    (threads ? " OMP_NUM_THREADS=1 " : " ") + env + " ";
  if (np > 1) cmd += std::string(PMT_MPIEXEC) + " -n " + std::to_string(np) + " --oversubscribe --bind-to none ";
  return cmd + PMT_TRAIN_GPT + " " + args;
}

struct Result {
  int rc;
  std::string out;
  double seconds;
};

Result finish(const std::string& cmd, const std::string& out_file, int status, clock_type::time_point t0) {
  Result r{WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), "",
           std::chrono::duration<double>(clock_type::now() - t0).count()};
  std::ifstream in(out_file);
  r.out.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  UNSCOPED_INFO("$ " << cmd << "\n-> exit " << r.rc << " after " << r.seconds << " s\n" << r.out);
  return r;
}

/// A run in the background: fork + exec of `sh -c "exec <cmd>"` (the pid is mpiexec's or
/// train_gpt's own), output into a file.
struct Job {
  pid_t pid = -1;
  std::string cmd, out_file;
  clock_type::time_point t0;
  Job(const std::string& c, const std::string& out) : cmd(c), out_file(out), t0(clock_type::now()) {
    pid = fork();
    if (pid == 0) {
      const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1), dup2(fd, 2);
      setpgid(0, 0);  // its own process group: the test can end all of it
      execl("/bin/sh", "sh", "-c", ("exec " + c).c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  /// Waits for the end, at most 240 s (then the whole group is killed: a hang is exit 124).
  Result wait() {
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::duration<double>(clock_type::now() - t0).count() > 240) {
        kill(-pid, SIGKILL);
        waitpid(pid, nullptr, 0);
        pid    = -1;
        auto r = finish(cmd, out_file, 0, t0);
        r.rc   = 124;
        return r;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(-pid, SIGKILL);  // ranks that outlive their launcher (killed, but not yet gone) go now
    for (int i = 0; i < 100 && kill(-pid, 0) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    pid = -1;
    return finish(cmd, out_file, status, t0);
  }
  ~Job() {
    if (pid > 0) {
      kill(-pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

Result run(const std::string& args, int np = 1, const std::string& env = "", bool threads = true) {
  static int n = 0;
  Job j(command(args, np, env, threads),
        (fs::temp_directory_path() / ("pmt_safety_out_" + std::to_string(getpid()) + "_" + std::to_string(n++)))
            .string());
  auto r = j.wait();
  fs::remove(j.out_file);
  return r;
}

std::string tmp(const std::string& name) { return pmt::test::scratch("pmt_test_safety_", name); }

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

using pmt::test::losses;

/// How many step lines of a metrics file name `step` (resumes must not repeat one).
int step_lines(const std::string& metrics, int step) {
  int n = 0;
  for (const auto& line : pmt::run::MetricsLog::read(metrics))
    n += line.value("step", -1) == step && line.contains("loss");
  return n;
}

/// Waits (at most `limit` s) until the metrics file shows step `step`.
bool wait_for_step(const std::string& metrics, int step, double limit = 120) {
  const auto t0 = clock_type::now();
  while (std::chrono::duration<double>(clock_type::now() - t0).count() < limit) {
    if (losses(metrics).count(step)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

/// The pid of a rank, from its watchdog heartbeat in DIR/.heartbeat.
pid_t rank_pid(const std::string& ckpt_dir, int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "/rank-%05d", rank);
  long long when = 0, pid = 0;
  for (int i = 0; i < 200 && pid == 0; ++i) {
    std::ifstream(ckpt_dir + "/.heartbeat" + name) >> when >> pid;
    if (pid == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return static_cast<pid_t>(pid);
}

/// After a job was torn down: waits (at most 10 s) until the process named in DIR/LOCK, if any, is
/// gone (mpiexec gives a killed job's ranks a second to end), so that the lock is stale.
void wait_lock_holder_gone(const std::string& dir) {
  long long pid = 0;
  std::ifstream(dir + "/LOCK") >> pid;
  for (int i = 0; pid > 0 && i < 500 && kill(static_cast<pid_t>(pid), 0) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

std::string latest(const std::string& dir) {
  std::string name;
  std::ifstream(dir + "/LATEST") >> name;
  return name;
}

std::uint32_t crc32(const std::string& bytes) {
  std::uint32_t table[256];
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  std::uint32_t c = ~0u;
  for (unsigned char b : bytes) c = table[(c ^ b) & 0xFF] ^ (c >> 8);
  return ~c;
}

/// Rewrites a step's MANIFEST after a shard was changed on purpose: the shard's size and CRC,
/// and the manifest's own checksum, as a careful attacker would.
void reseal(const std::string& step_dir, const std::string& shard) {
  std::istringstream in(read(step_dir + "/MANIFEST"));
  std::string line, text;
  const std::string bytes = read(step_dir + "/" + shard);
  while (std::getline(in, line)) {
    if (line.rfind("checksum ", 0) == 0) continue;
    if (line.rfind("shard " + shard, 0) == 0) {
      char crc[16];
      std::snprintf(crc, sizeof crc, "%08x", crc32(bytes));
      line = "shard " + shard + " " + std::to_string(bytes.size()) + " " + crc;
    }
    text += line + "\n";
  }
  char sum[32];
  std::snprintf(sum, sizeof sum, "checksum %08x\n", crc32(text));
  std::ofstream(step_dir + "/MANIFEST", std::ios::trunc) << text << sum;
}

// The matmul path pinned: the references are runs of their own, which measure their paths on first
// use, and where vendor and portable are close (an AMD EPYC) two runs may choose differently and
// differ in the last bits; a resumed run takes its checkpoint's paths.
const std::string small =
    "--layers 2 --width 64 --heads 4 --context 32 --batch 8 --warmup 2 --val-every 0 --matmul vendor ";

std::string step_name(int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", step);
  return name;
}

/// The uninterrupted reference: a run with these flags (without --ckpt-every), its losses.
std::map<int, std::string> reference(const std::string& args, int np, const std::string& name) {
  const auto m = tmp(name + ".json");
  const auto r = run(std::regex_replace(args, std::regex("--ckpt-every \\d+ "), "") + " --metrics " + m, np);
  REQUIRE(r.rc == 0);
  return losses(m);
}

/// Resumes DIR to the end and checks the losses of the resumed steps against the reference.
void resumes_bit_for_bit(const std::string& args, int np, const std::string& dir, const std::map<int, std::string>& ref,
                         const std::string& extra = "") {
  const auto m = dir + "_resumed.json";
  const auto r = run(args + " --resume --ckpt-dir " + dir + " --metrics " + m + " " + extra, np);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, ContainsSubstring("resumed from"));
  const auto got = losses(m);
  REQUIRE(!got.empty());
  for (const auto& [step, l] : got) {
    INFO("step " << step);
    CHECK(l == ref.at(step));
  }
}

}  // namespace

TEST_CASE("preflight: outputs are checked before training; the final checkpoint comes before the trace",
          "[examples][train_gpt][safety]") {
  const auto file = tmp("a_file");
  { std::ofstream(file) << "x"; }
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases{
      {"--metrics /no/such/dir/m.json", "--metrics /no/such/dir/m.json: cannot be written"},
      {"--trace /no/such/dir/t.json", "--trace /no/such/dir/t.json: cannot be written"},
      {"--ckpt-dir " + file + "/sub", "cannot create " + file + "/sub/LOCK"},
      {"--ckpt-every 2", "--ckpt-every 2 needs --ckpt-dir"},
      {"--ckpt-dir ''", "--ckpt-dir needs a directory"},
      {"--keep 2", "--keep needs --ckpt-dir"},
      {"--overwrite --resume --ckpt-dir " + tmp("x"), "--overwrite starts afresh and --resume continues"},
  };
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.args) {
      const auto r = run(small + "--steps 50 " + c.args, 2);
      CHECK(r.rc == 1);
      CHECK(r.seconds < 30);
      CHECK_THAT(r.out, ContainsSubstring("train_gpt: error:") && ContainsSubstring(c.message));
      CHECK_THAT(r.out, !ContainsSubstring("tok/s"));  // no training happened
    }
  }
  SECTION("the final checkpoint is written before the trace and the reports") {
    const auto dir = tmp("order");
    const auto r   = run(small + "--steps 2 --ckpt-dir " + dir + " --trace " + dir + ".trace.json", 2);
    REQUIRE(r.rc == 0);
    const auto saved = r.out.find("checkpoint: " + dir + "/step-00000002"), traced = r.out.find("trace: ");
    CHECK(saved != std::string::npos);
    CHECK(traced != std::string::npos);
    CHECK(saved < traced);
  }
}

TEST_CASE("preemption: a signal stops every rank at one step with a checkpoint; a second one at once",
          "[examples][train_gpt][safety]") {
  // a step of this model takes milliseconds: enough of them that the signal comes in time
  const std::string args = small + "--steps 1500 --ckpt-every 500 ";
  const auto ref         = reference(args, 2, "preempt_ref");
  REQUIRE(ref.size() == 1500);
  for (const std::string target : {"one rank (SIGTERM)", "mpiexec (SIGUSR1, forwarded)"}) {
    DYNAMIC_SECTION(target) {
      const auto dir = tmp("preempt_" + std::to_string(target.size())), m = dir + ".json";
      const auto trace = dir + ".trace.json";
      Job job(command(args + "--ckpt-dir " + dir + " --metrics " + m + " --trace " + trace, 2, ""), dir + ".out");
      REQUIRE(wait_for_step(m, 2));
      const auto t0 = clock_type::now();
      if (target[0] == 'o')
        kill(rank_pid(dir, 1), SIGTERM);
      else
        kill(job.pid, SIGUSR1);
      const auto r = job.wait();
      CHECK(std::chrono::duration<double>(clock_type::now() - t0).count() < 30);
      CHECK(r.rc == 75);
      const std::regex re(target[0] == 'o'
                              ? R"(stopped by SIGTERM after step (\d+): saved (\S+); --resume continues it)"
                              : R"(stopped by SIGUSR1 after step (\d+): saved (\S+); --resume continues it)");
      std::smatch match;
      REQUIRE(std::regex_search(r.out, match, re));
      const int last = std::stoi(match[1]);
      CHECK(last < 1499);
      CHECK(match[2].str() == dir + "/" + latest(dir));
      CHECK(latest(dir) == step_name(last + 1));
      CHECK(!fs::exists(dir + "/LOCK"));  // released on the way out
      // the trace of the steps run was written before the exit (every rank's events)
      std::ifstream in(trace);
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      CHECK_THAT(r.out, ContainsSubstring("trace: " + trace));
      CHECK(nlohmann::json::accept(text));
      CHECK_THAT(text, ContainsSubstring(R"("name":"step 0")") && ContainsSubstring("rank 1 (dp 1/2"));
      resumes_bit_for_bit(args, 2, dir, ref);
    }
  }
  SECTION("a signal while a save is written in the background: that save is finished first") {
    // rank 1's writer holds the save of step 500 for 3 s (PMT_CHECKPOINT_TEST_SLOW); the signal
    // comes meanwhile
    const auto dir = tmp("preempt_in_flight"), m = dir + ".json";
    Job job(command(args + "--ckpt-dir " + dir + " --metrics " + m, 2, "PMT_CHECKPOINT_TEST_SLOW=1:500"), dir + ".out");
    REQUIRE(wait_for_step(m, 502));
    kill(rank_pid(dir, 1), SIGTERM);
    const auto r = job.wait();
    CHECK(r.rc == 75);
    std::smatch match;
    REQUIRE(std::regex_search(r.out, match, std::regex(R"(stopped by SIGTERM after step (\d+): saved)")));
    const int last = std::stoi(match[1]);
    // the signal came while rank 1 still wrote: the stop finished that save, then saved its own
    const auto waiting  = r.out.find("stopping: first finishing the checkpoint being written in the background");
    const auto finished = r.out.find("step-00000500 (written in the background");
    CHECK(waiting != std::string::npos);
    CHECK(finished != std::string::npos);
    CHECK(waiting < finished);
    CHECK(finished < r.out.find("stopped by SIGTERM"));
    CHECK(latest(dir) == step_name(last + 1));
    CHECK(fs::exists(dir + "/" + step_name(500) + "/MANIFEST"));  // whole: renamed from .partial after its manifest
    resumes_bit_for_bit(args, 2, dir, ref);
  }
  SECTION("a rank killed while a save is written in the background: LATEST keeps the one before") {
    const auto dir = tmp("kill_in_flight"), m = dir + ".json";
    Job job(command(args + "--ckpt-dir " + dir + " --metrics " + m, 2, "PMT_CHECKPOINT_TEST_SLOW=1:1000"),
            dir + ".out");
    REQUIRE(wait_for_step(m, 1002));
    kill(rank_pid(dir, 1), SIGKILL);
    const auto r = job.wait();
    CHECK(r.rc != 0);
    CHECK(latest(dir) == step_name(500));
    CHECK(fs::exists(dir + "/" + step_name(1000) + ".partial"));
    wait_lock_holder_gone(dir);
    resumes_bit_for_bit(args, 2, dir, ref);
  }
  SECTION("a second signal ends the job at once; the last checkpoint stays good") {
    const auto dir = tmp("preempt_twice"), m = dir + ".json";
    Job job(command(args + "--ckpt-dir " + dir + " --metrics " + m, 2, ""), dir + ".out");
    REQUIRE(wait_for_step(m, 510));  // after the checkpoint of step 500
    const pid_t rank1 = rank_pid(dir, 1);
    const auto t0     = clock_type::now();
    kill(rank1, SIGTERM);
    kill(rank1, SIGINT);  // not SIGTERM again: two of one signal, both pending, are delivered as one
    const auto r = job.wait();
    CHECK(std::chrono::duration<double>(clock_type::now() - t0).count() < 30);
    CHECK(r.rc != 0);
    CHECK(r.rc != 75);
    CHECK_THAT(r.out, ContainsSubstring("a second signal: stopping at once"));
    REQUIRE(!latest(dir).empty());
    wait_lock_holder_gone(dir);
    resumes_bit_for_bit(args, 2, dir, ref);
  }
}

TEST_CASE("one writer per checkpoint directory; --overwrite; --resume finds the newest good checkpoint",
          "[examples][train_gpt][safety]") {
  const std::string args = small + "--steps 6 --ckpt-every 2 ";
  const auto ref         = reference(args, 1, "writer_ref");
  const auto dir         = tmp("writer");
  fs::remove_all(dir);
  SECTION("a second run on a directory in use is refused; a killed run's lock is taken over") {
    Job first(command(small + "--steps 100000 --ckpt-dir " + dir + " --metrics " + dir + ".json", 1, ""), dir + ".out");
    REQUIRE(wait_for_step(dir + ".json", 1));
    const auto second = run(args + "--resume --ckpt-dir " + dir);
    CHECK(second.rc == 1);
    CHECK(second.seconds < 30);
    CHECK_THAT(second.out, ContainsSubstring(dir + " is in use by pid " + std::to_string(first.pid)));
    const pid_t crashed = first.pid;
    kill(crashed, SIGKILL);  // a crash: the lock stays behind
    first.wait();
    CHECK(fs::exists(dir + "/LOCK"));
    const auto third = run(args + "--ckpt-dir " + dir);
    REQUIRE(third.rc == 0);
    CHECK_THAT(third.out, ContainsSubstring("removed a stale lock of pid " + std::to_string(crashed)));
  }
  SECTION("a fresh run into old checkpoints needs --overwrite") {
    REQUIRE(run(args + "--ckpt-dir " + dir).rc == 0);
    const auto again = run(args + "--ckpt-dir " + dir);
    CHECK(again.rc == 1);
    CHECK_THAT(again.out,
               ContainsSubstring(dir + " holds 3 checkpoint(s), the newest step-00000006: continue them with "
                                       "--resume, or replace them with --overwrite"));
    CHECK(latest(dir) == "step-00000006");  // untouched
    const auto over = run(small + "--steps 3 --ckpt-dir " + dir + " --overwrite");
    REQUIRE(over.rc == 0);
    CHECK_THAT(over.out, ContainsSubstring("--overwrite removed 3 checkpoint(s)"));
    CHECK(latest(dir) == "step-00000003");
    CHECK(!fs::exists(dir + "/step-00000006"));
  }
  SECTION("--resume with LATEST missing, damaged or naming an incomplete step: the newest step that verifies") {
    REQUIRE(run(args + "--ckpt-dir " + dir).rc == 0);
    fs::remove_all(dir + "/step-00000006");
    fs::remove_all(dir + "/step-00000004");
    fs::create_directories(dir + "/step-00000004");  // a step without a manifest
    for (const std::string how : {"missing", "garbage", "incomplete"}) {
      if (how == "missing") fs::remove(dir + "/LATEST");
      if (how == "garbage") std::ofstream(dir + "/LATEST") << "\x01\x02zz/../..\n";
      if (how == "incomplete") std::ofstream(dir + "/LATEST") << "step-00000004\n";
      INFO(how);
      const auto copy = dir + "_" + how;
      fs::remove_all(copy);
      fs::copy(dir, copy, fs::copy_options::recursive);
      const auto r = run(args + "--resume --ckpt-dir " + copy + " --metrics " + copy + ".json");
      REQUIRE(r.rc == 0);
      CHECK_THAT(r.out, ContainsSubstring("resuming from the newest checkpoint that verifies, step-00000002"));
      CHECK_THAT(r.out, ContainsSubstring("resumed from " + copy + "/step-00000002"));
      for (const auto& [step, l] : losses(copy + ".json")) CHECK(l == ref.at(step));
    }
  }
}

TEST_CASE("hardened loading: a hand-edited manifest, a crafted shard, a changed configuration",
          "[examples][train_gpt][safety]") {
  const std::string args = small + "--steps 6 --ckpt-every 2 ";
  const auto ref         = reference(args, 2, "hardened_ref");
  const auto dir         = tmp("hardened");
  fs::remove_all(dir);
  REQUIRE(run(args + "--ckpt-dir " + dir, 2).rc == 0);
  fs::remove_all(dir + "/step-00000006");
  { std::ofstream(dir + "/LATEST") << "step-00000004\n"; }
  SECTION("a manifest edited by hand") {
    std::string text = read(dir + "/step-00000004/MANIFEST");
    const auto at    = text.find("adam_steps 4");
    REQUIRE(at != std::string::npos);
    text[at + 11] = '5';
    std::ofstream(dir + "/step-00000004/MANIFEST", std::ios::trunc) << text;
    const auto r = run(args + "--resume --ckpt-dir " + dir, 2);
    CHECK(r.rc == 1);
    CHECK_THAT(r.out,
               ContainsSubstring("step-00000004/MANIFEST: damaged manifest (its checksum does not match its text)") &&
                   ContainsSubstring("step-00000002 verifies: write its name into"));
  }
  SECTION("a crafted shard whose sizes overflow, with a matching CRC and manifest") {
    // record 0: global = local = (2^33, 2^33) 4-byte values, 0 data bytes: local0 x local1 x 4
    // wraps to 0 in 64 bits, so a loader that multiplied unchecked would read far past the file
    std::string bytes = read(dir + "/step-00000004/shard-00001.bin");
    std::uint32_t len = 0;
    std::memcpy(&len, bytes.data() + 12, 4);
    const std::size_t dims  = 16 + len + 4;  // global[2], offset[2], local[2], then nbytes
    const std::uint64_t big = std::uint64_t(1) << 33, zero = 0;
    for (int k = 0; k < 2; ++k) std::memcpy(&bytes[dims + 8 * k], &big, 8);
    for (int k = 0; k < 2; ++k) std::memcpy(&bytes[dims + 16 + 8 * k], &zero, 8);
    for (int k = 0; k < 2; ++k) std::memcpy(&bytes[dims + 32 + 8 * k], &big, 8);
    std::memcpy(&bytes[dims + 48], &zero, 8);
    std::ofstream(dir + "/step-00000004/shard-00001.bin", std::ios::binary | std::ios::trunc) << bytes;
    reseal(dir + "/step-00000004", "shard-00001.bin");
    const auto r =
        run(small + "--steps 6 --tp 2 --resume --ckpt-dir " + dir, 2);  // another layout: every rank reads every shard
    CHECK(r.rc == 1);
    CHECK_THAT(r.out, ContainsSubstring("shard-00001.bin: record 0 (") &&
                          ContainsSubstring(") is damaged: 0 data bytes for a (8589934592, 8589934592) slice"));
    // the older checkpoint still loads and resumes bit for bit
    { std::ofstream(dir + "/LATEST") << "step-00000002\n"; }
    resumes_bit_for_bit(args, 2, dir, ref);
  }
  SECTION("a changed --seed is refused, and allowed with --allow-changed-config") {
    const auto r = run(small + "--steps 6 --seed 2 --resume --ckpt-dir " + dir, 2);
    CHECK(r.rc == 1);
    CHECK_THAT(r.out, ContainsSubstring("with a changed configuration: --seed 2 (the saved run: 1)"));
    const auto ok = run(small + "--steps 6 --seed 2 --resume --allow-changed-config --ckpt-dir " + dir, 2);
    CHECK(ok.rc == 0);
    CHECK_THAT(ok.out, ContainsSubstring("resuming with a changed configuration (--allow-changed-config): --seed 2"));
  }
}

TEST_CASE("numerics: a nan loss stops the run or skips steps; no checkpoint holds nan",
          "[examples][train_gpt][safety]") {
  const auto dir = tmp("nan");
  const auto r   = run(
        small + "--steps 20 --lr 1e30 --warmup 0 --ckpt-every 1 --ckpt-dir " + dir + " --trace " + dir + ".trace.json",
        2);
  CHECK(r.rc == 3);
  CHECK(r.seconds < 60);
  {  // the stopped run's trace is written, every rank's
    std::ifstream in(dir + ".trace.json");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(nlohmann::json::accept(text));
    CHECK_THAT(text, ContainsSubstring(R"("name":"step 0")") && ContainsSubstring("rank 1 (dp 1/2"));
  }
  std::smatch m;
  REQUIRE(std::regex_search(r.out, m, std::regex(R"(error: step (\d+): loss (-?nan|-?inf))")));
  const int bad = std::stoi(m[1]);
  CHECK_THAT(r.out, ContainsSubstring("stopping; the update was not applied and nothing was saved"));
  // LATEST names the checkpoint of the last step with a finite loss, and it loads
  CHECK(latest(dir) == step_name(bad));
  const auto again = run(small + "--steps 20 --lr 1e30 --warmup 0 --resume --ckpt-dir " + dir, 2);
  CHECK(again.rc == 3);
  CHECK_THAT(again.out, ContainsSubstring("resumed from " + dir + "/" + step_name(bad)) &&
                            ContainsSubstring("error: step " + std::to_string(bad) + ": loss"));
  // --on-nonfinite skip: steps are skipped, ten in a row stop the run
  const auto skip = run(small + "--steps 40 --lr 1e30 --warmup 0 --on-nonfinite skip", 2);
  CHECK(skip.rc == 3);
  CHECK_THAT(skip.out, ContainsSubstring("update skipped (--on-nonfinite skip; 1 in a row)") &&
                           ContainsSubstring("10 steps in a row were skipped"));
}

TEST_CASE("hangs: the watchdog names a stopped rank; ranks with other flags get one error",
          "[examples][train_gpt][safety]") {
  const std::string args = small + "--steps 1500 --ckpt-every 500 ";
  const auto ref         = reference(args, 2, "hang_ref");
  const auto dir = tmp("hang"), m = dir + ".json";
  const auto trace = dir + ".trace.json";
  Job job(command(args + "--watchdog 3 --ckpt-dir " + dir + " --metrics " + m + " --trace " + trace, 2, ""),
          dir + ".out");
  REQUIRE(wait_for_step(m, 510));  // after the checkpoint of step 500
  const pid_t rank1 = rank_pid(dir, 1);
  const auto t0     = clock_type::now();
  kill(rank1, SIGSTOP);
  const auto r = job.wait();
  kill(rank1, SIGKILL);
  const double took = std::chrono::duration<double>(clock_type::now() - t0).count();
  CHECK(took < 40);
  CHECK(r.rc != 0);
  CHECK_THAT(r.out, ContainsSubstring("train_gpt: error: watchdog: rank 0 waited") &&
                        ContainsSubstring("never arrived: rank 1 (no heartbeat for") &&
                        ContainsSubstring("stopped or dead"));
  {  // the rank the watchdog ended kept its own trace (the stopped one cannot be reached)
    CHECK_THAT(r.out, ContainsSubstring("rank 0's trace: " + trace + ".rank-0"));
    std::ifstream in(trace + ".rank-0");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(nlohmann::json::accept(text));
    CHECK_THAT(text, ContainsSubstring(R"("name":"step 500")"));
  }
  REQUIRE(!latest(dir).empty());
  // rank 0 ended at once: its lock stays, and the resumed run takes it over as stale
  wait_lock_holder_gone(dir);
  resumes_bit_for_bit(args, 2, dir, ref);
  // an MPMD launch with different flags per rank: one clear error, at once
  const std::string cmd = "env " + base_env + " OMP_NUM_THREADS=1 " + PMT_MPIEXEC + " --oversubscribe -n 1 " +
                          PMT_TRAIN_GPT + " " + small + "--steps 2 : -n 1 " + PMT_TRAIN_GPT + " " + small + "--steps 3";
  Job mpmd(cmd, dir + ".mpmd.out");
  const auto r2 = mpmd.wait();
  CHECK(r2.rc == 1);
  CHECK(r2.seconds < 30);
  CHECK_THAT(r2.out, ContainsSubstring(
                         "the ranks hold different flags (command line and PMT_MATMUL): rank 1 differs from rank 0"));
}

TEST_CASE("small ones: threads, Kokkos flags, metrics on resume, --keep, leftovers, a device as data",
          "[examples][train_gpt][safety]") {
  SECTION("--threads works; ranks sharing cores get their share; a count beyond the node is capped or refused") {
    const auto one = run(small + "--steps 1 --threads 1");
    CHECK(one.rc == 0);
    CHECK_THAT(one.out, ContainsSubstring("1 thread(s) per rank"));
    const auto shared = run(small + "--steps 1", 4, "", /*threads=*/false);
    CHECK(shared.rc == 0);
    const unsigned cores = std::thread::hardware_concurrency();
    const unsigned each  = cores / 4 > 0 ? cores / 4 : 1;
    CHECK_THAT(shared.out,
               ContainsSubstring("threads: " + std::to_string(each) + " per rank (OMP_NUM_THREADS unset: ") &&
                   ContainsSubstring(std::to_string(each) + " thread(s) per rank"));
    if (cores >= 2) {  // OMP_NUM_THREADS = the node's cores on each of 4 ranks: capped to the share, and said
      const std::string c = std::to_string(cores);
      const auto capped   = run(small + "--steps 1", 4, "OMP_NUM_THREADS=" + c, /*threads=*/false);
      CHECK(capped.rc == 0);
      CHECK_THAT(capped.out, ContainsSubstring("threads: " + std::to_string(each) + " per rank instead of " + c +
                                               " (OMP_NUM_THREADS): 4 ranks x " + c +
                                               " threads would oversubscribe this node's " + c + " cores") &&
                                 ContainsSubstring(std::to_string(each) + " thread(s) per rank"));
      const auto kept = run(small + "--steps 1", 2, "OMP_NUM_THREADS=" + c + " PMT_OVERSUBSCRIBE=1", false);
      CHECK(kept.rc == 0);
      CHECK_THAT(kept.out, ContainsSubstring(c + " thread(s) per rank"));
    }
    const auto huge = run(small + "--steps 1 --threads 1073741824");
    CHECK(huge.rc == 1);
    CHECK_THAT(huge.out, ContainsSubstring("--threads 1073741824: expected an integer from 1 to ") &&
                             ContainsSubstring("cores)"));
  }
  SECTION("a mistyped Kokkos flag is an error; a real one is passed on") {
    const auto typo = run(small + "--steps 1 --kokkos-disable-warning");
    CHECK(typo.rc == 1);
    CHECK_THAT(typo.out, ContainsSubstring("unknown Kokkos flag --kokkos-disable-warning"));
    CHECK(run(small + "--steps 1 --kokkos-disable-warnings").rc == 0);
  }
  SECTION("metrics after a resume name each step once; --keep; leftovers of a save are removed") {
    const auto dir = tmp("small_ones"), m = dir + ".json";
    REQUIRE(run(small + "--steps 6 --ckpt-every 1 --keep 2 --ckpt-dir " + dir + " --metrics " + m).rc == 0);
    std::vector<std::string> steps;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().rfind("step-", 0) == 0) steps.push_back(e.path().filename().string());
    std::sort(steps.begin(), steps.end());
    CHECK(steps == std::vector<std::string>{"step-00000005", "step-00000006"});
    { std::ofstream(dir + "/LATEST") << "step-00000005\n"; }
    fs::create_directories(dir + "/step-00000007.partial");
    const auto r = run(small + "--steps 6 --resume --ckpt-dir " + dir + " --metrics " + m);
    REQUIRE(r.rc == 0);
    CHECK_THAT(r.out, ContainsSubstring("removed 1 leftover(s) of an interrupted save") &&
                          ContainsSubstring("keeps 5 lines up to step 5, dropped"));
    CHECK(!fs::exists(dir + "/step-00000007.partial"));
    for (int s = 0; s < 6; ++s) CHECK(step_lines(m, s) == 1);
  }
  SECTION("where ranks compute (--device, --comm) is in the banner; what the build cannot run is refused") {
    // this build's Kokkos has no GPU backend: --device default is its default host space
    const auto host = run(small + "--steps 1 --device host --comm mpi", 2);
    CHECK(host.rc == 0);
    CHECK_THAT(host.out, ContainsSubstring("thread(s) per rank on Kokkos::") && ContainsSubstring(", MPI\n"));
    const auto nccl = run(small + "--steps 1 --comm nccl", 2);
    CHECK(nccl.rc == 1);
    CHECK(nccl.seconds < 30);
    CHECK_THAT(nccl.out, ContainsSubstring("--comm nccl cannot connect host ranks") &&
                             ContainsSubstring("it can: mpi; NCCL needs GPU ranks"));
    const auto bad = run(small + "--steps 1 --device gpu");
    CHECK(bad.rc == 1);
    CHECK_THAT(bad.out, ContainsSubstring("--device"));
  }
  SECTION("a device is refused as data") {
    const auto r = run(small + "--steps 1 --data /dev/zero");
    CHECK(r.rc == 1);
    CHECK(r.seconds < 30);
    CHECK_THAT(r.out, ContainsSubstring("/dev/zero: not a regular file"));
  }
}
