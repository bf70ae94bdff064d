// SPDX-License-Identifier: Apache-2.0
#pragma once
// Sharded checkpoints of a model's parameters and its optimizer state, crash-safe and
// reshardable: AdamW (moments exp_avg, exp_avg_sq and the step count), Sgd (the momentum
// buffers), or the weights only (save_weights / load_weights: no optimizer). ZeroAdamW (ZeRO-1)
// and Zero2AdamW (ZeRO-2) write and read AdamW's files: their moments are all-gathered over dp for
// the save, and each rank keeps its part on load; Zero3AdamW (ZeRO-3) writes each rank's row
// slices of the parameters and moments as AdamW records of their own, nothing gathered. So a
// checkpoint moves between the four optimizers and between dp degrees. The manifest names the
// optimizer ("optimizer adamw|sgd|none"); loading into another optimizer is refused, and
// load_weights takes the parameters of any checkpoint. Named per-parameter states beside the
// optimizer's (ParameterStates: a Trainer's state(), e.g. DiLoCo's outer anchor and momentum, the
// residual of compressed gradients) travel as records of their own kind; a checkpoint without
// them loads them as zeros (or as the parameters, where the state says).
//   DIR/step-00000006/shard-00003.bin   one per world rank: that rank's parameter shards and
//                                        their Adam moments (pipeline copies such as the tied
//                                        LM head are not written: the owning stage writes them;
//                                        a copy writes only its own values of per-rank states,
//                                        "grad_residual@copy/NAME", read back on the same layout)
//   DIR/step-00000006/MANIFEST          written by rank 0 last: format, step, layout, model
//                                        description, extra fields (seed, data position, the
//                                        measured choices: restored on load), each
//                                        shard's size and CRC-32, and last its own checksum
//   DIR/LATEST                          the name of the newest complete checkpoint
//   DIR/LOCK                            "pid host" of the one run writing DIR (pmt::run::DirectoryLock,
//   pmt/run/lock.hpp)
// Saving: every rank writes its shard to a temporary file, fsyncs it and renames it, inside
// DIR/step-N.partial; rank 0 then writes MANIFEST the same way, fsyncs the directory, renames
// step-N.partial to step-N, fsyncs DIR, and replaces LATEST (temporary, fsync, rename, fsync).
// A crash at any moment leaves LATEST naming the previous checkpoint, whole; a directory
// without a MANIFEST, or a .partial one, is never loaded. If any rank fails, every rank raises.
// Parameters are matched by name (Parameter::name): two of one name are refused, on save before
// anything is written and on load (pmt::nn::name_parameters gives a model unique names).
// Loading verifies the manifest's checksum and, before reading a shard, its size; then the CRC-32
// of every shard it reads, and every record's sizes (against overflow and the global shape)
// before any of its bytes is used. It refuses a damaged, incomplete or crafted checkpoint with a
// message naming the file, or one of another model shape or precision. A save refuses
// parameters or moments holding nan or inf (LATEST keeps naming the last good checkpoint).
// Managing a directory: verify_checkpoint, checkpoint_steps, resumable_checkpoint (LATEST, or
// the newest step that verifies), prune_checkpoints (--keep N), remove_stale_partials. With
// the same layout each rank reads its own shard; with another dp x tp x pp each rank reads the
// shards and copies, for each of its parameters (matched by global name), the overlap of its
// slice with every saved slice (GlobalSlice), so the loaded model equals the saved one.
// Shard file: "PMTSHRD1", u32 record count, records of (u32 name length, name, u32 element
// size, u64 global[2], offset[2], local[2], u64 bytes, data), little-endian as the machine.

#include "pmt/comm/agree.hpp"
#include "pmt/comm/collectives.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/measured_choice.hpp"
#include "pmt/core/parameter.hpp"
#include "pmt/io/checkpoint_files.hpp"
#include "pmt/io/checkpoint_state.hpp"
#include "pmt/io/file_system.hpp"
#include "pmt/optim/optimizers.hpp"
#include "pmt/optim/zero.hpp"
#include "pmt/optim/zero2.hpp"
#include "pmt/optim/zero3.hpp"

#include <Kokkos_Core.hpp>

