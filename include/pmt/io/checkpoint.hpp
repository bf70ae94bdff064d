// SPDX-License-Identifier: Apache-2.0
#pragma once
// Sharded checkpoints of a model's parameters and its optimizer state, crash-safe and
// reshardable: AdamW (moments exp_avg, exp_avg_sq and the step count), Sgd (the momentum
// buffers), or the weights only (save_weights / load_weights: no optimizer). ZeroAdamW (ZeRO-1)
// and Zero2AdamW (ZeRO-2) write and read AdamW's files: their moments are all-gathered over dp for
// the save, and each rank keeps its part on load, so a checkpoint moves between the three
// optimizers and between dp degrees. The manifest names the optimizer ("optimizer adamw|sgd|none"); loading into
// another optimizer is refused, and load_weights takes the parameters of any checkpoint. Named per-parameter states
// beside the optimizer's (ParameterStates: a Trainer's state(), e.g. DiLoCo's outer anchor and momentum, the residual
// of compressed gradients) travel as records of their own kind; a checkpoint without them loads them as zeros (or as
// the parameters, where the state says).
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

#include <Kokkos_Core.hpp>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace pmt::io {

namespace detail {

/// The manifest's extra field holding the measured choices (core/measured_choice.hpp).
inline constexpr const char* choices_field = "measured_choices";

template <class Opt, class Backend>
std::string save(const std::string& dir, const Mesh<Backend>& mesh, const Opt& opt, const CheckpointInfo& info) {
  using T                     = typename Opt::value_type;
  using Exec                  = typename Opt::execution_space;
  const auto& world           = mesh.world();
  const int r                 = world.rank();
  const std::string final_dir = dir + "/" + detail::step_name(info.step);
  const std::string partial   = final_dir + ".partial";
  std::exception_ptr err;
  try {
    detail::require_unique_names(opt.parameters());  // before anything is written
    if (r == 0) {
      detail::create_directories(dir);
      detail::remove_all(partial);
      bool created = false;
      errno        = 0;
      if (!detail::create_directories(partial, &created) || !created)
        detail::io_fail("cannot create " + partial);  // with mkdir's reason
    }
  } catch (...) {  // whatever it is, the other ranks must not wait for this one
    err = std::current_exception();
  }
  comm::agree_on_errors(world, err, "pmt::io::checkpoint", "creating " + partial);
  // this rank's shard
  std::uint64_t meta[2] = {0, 0};  // bytes, crc
  try {
    std::string bytes                    = "PMTSHRD1";
    const auto& ps                       = opt.parameters();
    const std::vector<std::string> kinds = opt.states();
    std::vector<std::size_t> index;
    using Entry = std::pair<std::string, Tensor<T, 1, Exec>>;
    std::vector<std::vector<Entry>> records;  // per parameter: its value, then each state it has
    std::uint32_t count = 0;
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
      records.push_back(std::move(entries));
    }
    detail::put(bytes, count);
    for (std::size_t j = 0; j < index.size(); ++j) {
      const auto& p = *ps[index[j]];
      const auto sh = detail::shape_of(p);
      for (const auto& [prefix, view] : records[j]) {
        const std::string name = prefix + p.name;
        detail::put(bytes, static_cast<std::uint32_t>(name.size()));
        bytes += name;
        detail::put(bytes, static_cast<std::uint32_t>(sizeof(T)));
        for (int d = 0; d < 3; ++d) {
          const auto* a = d == 0 ? sh.g : d == 1 ? sh.o : sh.l;  // global, offset, local
          detail::put(bytes, a[0]);
          detail::put(bytes, a[1]);
        }
        detail::put(bytes, static_cast<std::uint64_t>(view.size() * sizeof(T)));
        auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
        for (std::size_t e = 0; e < host.size(); ++e)  // a checkpoint never holds nan or inf
          if (!std::isfinite(static_cast<double>(host(e))))
            throw IoError("pmt::io::checkpoint",
                          pmt::detail::str("refusing to save step ", info.step, ": ", name, " holds ",
                                           static_cast<double>(host(e)), " at element ", e, " on rank ", r,
                                           "; LATEST keeps naming the last good checkpoint"));
        bytes.append(reinterpret_cast<const char*>(host.data()), host.size() * sizeof(T));
      }
    }
    // test hook "RANK:STEP": that rank aborts halfway through its shard of that step
    const char* hook = std::getenv("PMT_CHECKPOINT_TEST_ABORT");
    const bool crash = hook != nullptr && std::string(hook) == std::to_string(r) + ":" + std::to_string(info.step);
    detail::write_atomically(partial + "/" + detail::shard_name(r), bytes, crash);
    meta[0] = bytes.size();
    meta[1] = detail::crc32(bytes.data(), bytes.size());
  } catch (...) {  // whatever it is, the other ranks must not wait for this one
    err = std::current_exception();
  }
  comm::agree_on_errors(world, err, "pmt::io::checkpoint", "writing a shard");
  Kokkos::View<std::uint64_t*, Kokkos::HostSpace> mine(meta, 2);
  Kokkos::View<std::uint64_t*, Kokkos::HostSpace> all("pmt::io::shards", 2 * static_cast<std::size_t>(world.size()));
  comm::all_gather(world, Kokkos::DefaultHostExecutionSpace(), mine, all);
  try {
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
      for (int q = 0; q < world.size(); ++q) {
        char crc[16];
        std::snprintf(crc, sizeof crc, "%08x", static_cast<unsigned>(all(2 * q + 1)));
        m << "shard " << detail::shard_name(q) << " " << all(2 * q) << " " << crc << "\n";
      }
      const std::string text = m.str();
      detail::write_atomically(partial + "/MANIFEST", text + detail::manifest_checksum_line(text));
      detail::fsync_path(partial, true);
      if (detail::exists(final_dir)) {  // the same step saved again: replace it
        detail::remove_all(final_dir + ".old");
        std::rename(final_dir.c_str(), (final_dir + ".old").c_str());
      }
      errno = 0;
      if (std::rename(partial.c_str(), final_dir.c_str()) != 0)
        detail::io_fail("cannot rename " + partial + " to " + final_dir);
      detail::fsync_path(dir, true);
      detail::write_atomically(dir + "/LATEST", detail::step_name(info.step) + "\n");
      detail::fsync_path(dir, true);
      detail::remove_all(final_dir + ".old");
    }
  } catch (...) {  // whatever it is, the other ranks must not wait for this one
    err = std::current_exception();
  }
  comm::agree_on_errors(world, err, "pmt::io::checkpoint", "writing the manifest");
  return final_dir;
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
  const detail::AdamWState<T, Exec> state(opt);
  return detail::save(dir, mesh, detail::WithStates<const decltype(state)>(state, extra), info);
}

/// \brief Sgd: the parameters and the momentum buffers ("optimizer sgd").
template <class T, class Exec, class Backend>
std::string save_checkpoint(const std::string& dir, const Mesh<Backend>& mesh, const optim::Sgd<T, Exec>& opt,
                            const CheckpointInfo& info, const ParameterStates<T, Exec>& extra = {}) {
  const detail::SgdState<T, Exec> state(opt);
  return detail::save(dir, mesh, detail::WithStates<const decltype(state)>(state, extra), info);
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
  const detail::ZeroAsAdamW<optim::ZeroAdamW<T, Exec, Backend>, T, Exec> state(opt, Exec());
  return detail::save(dir, mesh, detail::WithStates<const decltype(state)>(state, extra), info);
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
  const detail::ZeroAsAdamW<optim::Zero2AdamW<T, Exec, Backend>, T, Exec> state(opt, Exec());
  return detail::save(dir, mesh, detail::WithStates<const decltype(state)>(state, extra), info);
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

}  // namespace pmt::io
