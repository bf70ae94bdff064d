// SPDX-License-Identifier: Apache-2.0
// Trains a byte-level GPT (vocabulary = 256 byte values) on a text file with any dp x tp layout of
// the MPI ranks. The data needs no download: by default the project's own documentation
// (every .md file of docs/ at build time). Every layout sees the same global batches: step s draws
// its sequences' start offsets from Philox keyed by (seed, s), and dp rank d trains on its slice.
//   mpiexec -n 4 01_train_gpt --dp 2 --tp 2 --steps 50
#include <pmt/pmt.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#ifndef PMT_DEFAULT_DATA_DIR
#define PMT_DEFAULT_DATA_DIR "docs"
#endif

namespace {

struct Options {
  int dp = 0, tp = 1, steps = 40, layers = 2, width = 128, heads = 4, context = 64, batch = 8, warmup = 5;
  double lr = 3e-3;
  std::uint64_t seed = 1;
  std::string data = PMT_DEFAULT_DATA_DIR;
};

[[noreturn]] void usage(int code) {
  std::printf(
      "usage: 01_train_gpt [--dp N] [--tp N] [--steps N] [--layers N] [--width N] [--heads N]\n"
      "                    [--context N] [--batch N] [--lr X] [--warmup N] [--seed N] [--data PATH]\n"
      "  dp x tp must equal the number of MPI ranks (dp defaults to ranks / tp).\n"
      "  --data: a text file, or a directory whose .md files are concatenated\n"
      "          (default: %s, the project's documentation).\n",
      PMT_DEFAULT_DATA_DIR);
  std::exit(code);
}

Options parse(int argc, char* argv[]) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") usage(0);
    if (i + 1 >= argc) throw pmt::ConfigError("01_train_gpt", "option " + a + " needs a value (see --help)");
    const std::string v = argv[++i];
    auto as_int = [&](int min) {
      char* end = nullptr;
      const long x = std::strtol(v.c_str(), &end, 10);
      if (*end != '\0' || x < min) throw pmt::ConfigError("01_train_gpt", a + " " + v + ": expected an integer >= " + std::to_string(min));
      return static_cast<int>(x);
    };
    if (a == "--dp") o.dp = as_int(1);
    else if (a == "--tp") o.tp = as_int(1);
    else if (a == "--steps") o.steps = as_int(1);
    else if (a == "--layers") o.layers = as_int(1);
    else if (a == "--width") o.width = as_int(1);
    else if (a == "--heads") o.heads = as_int(1);
    else if (a == "--context") o.context = as_int(2);
    else if (a == "--batch") o.batch = as_int(1);
    else if (a == "--warmup") o.warmup = as_int(0);
    else if (a == "--seed") o.seed = static_cast<std::uint64_t>(as_int(0));
    else if (a == "--lr") o.lr = std::atof(v.c_str());
    else if (a == "--data") o.data = v;
    else throw pmt::ConfigError("01_train_gpt", "unknown option " + a + " (see --help)");
  }
  return o;
}

std::string read_text(const std::string& path) {
  namespace fs = std::filesystem;
  std::string text;
  std::vector<fs::path> files;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path))
      if (e.path().extension() == ".md") files.push_back(e.path());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw pmt::IoError("01_train_gpt", "cannot read " + f.string());
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return text;
}

}  // namespace

int main(int argc, char* argv[]) {
  pmt::ScopeGuard guard(argc, argv);
  using Exec    = Kokkos::DefaultHostExecutionSpace;
  using Backend = pmt::comm::default_backend_t<Exec>;
  try {
    Options o = parse(argc, argv);
#if PMT_ENABLE_MPI
    pmt::comm::Communicator<Backend> world(MPI_COMM_WORLD);
#else
    pmt::comm::Communicator<Backend> world;
#endif
    if (o.dp == 0) o.dp = world.size() / o.tp;
    pmt::Mesh<Backend> mesh(world, pmt::MeshShape{o.dp, o.tp, 1});  // raises with every factor on a mismatch
    if (o.batch % o.dp != 0)
      throw pmt::ConfigError("01_train_gpt", "--batch " + std::to_string(o.batch) + " is not divisible by dp = " + std::to_string(o.dp));
    const std::string text = read_text(o.data);
    const std::size_t T = static_cast<std::size_t>(o.context);
    if (text.size() < T + 1)
      throw pmt::IoError("01_train_gpt", o.data + " holds " + std::to_string(text.size()) + " bytes; need at least context + 1 = " +
                                             std::to_string(T + 1));
    using Model = pmt::nn::Gpt<float, Exec, Backend>;
    using Opt   = pmt::optim::AdamW<float, Exec>;
    Model model(mesh, pmt::nn::GptConfig{256, T, static_cast<std::size_t>(o.layers), static_cast<std::size_t>(o.width),
                                         static_cast<std::size_t>(o.heads), o.seed});
    Opt opt(model.parameters(), pmt::ops::AdamWParams{o.lr, 0.9, 0.95, 1e-8, 0.1, 1});
    pmt::train::Trainer<Model, Opt, Exec, Backend> trainer(mesh, model, opt);
    const std::size_t B_local = static_cast<std::size_t>(o.batch / o.dp);
    const std::size_t first   = B_local * static_cast<std::size_t>(mesh.coord(pmt::Axis::dp));
    if (mesh.is_root())
      std::printf("pmt 01_train_gpt: %zu bytes of text from %s; %d ranks = dp %d x tp %d; GPT %d layers, width %d, "
                  "%d heads, context %zu; global batch %d\n",
                  text.size(), o.data.c_str(), world.size(), o.dp, o.tp, o.layers, o.width, o.heads, T, o.batch);
    pmt::train::Microbatch<Model::Ids> mb{Model::Ids("ids", B_local * T), Model::Ids("targets", B_local * T), B_local, T};
    auto ids = Kokkos::create_mirror_view(mb.ids), tgt = Kokkos::create_mirror_view(mb.targets);
    for (int step = 0; step < o.steps; ++step) {
      for (std::size_t b = 0; b < B_local; ++b) {  // the same global batch on every layout
        const double u = pmt::random_uniform(pmt::RngKey{o.seed, 1000}, static_cast<std::uint64_t>(step) * 4096 + first + b);
        const std::size_t start = static_cast<std::size_t>(u * static_cast<double>(text.size() - T - 1));
        for (std::size_t t = 0; t < T; ++t) {
          ids(b * T + t) = static_cast<unsigned char>(text[start + t]);
          tgt(b * T + t) = static_cast<unsigned char>(text[start + t + 1]);
        }
      }
      Kokkos::deep_copy(mb.ids, ids);
      Kokkos::deep_copy(mb.targets, tgt);
      const double lr = pmt::optim::warmup_cosine(step, o.warmup, o.steps, o.lr, o.lr / 10);
      Kokkos::Timer timer;
      const double loss = trainer.step({mb}, pmt::train::StepOptions{double(o.batch) * double(T), lr, 1.0});
      const double s = timer.seconds();
      if (mesh.is_root())
        std::printf("step %4d  loss %.4f  lr %.2e  grad-norm %.3f  %6.1f ms  %8.0f tokens/s\n", step, loss, lr,
                    trainer.last_grad_norm(), s * 1e3, double(o.batch) * double(T) / s);
    }
    return 0;
  } catch (const pmt::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    if (pmt::world_size() > 1) {
#if PMT_ENABLE_MPI
      MPI_Abort(MPI_COMM_WORLD, 1);  // end the other ranks instead of leaving them waiting
#endif
    }
    return 1;
  }
}