#if defined(__SSE2__) && !defined(__CUDACC__)
#define PMT_CHECKPOINT_STREAM_STORES 1
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <initializer_list>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace pmt::io {

namespace detail {

/// The manifest's extra field holding the measured choices (core/measured_choice.hpp).
inline constexpr const char* choices_field = "measured_choices";

/// One save between its stages: snapshot (collective, at the step boundary: the step directory
/// made, this rank's shard serialized into memory, rank 0's manifest text), write_shard (file
/// input/output only: this rank's shard written and synced, its size and CRC-32; a background
/// thread may run it) and finish (collective: the shards' sizes and CRCs gathered, rank 0's
/// manifest, the rename to step-N and LATEST). `bytes` keeps its capacity from save to save.
struct SaveJob {
  std::string dir, final_dir, partial;
  std::int64_t step = 0;
  ShardBuffer bytes;               // this rank's shard
  std::string manifest;            // rank 0: the manifest up to its shard lines
  bool crash            = false;   // the test hook: abort halfway through the shard
  bool slow             = false;   // the test hook: wait 3 s before writing the shard
  std::uint64_t meta[2] = {0, 0};  // the shard's bytes and CRC-32, once written
  /// Before the shard is written: the refusal of its first nan or inf, or an empty string.
  std::function<std::string(const char* shard)> refusal;
};

/// The index of the first of `n` values of T at `p` (not necessarily aligned) that is nan or
/// inf; n when all are finite. float and double: an exponent test over blocks, then the exact
/// index only in a block that holds one.
template <class T>
std::size_t first_nonfinite(const char* p, std::size_t n) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    using U              = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
    constexpr U exponent = sizeof(T) == 4 ? U(0x7f800000u) : U(0x7ff0000000000000ull);
    for (std::size_t b = 0; b < n; b += 4096) {
      const std::size_t e = std::min(n, b + 4096);
      unsigned bad        = 0;
      for (std::size_t i = b; i < e; ++i) {
        U u;
        std::memcpy(&u, p + i * sizeof(T), sizeof(T));
        bad |= (u & exponent) == exponent;
      }
      if (bad != 0)
        for (std::size_t i = b; i < e; ++i) {
          U u;
          std::memcpy(&u, p + i * sizeof(T), sizeof(T));
          if ((u & exponent) == exponent) return i;
        }
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      T v;
      std::memcpy(&v, p + i * sizeof(T), sizeof(T));
      if (!std::isfinite(static_cast<double>(v))) return i;
    }
  }
  return n;
}

/// Copies `bytes` bytes to `dst`, which nothing reads soon: with non-temporal stores where the
/// compiler offers SSE2 (the destination's cache lines are not read first, a third less memory
/// traffic than memcpy), else memcpy.
inline void stream_copy(char* dst, const char* src, std::size_t bytes) {
#if defined(PMT_CHECKPOINT_STREAM_STORES)
  std::size_t k = std::min(bytes, (16 - reinterpret_cast<std::uintptr_t>(dst) % 16) % 16);
  std::memcpy(dst, src, k);  // up to the first 16-byte boundary of dst
  for (; k + 64 <= bytes; k += 64) {
    const __m128i a0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k));
    const __m128i a1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k + 16));
    const __m128i a2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k + 32));
    const __m128i a3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + k), a0);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + k + 16), a1);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + k + 32), a2);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + k + 48), a3);
  }
  std::memcpy(dst + k, src + k, bytes - k);
  _mm_sfence();  // the streamed stores are visible to the thread that writes the file
#else
  std::memcpy(dst, src, bytes);
#endif
}

/// Copies `n` values of T from host memory to `dst` (not necessarily aligned): up to 256 KiB
/// with memcpy, beyond in chunks of 256 KiB streamed (stream_copy) over the host's threads.
template <class T>
void copy_to(char* dst, const T* src, std::size_t n) {
  constexpr std::size_t chunk = std::size_t(256) << 10;  // bytes
  const std::size_t bytes     = n * sizeof(T);
  const auto* from            = reinterpret_cast<const char*>(src);
  if (bytes <= chunk) {
    std::memcpy(dst, from, bytes);
    return;
  }
  Kokkos::parallel_for("pmt::io::checkpoint::snapshot",
                       Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(0, (bytes + chunk - 1) / chunk),
                       [=](std::size_t c) {
                         const std::size_t b = c * chunk;
                         stream_copy(dst + b, from + b, std::min(bytes, b + chunk) - b);
                       });
  Kokkos::DefaultHostExecutionSpace().fence();
}

