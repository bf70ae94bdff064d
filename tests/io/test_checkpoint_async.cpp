// SPDX-License-Identifier: Apache-2.0
// Asynchronous checkpoints (io/checkpoint_async.hpp): the files of a background save are the
// blocking save's, byte for byte, although the model changes while they are written; poll()
// finishes a save once every rank's shard is written, a second save waits for the first, and
// the faults of a blocking save hold for it too: a full disk (a file-size limit on one rank), a
// read-only directory and nan in the state raise pmt::IoError on every rank, a saver
// destroyed with a save in flight leaves a .partial directory, and LATEST keeps naming the last
// whole checkpoint through all of them.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "../comm/comm_test.hpp"
#include "pmt/io/checkpoint_async.hpp"
#include "pmt/nn/activation.hpp"
#include "pmt/nn/chain.hpp"
#include "pmt/nn/linear.hpp"
#include "pmt/optim/optimizers.hpp"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

using Host    = Kokkos::DefaultHostExecutionSpace;
using Backend = pmt::test::World::backend;

namespace {

using Col    = pmt::nn::Linear<double, pmt::TensorSplit<pmt::Col>, Host, Backend>;
using Row    = pmt::nn::Linear<double, pmt::TensorSplit<pmt::Row>, Host, Backend>;
using Act    = pmt::nn::Gelu<double, Host>;
using Blocks = pmt::nn::Chain<Col, Act, Row>;

Blocks make(const pmt::Mesh<Backend>& mesh) {
  Blocks m(Col(mesh, 8, 32, {5, 1}), Act(), Row(mesh, 32, 8, {5, 2}));
  pmt::nn::name_parameters(m.parameters(), "net");
  return m;
}

/// Made-up gradients and an AdamW step, so that values and moments change.
void train_step(Blocks& m, pmt::optim::AdamW<double, Host>& opt, int step) {
  for (auto* p : m.parameters()) {
    const auto g = p->grad2d();
    for (std::size_t a = 0; a < g.extent(0); ++a)
      for (std::size_t b = 0; b < g.extent(1); ++b) g(a, b) = std::sin(double(3 * a + 5 * b + step));
  }
  opt.step(Host(), 1e-2);
  Host().fence();
}

std::string file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Every file of two step directories, byte for byte (the files are named alike).
bool same_files(const std::filesystem::path& a, const std::filesystem::path& b) {
  std::size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(a)) {
    const auto other = b / e.path().filename();
    if (!std::filesystem::exists(other) || file(e.path()) != file(other)) return false;
    ++n;
  }
  return n > 1 && n == static_cast<std::size_t>(std::distance(std::filesystem::directory_iterator(b), {}));
}

/// A directory nothing can be created in: mode 0555, or for root (whom modes do not stop) the
/// immutable attribute. Returns an empty string, or why it could not be made.
std::string make_read_only(const std::string& dir, bool on) {
  if (::geteuid() != 0) return ::chmod(dir.c_str(), on ? 0555 : 0755) == 0 ? "" : std::strerror(errno);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return std::strerror(errno);
  int flags = 0;
  std::string why;
  if (::ioctl(fd, FS_IOC_GETFLAGS, &flags) != 0) why = std::strerror(errno);
  flags = on ? flags | FS_IMMUTABLE_FL : flags & ~FS_IMMUTABLE_FL;
  if (why.empty() && ::ioctl(fd, FS_IOC_SETFLAGS, &flags) != 0) why = std::strerror(errno);
  ::close(fd);
  return why;
}

}  // namespace