/// The first stage of a save (collective over the world): rank 0 makes DIR/step-N.partial; each
/// rank serializes its parameters and states into job.bytes (one copy of the state: the part of
/// a save that must happen at the step boundary); rank 0 writes the manifest's text but for the
/// shard lines. Every rank raises alike when any rank fails.
template <class Opt, class Backend>
void snapshot(SaveJob& job, const std::string& dir, const Mesh<Backend>& mesh, const Opt& opt,
              const CheckpointInfo& info) {
  using T           = typename Opt::value_type;
  const auto& world = mesh.world();
  const int r       = world.rank();
  job.dir           = dir;
  job.step          = info.step;
  job.final_dir     = dir + "/" + detail::step_name(info.step);
  job.partial       = job.final_dir + ".partial";
  job.meta[0] = job.meta[1] = 0;
  std::exception_ptr err;
  try {
    detail::require_unique_names(opt.parameters());  // before anything is written
    if (r == 0) {
      detail::create_directories(dir);
      detail::remove_all(job.partial);
      bool created = false;
      errno        = 0;
      if (!detail::create_directories(job.partial, &created) || !created)
        detail::io_fail("cannot create " + job.partial);  // with mkdir's reason
    }
  } catch (...) {  // whatever it is, the other ranks must not wait for this one
    err = std::current_exception();
  }
  comm::agree_on_errors(world, err, "pmt::io::checkpoint", "creating " + job.partial);
  try {
    ShardBuffer& bytes = job.bytes;
    bytes.clear();  // its capacity stays: a second save of the same model allocates nothing
    bytes.append("PMTSHRD1", 8);
    const auto& ps                       = opt.parameters();
    const std::vector<std::string> kinds = opt.states();
    std::vector<std::size_t> index;
    using Entry = std::pair<std::string, Tensor<T, 1, typename Opt::execution_space>>;
    std::vector<std::vector<Entry>> records;  // per parameter: its value, then each state it has
    std::uint32_t count = 0;
    std::size_t total   = 8 + sizeof count;
    for (std::size_t i = 0; i < ps.size(); ++i) {
      // a pipeline copy (the tied LM head on the last stage): the owning stage writes its value
      // and states; the copy writes only its own values of per-rank states
      std::vector<Entry> entries;
      if (!ps[i]->pp_copy) entries.emplace_back("param/", ps[i]->value);
      for (std::size_t k = 0; k < kinds.size(); ++k)
        if (auto st = opt.state(i, k); st.size() > 0 && (!ps[i]->pp_copy || per_rank_state(opt, k)))
          entries.emplace_back(kinds[k] + (ps[i]->pp_copy ? copy_suffix : "") + "/", st);
      if (entries.empty()) continue;
      index.push_back(i);
      count += static_cast<std::uint32_t>(entries.size());
      for (const auto& [prefix, view] : entries)
        total += 4 + prefix.size() + ps[i]->name.size() + 4 + 6 * 8 + 8 + view.size() * sizeof(T);
      records.push_back(std::move(entries));
    }
    bytes.reserve(total);
    detail::put(bytes, count);
    struct Span {
      std::string name;
      std::size_t at, count;  // where its values start in the shard, how many
    };
    std::vector<Span> spans;
    for (std::size_t j = 0; j < index.size(); ++j) {
      const auto& p = *ps[index[j]];
      const auto sh = detail::shape_of(p);
      for (const auto& [prefix, view] : records[j]) {
        const std::string name = prefix + p.name;
        detail::put(bytes, static_cast<std::uint32_t>(name.size()));
        bytes.append(name);
        detail::put(bytes, static_cast<std::uint32_t>(sizeof(T)));
        for (int d = 0; d < 3; ++d) {
          const auto* a = d == 0 ? sh.g : d == 1 ? sh.o : sh.l;  // global, offset, local
          detail::put(bytes, a[0]);
          detail::put(bytes, a[1]);
        }
        detail::put(bytes, static_cast<std::uint64_t>(view.size() * sizeof(T)));
        spans.push_back({name, bytes.size(), view.size()});
        char* at    = bytes.extend(view.size() * sizeof(T));
        using Space = typename std::decay_t<decltype(view)>::memory_space;
        if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, Space>::accessible) {
          copy_to(at, view.data(), view.size());
        } else {
          const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
          copy_to(at, host.data(), host.size());
        }
      }
    }
    // a checkpoint never holds nan or inf: write_shard looks before it writes (off the step's path)
    job.refusal = [spans = std::move(spans), step = info.step, r](const char* shard) -> std::string {
      for (const auto& sp : spans)
        if (const std::size_t e = first_nonfinite<T>(shard + sp.at, sp.count); e < sp.count) {
          T v;
          std::memcpy(&v, shard + sp.at + e * sizeof(T), sizeof(T));
          return pmt::detail::str("refusing to save step ", step, ": ", sp.name, " holds ", static_cast<double>(v),
                                  " at element ", e, " on rank ", r, "; LATEST keeps naming the last good checkpoint");
        }
      return {};
    };
    // test hook "RANK:STEP": that rank aborts halfway through its shard of that step
    const char* hook = std::getenv("PMT_CHECKPOINT_TEST_ABORT");
    job.crash        = hook != nullptr && std::string(hook) == std::to_string(r) + ":" + std::to_string(info.step);
    // test hook "RANK:STEP": that rank's writer waits 3 s before its shard of that step (a save in
    // flight when a signal or a kill comes)
    const char* slow = std::getenv("PMT_CHECKPOINT_TEST_SLOW");
    job.slow         = slow != nullptr && std::string(slow) == std::to_string(r) + ":" + std::to_string(info.step);
    if (r == 0) {
      const auto s = mesh.shape();
      std::ostringstream m;
      m << "pmt-checkpoint 1\nstep " << info.step << "\nlayout " << s.dp << " " << s.tp << " " << s.pp << "\nworld "
        << world.size() << "\nelement " << sizeof(T) << "\noptimizer " << opt.kind() << "\nadam_steps " << opt.steps()
        << "\nmodel " << info.model << "\n";
      for (const auto& [k, v] : info.extra) m << "extra " << k << " " << v << "\n";
      // the paths the run's measured choices took (matmul dispatch): a resumed run takes them too
      if (info.extra.count(choices_field) == 0)
        m << "extra " << choices_field << " " << encode_measured_choices() << "\n";
      job.manifest = m.str();
    }
  } catch (...) {  // whatever it is, the other ranks must not wait for this one
    err = std::current_exception();
  }
  comm::agree_on_errors(world, err, "pmt::io::checkpoint", "writing a shard");
}

/// The second stage: this rank's shard refused if it holds nan or inf, else written atomically
/// (temporary file, fsync, rename) into the step's .partial directory, its size and CRC-32
/// kept. The snapshot's bytes and the file system only: no collective, no Kokkos, so that a
/// background thread may run it.
inline void write_shard(SaveJob& job, int rank) {
  if (job.slow) std::this_thread::sleep_for(std::chrono::seconds(3));
  if (job.refusal)
    if (std::string why = job.refusal(job.bytes.data()); !why.empty()) throw IoError("pmt::io::checkpoint", why);
  job.meta[0] = job.bytes.size();
  job.meta[1] = detail::crc32(job.bytes.data(), job.bytes.size());
  detail::write_atomically(job.partial + "/" + detail::shard_name(rank), job.bytes.data(), job.bytes.size(), job.crash);
}

/// The last stage (collective): every rank learns whether any shard failed (`err`: this rank's
/// write_shard error); rank 0 writes MANIFEST with each shard's size and CRC-32, syncs, renames
/// step-N.partial to step-N and replaces LATEST. Returns the step directory.
template <class Backend>
std::string finish(SaveJob& job, const Mesh<Backend>& mesh, std::exception_ptr err) {
  const auto& world = mesh.world();
  comm::agree_on_errors(world, err, "pmt::io::checkpoint", "writing a shard");
  Kokkos::View<std::uint64_t*, Kokkos::HostSpace> mine(job.meta, 2);
  Kokkos::View<std::uint64_t*, Kokkos::HostSpace> all("pmt::io::shards", 2 * static_cast<std::size_t>(world.size()));
  comm::all_gather(world, Kokkos::DefaultHostExecutionSpace(), mine, all);
  try {
    if (world.rank() == 0) {
      std::string text = job.manifest;
      for (int q = 0; q < world.size(); ++q) {
        char crc[16];
        std::snprintf(crc, sizeof crc, "%08x", static_cast<unsigned>(all(2 * q + 1)));
        text += pmt::detail::str("shard ", detail::shard_name(q), " ", all(2 * q), " ", crc, "\n");
      }
      const std::string& dir = job.dir;
      const std::string& fin = job.final_dir;
      detail::write_atomically(job.partial + "/MANIFEST", text + detail::manifest_checksum_line(text));
      detail::fsync_path(job.partial, true);
      if (detail::exists(fin)) {  // the same step saved again: replace it
        detail::remove_all(fin + ".old");
        std::rename(fin.c_str(), (fin + ".old").c_str());
      }
      errno = 0;
      if (std::rename(job.partial.c_str(), fin.c_str()) != 0)
        detail::io_fail("cannot rename " + job.partial + " to " + fin);
      detail::fsync_path(dir, true);
      detail::write_atomically(dir + "/LATEST", detail::step_name(job.step) + "\n");
      detail::fsync_path(dir, true);
      detail::remove_all(fin + ".old");
    }
  } catch (...) {  // whatever it is, the other ranks must not wait for this one
    err = std::current_exception();
  }
  comm::agree_on_errors(world, err, "pmt::io::checkpoint", "writing the manifest");
  return job.final_dir;
}

/// A blocking save: the three stages one after the other.
template <class Opt, class Backend>
std::string save(const std::string& dir, const Mesh<Backend>& mesh, const Opt& opt, const CheckpointInfo& info) {
  SaveJob job;
  snapshot(job, dir, mesh, opt, info);
  std::exception_ptr err;
  try {
    write_shard(job, mesh.world().rank());
  } catch (...) {  // whatever it is, the other ranks must not wait for this one
    err = std::current_exception();
  }
  return finish(job, mesh, err);
}