TEST_CASE("an asynchronous save writes the blocking save's files while the model changes; poll finishes it",
          "[io][checkpoint][mpi]") {
  const auto& w = pmt::test::world();
  pmt::Mesh<Backend> mesh(w, pmt::MeshShape{1, w.size(), 1});
  const std::filesystem::path dir = pmt::test::shared_temp_path(w, "pmt-test-async-checkpoint");
  const auto blocking = dir / "blocking", background = dir / "background";
  Blocks model = make(mesh);
  pmt::optim::AdamW<double, Host> opt(model.parameters(), {});
  for (int s = 0; s < 2; ++s) train_step(model, opt, s);
  pmt::io::CheckpointInfo info;
  info.step  = 2;
  info.model = "mlp d=8 hidden=32";

  pmt::io::save_checkpoint(blocking.string(), mesh, opt, info);
  pmt::io::AsyncCheckpointer<Backend> saver(mesh);
  saver.save(background.string(), opt, info);
  CHECK(saver.in_flight());
  // training goes on while the shard is written: the checkpoint holds the state of the snapshot
  for (int s = 2; s < 4; ++s) train_step(model, opt, s);
  CHECK(pmt::test::all_ranks(!std::filesystem::exists(background / "LATEST")));  // not before it is finished
  CHECK(saver.wait() == (background / "step-00000002").string());
  CHECK(!saver.in_flight());
  CHECK(saver.wait().empty());  // nothing in flight
  CHECK(
      pmt::test::all_ranks(pmt::io::latest_checkpoint(background.string()) == (background / "step-00000002").string()));
  CHECK(pmt::test::all_ranks(same_files(blocking / "step-00000002", background / "step-00000002")));
  UNSCOPED_INFO("snapshot " << saver.blocking_seconds() << " s, writer " << saver.writing_seconds() << " s");
  CHECK(saver.blocking_seconds() > 0);
  CHECK(saver.writing_seconds() > 0);

  // poll() at every step boundary: it finishes the save once every rank's shard is written
  info.step = 4;
  pmt::io::save_checkpoint(blocking.string(), mesh, opt, info);
  saver.save(background.string(), opt, info);
  std::string finished;
  int polls = 0;
  for (; finished.empty(); ++polls) {
    train_step(model, opt, 10 + polls);
    finished = saver.poll();  // collective: every rank learns the same
    if (finished.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  UNSCOPED_INFO("finished after " << polls << " polls");
  CHECK(finished == (background / "step-00000004").string());
  CHECK(saver.poll().empty());
  CHECK(pmt::test::all_ranks(same_files(blocking / "step-00000004", background / "step-00000004")));

  // a second save waits for the first: both whole, LATEST names the second
  info.step = 5;
  saver.save(background.string(), opt, info);
  info.step = 6;
  saver.save(background.string(), opt, info);
  CHECK(!saver.wait().empty());
  CHECK(pmt::test::all_ranks(pmt::io::verify_checkpoint((background / "step-00000005").string()) == 5));
  CHECK(
      pmt::test::all_ranks(pmt::io::latest_checkpoint(background.string()) == (background / "step-00000006").string()));

  // the checkpoint loads as a blocking save's does
  Blocks other = make(mesh);
  pmt::optim::AdamW<double, Host> other_opt(other.parameters(), {});
  CHECK(pmt::io::load_checkpoint((background / "step-00000006").string(), mesh, other_opt, info.model).step == 6);
  CHECK(other_opt.steps() == opt.steps());
  pmt::comm::barrier(w);
  if (w.rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("the faults of a blocking save hold for an asynchronous one; LATEST names a whole checkpoint",
          "[io][checkpoint][mpi]") {
  const auto& w = pmt::test::world();
  const int r = w.rank(), last = w.size() - 1;
  pmt::Mesh<Backend> mesh(w, pmt::MeshShape{1, w.size(), 1});
  Blocks model = make(mesh);
  pmt::optim::AdamW<double, Host> opt(model.parameters(), {});
  train_step(model, opt, 0);
  pmt::io::CheckpointInfo info;
  info.model = "mlp d=8 hidden=32";
  for (const bool async : {false, true}) {
    DYNAMIC_SECTION((async ? "asynchronous" : "blocking")) {
      const std::filesystem::path dir =
          pmt::test::shared_temp_path(w, async ? "pmt-test-async-faults" : "pmt-test-blocking-faults");
      const std::string good = (dir / "step-00000001").string();
      pmt::io::AsyncCheckpointer<Backend> saver(mesh);
      const auto save = [&](int step) {
        info.step = step;
        if (!async) return pmt::io::save_checkpoint(dir.string(), mesh, opt, info);
        saver.save(dir.string(), opt, info);
        return saver.wait();
      };
      CHECK(save(1) == good);
      const auto latest_is_good = [&] {
        return pmt::test::all_ranks(pmt::io::latest_checkpoint(dir.string()) == good &&
                                    pmt::io::checkpoint_steps(dir.string()) ==
                                        std::vector<std::string>{"step-00000001"});
      };

      // a full disk on the last rank (a file-size limit: writes beyond 1 KiB fail with EFBIG)
      rlimit old{};
      ::getrlimit(RLIMIT_FSIZE, &old);
      const auto xfsz = std::signal(SIGXFSZ, SIG_IGN);
      if (r == last) {
        rlimit small   = old;
        small.rlim_cur = 1024;
        ::setrlimit(RLIMIT_FSIZE, &small);
      }
      std::string what;
      try {
        save(2);
      } catch (const pmt::IoError& e) {
        what = e.what();
      }
      ::setrlimit(RLIMIT_FSIZE, &old);
      std::signal(SIGXFSZ, xfsz);
      UNSCOPED_INFO(what);
      CHECK(pmt::test::all_ranks(what.find(r == last ? "cannot write " : "writing a shard failed on 1 other rank(s)") !=
                                 std::string::npos));
      CHECK(latest_is_good());

      // nan on the last rank: refused before its shard is written (asynchronous: when the save is
      // finished), on every rank
      const double kept = model.parameters()[0]->value(0);
      if (r == last) model.parameters()[0]->value(0) = std::nan("");
      what.clear();
      try {
        save(3);
      } catch (const pmt::IoError& e) {
        what = e.what();
      }
      model.parameters()[0]->value(0) = kept;
      CHECK(pmt::test::all_ranks(what.find(r == last ? "refusing to save step 3" : "failed on 1 other rank(s)") !=
                                 std::string::npos));
      CHECK(!saver.in_flight());
      CHECK(latest_is_good());

      // a read-only checkpoint directory: the step directory cannot be made
      std::string why = r == 0 ? make_read_only(dir.string(), true) : "";
      INFO("making " << dir.string() << " read-only: " << why);
      REQUIRE(pmt::test::all_ranks(why.empty()));
      what.clear();
      try {
        save(4);
      } catch (const pmt::IoError& e) {
        what = e.what();
      }
      if (r == 0) why = make_read_only(dir.string(), false);
      REQUIRE(pmt::test::all_ranks(why.empty()));
      UNSCOPED_INFO(what);
      CHECK(pmt::test::all_ranks(what.find(r == 0 ? "cannot create " : "failed on 1 other rank(s)") !=
                                 std::string::npos));
      CHECK(latest_is_good());

      if (async) {
        // a saver destroyed with a save in flight (an error unwinding one rank, a shutdown): its
        // writer is waited for, nothing is finished, the step stays .partial and is never loaded
        {
          pmt::io::AsyncCheckpointer<Backend> dropped(mesh);
          info.step = 5;
          dropped.save(dir.string(), opt, info);
        }
        pmt::comm::barrier(w);
        CHECK(pmt::test::all_ranks(std::filesystem::exists(dir / "step-00000005.partial")));
        CHECK(latest_is_good());
        CHECK(pmt::test::all_ranks(pmt::io::resumable_checkpoint(dir.string()) == good));
      }
      pmt::comm::barrier(w);
      if (r == 0) std::filesystem::remove_all(dir);
    }
  }
}