template <class Opt, class Backend>
CheckpointInfo load(const std::string& step_dir, const Mesh<Backend>& mesh, Opt& opt,
                    const std::string& expected_model) {
  using T           = typename Opt::value_type;
  const auto& world = mesh.world();
  CheckpointInfo info;
  info.path = step_dir;
  std::exception_ptr err;
  try {
    detail::require_unique_names(opt.parameters());
    const detail::Manifest man = detail::read_manifest(step_dir);
    info.step = man.step, info.layout = man.layout, info.model = man.model, info.extra = man.extra;
    const std::int64_t adam_steps = man.adam_steps;
    const int saved_world         = man.world;
    const std::size_t elem        = man.elem;
    if (info.model != expected_model)
      throw IoError("pmt::io::checkpoint", pmt::detail::str(step_dir, " holds a different model: \"", info.model,
                                                            "\"; this run is \"", expected_model, "\""));
    if (elem != sizeof(T))
      throw IoError("pmt::io::checkpoint", pmt::detail::str(step_dir, " holds ", elem, "-byte values; this run uses ",
                                                            sizeof(T), "-byte values"));
    const std::vector<std::string> kinds = opt.states();
    if (!kinds.empty() && man.optimizer != opt.kind())
      throw IoError(
          "pmt::io::checkpoint",
          man.optimizer == "none"
              ? pmt::detail::str(step_dir, " holds weights only, no optimizer state; this run's optimizer \"",
                                 opt.kind(), "\" needs its state (pmt::io::load_weights loads the weights)")
              : pmt::detail::str(step_dir, " holds the state of optimizer \"", man.optimizer, "\"; this run's is \"",
                                 opt.kind(), "\" (pmt::io::load_weights takes the parameters of any checkpoint)"));
    // Which shards to read: our own with the same layout (then the others only for what it does
    // not hold, e.g. the tied LM head's copy, saved by the first stage), all of them otherwise.
    const auto s    = mesh.shape();
    const bool same = s.dp == info.layout.dp && s.tp == info.layout.tp && s.pp == info.layout.pp;
    const auto& ps  = opt.parameters();
    std::vector<std::size_t> filled(ps.size(), 0);
    // hv: values; hst[k]: optimizer state k, per parameter
    std::vector<std::vector<T>> hv(ps.size());
    std::vector<std::vector<std::vector<T>>> hst(kinds.size(), std::vector<std::vector<T>>(ps.size()));
    std::vector<std::vector<char>> got(ps.size());  // which elements some shard provided (dp replicas repeat them)
    std::vector<std::vector<char>> found(kinds.size(),
                                         std::vector<char>(ps.size(), 0));  // a record of state k for parameter i
    // a pipeline copy's own record of a per-rank state k (in this rank's shard, same layout): the
    // owning stage's record does not replace it
    std::vector<std::vector<char>> own_copy(kinds.size(), std::vector<char>(ps.size(), 0));
    for (std::size_t i = 0; i < ps.size(); ++i) {
      hv[i].resize(ps[i]->size());
      for (auto& st : hst) st[i].resize(ps[i]->size());
      got[i].assign(ps[i]->size(), 0);
    }
    const auto read_shard = [&](int q, const std::vector<bool>& wanted) {
      const std::string path  = step_dir + "/" + man.shards[static_cast<std::size_t>(q)].first;
      const std::string bytes = detail::read_shard_file(step_dir, man, q);
      for (const auto& rec : detail::parse_shard(path, bytes)) {
        const auto slash = rec.name.find('/');
        std::string kind = rec.name.substr(0, slash), pname = rec.name.substr(slash + 1);
        const std::size_t suffix = std::string(copy_suffix).size();
        const bool copy_record   = kind.size() > suffix && kind.compare(kind.size() - suffix, suffix, copy_suffix) == 0;
        if (copy_record) {  // a pipeline copy's own values: only for this rank's copy, on the same layout
          if (!same || q != world.rank()) continue;
          kind.resize(kind.size() - suffix);
        }
        std::size_t state_k = kinds.size();  // which state this record is (kinds.size(): none we load)
        for (std::size_t k = 0; k < kinds.size(); ++k)
          if (kinds[k] == kind) state_k = k;
        if (kind != "param" && state_k == kinds.size()) continue;  // e.g. moments, loading weights only
        for (std::size_t i = 0; i < ps.size(); ++i) {
          if (ps[i]->name != pname || (copy_record ? !ps[i]->pp_copy : !wanted[i])) continue;
          if (kind != "param" && own_copy[state_k][i]) continue;  // the copy's own record was read
          if (copy_record) own_copy[state_k][i] = 1;
          const auto sh = detail::shape_of(*ps[i]);
          if (rec.elem != sizeof(T) || rec.global[0] != sh.g[0] || rec.global[1] != sh.g[1])
            throw IoError("pmt::io::checkpoint",
                          pmt::detail::str(path, ": ", rec.name, " has global shape (", rec.global[0], ", ",
                                           rec.global[1], "); the model's is (", sh.g[0], ", ", sh.g[1], ")"));
          auto& dst = kind == "param" ? hv[i] : hst[state_k][i];
          if (kind != "param") found[state_k][i] = 1;
          // the overlap of the saved slice [o, o + l) with ours, per dimension
          std::uint64_t lo[2], hi[2];
          bool any = true;
          for (int d = 0; d < 2; ++d) {
            lo[d] = std::max(rec.offset[d], sh.o[d]);
            hi[d] = std::min(rec.offset[d] + rec.local[d], sh.o[d] + sh.l[d]);
            any   = any && lo[d] < hi[d];
          }
          if (!any) continue;
          for (std::uint64_t a = lo[0]; a < hi[0]; ++a)  // records are not necessarily aligned: memcpy
            std::memcpy(&dst[(a - sh.o[0]) * sh.l[1] + (lo[1] - sh.o[1])],
                        rec.data + ((a - rec.offset[0]) * rec.local[1] + (lo[1] - rec.offset[1])) * sizeof(T),
                        (hi[1] - lo[1]) * sizeof(T));
          if (kind == "param")
            for (std::uint64_t a = lo[0]; a < hi[0]; ++a)
              for (std::uint64_t b = lo[1]; b < hi[1]; ++b) {
                char& g = got[i][(a - sh.o[0]) * sh.l[1] + (b - sh.o[1])];
                filled[i] += g == 0;
                g = 1;
              }
        }
      }
    };
    const auto missing = [&] {
      std::vector<bool> m(ps.size());
      bool any = false;
      for (std::size_t i = 0; i < ps.size(); ++i) any = (m[i] = filled[i] != ps[i]->size()) || any;
      return std::make_pair(any, m);
    };
    if (same) read_shard(world.rank(), std::vector<bool>(ps.size(), true));
    if (auto [any, wanted] = missing(); any)
      for (int q = 0; q < saved_world; ++q)
        if (!same || q != world.rank()) read_shard(q, wanted);
    for (std::size_t i = 0; i < ps.size(); ++i)
      if (filled[i] != ps[i]->size())
        throw IoError("pmt::io::checkpoint",
                      pmt::detail::str(step_dir, ": parameter ", ps[i]->name, " is covered by ", filled[i], " of its ",
                                       ps[i]->size(), " elements on this rank (a checkpoint of another model?)"));
    using HostView = Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    for (std::size_t i = 0; i < ps.size(); ++i) {
      Kokkos::deep_copy(ps[i]->value, HostView(hv[i].data(), hv[i].size()));
      for (std::size_t k = 0; k < kinds.size(); ++k) {
        const auto st = opt.state(i, k);
        if (st.size() == 0) continue;  // this parameter has no such state
        bool from_value = false;       // a state the checkpoint lacks: zeros, or the loaded value
        if constexpr (detail::has_state_defaults_v<Opt>) from_value = !found[k][i] && opt.defaults_to_value(k);
        const auto& src = from_value ? hv[i] : hst[k][i];
        Kokkos::deep_copy(st, HostView(src.data(), src.size()));
      }
    }
    if (!kinds.empty()) opt.set_steps(adam_steps);
    if constexpr (detail::has_state_defaults_v<Opt>) opt.mark_loaded();
    // the saved run's measured choices, so that this run computes as it did (bit for bit); a
    // choice this process has made already stays (a choice never changes once made)
    for (const char* field : {choices_field, "matmul_paths"})  // the second: older checkpoints
      if (const auto it = info.extra.find(field); it != info.extra.end()) {
        set_measured_choices(decode_measured_choices(it->second));
        break;
      }
  } catch (...) {  // whatever it is, the other ranks must not wait for this one
    err = std::current_exception();
  }
  comm::agree_on_errors(world, err, "pmt::io::checkpoint", "loading " + step_dir);
  return info;
}

/// The checkpoint's view of an optimizer's state with a Trainer's named states appended, handed
/// to `f` (saving). ZeRO-1/2: their moments are all-gathered over dp first (collective).
template <class T, class Exec, class F>
decltype(auto) with_saved_state(const optim::AdamW<T, Exec>& opt, const ParameterStates<T, Exec>& extra, F&& f) {
  const AdamWState<T, Exec> state(opt);
  return f(WithStates<const decltype(state)>(state, extra));
}
template <class T, class Exec, class F>
decltype(auto) with_saved_state(const optim::Sgd<T, Exec>& opt, const ParameterStates<T, Exec>& extra, F&& f) {
  const SgdState<T, Exec> state(opt);
  return f(WithStates<const decltype(state)>(state, extra));
}
template <class T, class Exec, class Backend, class F>
decltype(auto) with_saved_state(const optim::ZeroAdamW<T, Exec, Backend>& opt, const ParameterStates<T, Exec>& extra,
                                F&& f) {
  const ZeroAsAdamW<optim::ZeroAdamW<T, Exec, Backend>, T, Exec> state(opt, Exec());
  return f(WithStates<const decltype(state)>(state, extra));
}
template <class T, class Exec, class Backend, class F>
decltype(auto) with_saved_state(const optim::Zero2AdamW<T, Exec, Backend>& opt, const ParameterStates<T, Exec>& extra,
                                F&& f) {
  const ZeroAsAdamW<optim::Zero2AdamW<T, Exec, Backend>, T, Exec> state(opt, Exec());
  return f(WithStates<const decltype(state)>(state, extra));
}

template <class T, class Exec, class Backend, class F>
decltype(auto) with_saved_state(const optim::Zero3AdamW<T, Exec, Backend>& opt, const ParameterStates<T, Exec>& extra,
                                F&& f) {
  pmt::detail::require<ConfigError>(extra.states.empty(), "pmt::io::checkpoint", [&] {
    return pmt::detail::str("ZeRO-3 saves its shard's parts of each parameter; ", extra.states.size(),
                            " named per-parameter states of the whole parameters cannot go beside them");
  });
  const Zero3State<T, Exec, Backend> state(opt);
  return f(state);
}

}  // namespace detail

/// \brief Saves the parameters of `opt` and its moments as step `info.step` under `dir`
/// (collective over the mesh's world; see the file comment). Returns the step directory.
/// Test hook: PMT_CHECKPOINT_TEST_ABORT=r:s makes world rank r abort() halfway through its shard
/// of step s (a crash during the save).
/// \throws pmt::IoError on every rank when any rank cannot write; pmt::ConfigError, before
/// anything is written, when two parameters share a name (the other ranks: pmt::IoError).
template <class T, class Exec, class Backend>
std::string save_checkpoint(const std::string& dir, const Mesh<Backend>& mesh, const optim::AdamW<T, Exec>& opt,
                            const CheckpointInfo& info, const ParameterStates<T, Exec>& extra = {}) {
  return detail::with_saved_state(opt, extra, [&](const auto& s) { return detail::save(dir, mesh, s, info); });
}

/// \brief Sgd: the parameters and the momentum buffers ("optimizer sgd").
template <class T, class Exec, class Backend>
std::string save_checkpoint(const std::string& dir, const Mesh<Backend>& mesh, const optim::Sgd<T, Exec>& opt,
                            const CheckpointInfo& info, const ParameterStates<T, Exec>& extra = {}) {
  return detail::with_saved_state(opt, extra, [&](const auto& s) { return detail::save(dir, mesh, s, info); });
}

/// \brief The weights only, no optimizer state ("optimizer none"): for inference, evaluation or
/// a fine-tuning run with a fresh optimizer. `params`: a model's parameters() (this stage's).
template <class T, class Exec, class Backend>
std::string save_weights(const std::string& dir, const Mesh<Backend>& mesh,
                         const std::vector<Parameter<T, Exec>*>& params, const CheckpointInfo& info) {
  return detail::save(dir, mesh, detail::WeightsOnly<T, Exec>(params), info);
}

/// \brief ZeroAdamW (ZeRO-1): the same checkpoint as plain AdamW's, so either optimizer and any
/// dp degree can load it. Each dp group first all-gathers its moments (2 P values per rank for
/// the time of the save).
template <class T, class Exec, class Backend>
std::string save_checkpoint(const std::string& dir, const Mesh<Backend>& mesh,
                            const optim::ZeroAdamW<T, Exec, Backend>& opt, const CheckpointInfo& info,
                            const ParameterStates<T, Exec>& extra = {}) {
  return detail::with_saved_state(opt, extra, [&](const auto& s) { return detail::save(dir, mesh, s, info); });
}

/// \brief Loads the checkpoint in `step_dir` (e.g. latest_checkpoint(dir)) into the parameters
/// of `opt` and its moments, on any layout of the same model (see the file comment). Returns
/// what the checkpoint recorded. Collective over the mesh's world.
/// \throws pmt::IoError on every rank for a missing, incomplete or damaged checkpoint (naming the
/// file), one of another model (`expected_model` differs) or another precision; pmt::ConfigError
/// when two parameters share a name.
template <class T, class Exec, class Backend>
CheckpointInfo load_checkpoint(const std::string& step_dir, const Mesh<Backend>& mesh, optim::AdamW<T, Exec>& opt,
                               const std::string& expected_model, const ParameterStates<T, Exec>& extra = {}) {
  detail::AdamWState<T, Exec> state(opt);
  detail::WithStates<decltype(state)> with(state, extra);
  return detail::load(step_dir, mesh, with, expected_model);
}

/// \brief Sgd: the parameters and momentum buffers of an Sgd checkpoint, on any layout.
template <class T, class Exec, class Backend>
CheckpointInfo load_checkpoint(const std::string& step_dir, const Mesh<Backend>& mesh, optim::Sgd<T, Exec>& opt,
                               const std::string& expected_model, const ParameterStates<T, Exec>& extra = {}) {
  detail::SgdState<T, Exec> state(opt);
  detail::WithStates<decltype(state)> with(state, extra);
  return detail::load(step_dir, mesh, with, expected_model);
}

/// \brief The parameters of any checkpoint (AdamW's, Sgd's or save_weights'), on any layout;
/// optimizer state in it is skipped. Collective over the mesh's world.
template <class T, class Exec, class Backend>
CheckpointInfo load_weights(const std::string& step_dir, const Mesh<Backend>& mesh,
                            const std::vector<Parameter<T, Exec>*>& params, const std::string& expected_model) {
  detail::WeightsOnly<T, Exec> state(params);
  return detail::load(step_dir, mesh, state, expected_model);
}

/// \brief ZeroAdamW (ZeRO-1): loads a checkpoint of either optimizer and of any dp degree; each
/// rank keeps its part of the moments.
template <class T, class Exec, class Backend>
CheckpointInfo load_checkpoint(const std::string& step_dir, const Mesh<Backend>& mesh,
                               optim::ZeroAdamW<T, Exec, Backend>& opt, const std::string& expected_model,
                               const ParameterStates<T, Exec>& extra = {}) {
  detail::ZeroAsAdamW<optim::ZeroAdamW<T, Exec, Backend>, T, Exec> state(opt);
  detail::WithStates<decltype(state)> with(state, extra);
  CheckpointInfo info = detail::load(step_dir, mesh, with, expected_model);
  state.store(Exec());
  return info;
}

/// \brief Zero2AdamW (ZeRO-2): the same checkpoint as plain AdamW's (its moments all-gathered
/// bucket by bucket over dp for the save).
template <class T, class Exec, class Backend>
std::string save_checkpoint(const std::string& dir, const Mesh<Backend>& mesh,
                            const optim::Zero2AdamW<T, Exec, Backend>& opt, const CheckpointInfo& info,
                            const ParameterStates<T, Exec>& extra = {}) {
  return detail::with_saved_state(opt, extra, [&](const auto& s) { return detail::save(dir, mesh, s, info); });
}

/// \brief Zero2AdamW (ZeRO-2): loads a checkpoint of AdamW, ZeroAdamW or Zero2AdamW and of any dp
/// degree; each rank keeps its part of the moments.
template <class T, class Exec, class Backend>
CheckpointInfo load_checkpoint(const std::string& step_dir, const Mesh<Backend>& mesh,
                               optim::Zero2AdamW<T, Exec, Backend>& opt, const std::string& expected_model,
                               const ParameterStates<T, Exec>& extra = {}) {
  detail::ZeroAsAdamW<optim::Zero2AdamW<T, Exec, Backend>, T, Exec> state(opt);
  detail::WithStates<decltype(state)> with(state, extra);
  CheckpointInfo info = detail::load(step_dir, mesh, with, expected_model);
  state.store(Exec());
  return info;
}

/// \brief Zero3AdamW (ZeRO-3): each rank writes its parts of the parameters and their moments
/// (row slices of AdamW's records: nothing is gathered), so AdamW, ZeroAdamW, Zero2AdamW and
/// Zero3AdamW on any layout load it. No named per-parameter states (a ZeRO-3 Trainer has none).
template <class T, class Exec, class Backend>
std::string save_checkpoint(const std::string& dir, const Mesh<Backend>& mesh,
                            const optim::Zero3AdamW<T, Exec, Backend>& opt, const CheckpointInfo& info,
                            const ParameterStates<T, Exec>& extra = {}) {
  return detail::with_saved_state(opt, extra, [&](const auto& s) { return detail::save(dir, mesh, s, info); });
}

/// \brief Zero3AdamW (ZeRO-3): loads a checkpoint of AdamW or any ZeRO optimizer, of any layout,
/// into this rank's parts of the parameters and moments.
template <class T, class Exec, class Backend>
CheckpointInfo load_checkpoint(const std::string& step_dir, const Mesh<Backend>& mesh,
                               optim::Zero3AdamW<T, Exec, Backend>& opt, const std::string& expected_model,
                               const ParameterStates<T, Exec>& extra = {}) {
  detail::Zero3State<T, Exec, Backend> state(opt);
  detail::WithStates<decltype(state)> with(state, extra);
  CheckpointInfo info = detail::load(step_dir, mesh, with, expected_model);
  state.store(Exec());
  return info;
}

}  // namespace pmt::io
