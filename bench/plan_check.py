#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The planner against measurement: `pmt-plan --measure all` calibrates on N ranks, predicts every
candidate, then trains pmt's Gpt with every one of them side by side, interleaved in rounds
(plan/measure.hpp: each round visits every candidate for 1 warm-up and 2 timed steps, so a slow
phase of the machine falls on all of them alike); this is repeated `repeats` times, each with its
own calibration (the prediction is the median over them, the measurement the median of all timed
steps). Peak memory per rank comes from one train_gpt run per configuration (Kokkos allocations,
its report). Ends with the target lines: Spearman rank correlation of predicted vs measured step
time >= 0.8 over all candidates, over the 1F1B / ZeRO-off configurations, and over the
(dp, tp, pp) layouts (each with the configuration the planner predicts fastest for it); predicted
peak memory within 20 % of the measured on every stage of every candidate. Also the measurement's
own repeatability: the Spearman correlation between the medians of the odd and the even rounds.

  python3 bench/plan_check.py BUILD_DIR [NP] [REPEATS] [ROUNDS]
"""
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile

build = sys.argv[1] if len(sys.argv) > 1 else "build"
np_ = int(sys.argv[2]) if len(sys.argv) > 2 else 4
repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 2
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 10
mem_steps = 4
model = ["--layers", "4", "--width", "128", "--heads", "4", "--context", "64", "--batch", "8"]
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_NUM_THREADS="1", OMP_PROC_BIND="false")
env.pop("OMP_PLACES", None)
# More ranks than cores: bind rank r to core r mod cores, as pmt-plan advises and its model assumes
# (unbound, the kernel may leave the ranks of one pipeline stage on one core for the whole run)
placement = (["--map-by", "core", "--bind-to", "core:overload-allowed"] if np_ > (os.cpu_count() or 1)
             else ["--bind-to", "none"])
mpi = ["mpiexec", "-n", str(np_), "--oversubscribe"] + placement
tmp = tempfile.mkdtemp(prefix="pmt-plan-check-")


def spearman(a, b):
    def ranks(x):
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        i = 0
        while i < len(order):  # average ranks of ties
            j = i
            while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2.0
            i = j + 1
        return r
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va > 0 and vb > 0 else 1.0


# 1. predictions and interleaved measurements: one calibration per repeat (a calibration on a noisy
#    machine is a measurement too: the median of each prediction is used)
pred_csv = os.path.join(tmp, "pred.csv")
predictions = {}  # key -> list of (step ms, stage peaks)
steps_ms = {}     # key -> list per repeat of the timed steps (ms), in the order they ran
machine = ""
for rep in range(repeats):
    out = subprocess.run(mpi + [os.path.join(build, "examples", "pmt-plan"), "--csv", pred_csv, "--top", "5",
                                "--measure", "all", "--rounds", str(rounds), "--kokkos-disable-warnings"] + model,
                         env=env, capture_output=True, text=True, check=True).stdout
    machine = next(l for l in out.splitlines() if l.startswith("machine:"))
    with open(pred_csv) as f:
        for r in csv.DictReader(f):
            chunks = int(r.get("chunks") or 1)  # interleaved 1F1B: schedule "1f1b-v2"
            sched = r["schedule"] + (f"-v{chunks}" if chunks > 1 else "")
            key = (int(r["dp"]), int(r["tp"]), int(r["pp"]), int(r["microbatches"]), sched, int(r["zero"]))
            predictions.setdefault(key, []).append((float(r["step_ms"]),
                                                    [float(x) for x in r["stage_peak_mib"].split(";")]))
            steps_ms.setdefault(key, []).append([float(x) for x in r["measured_steps_ms"].split(";")])

# 2. the configurations: every (dp, tp, pp) layout of N ranks with every microbatch count, 1F1B,
#    ZeRO off; then each layout's ZeRO-1, GPipe and interleaved 1F1B (2 chunks) variants at
#    train_gpt's default microbatches
#    (the table shows those; every candidate is ranked in "all candidates")
configs = sorted(k for k in predictions if k[4] == "1f1b" and k[5] == 0)
variants = []
for (dp, tp, pp, m, s, z) in configs:
    if m == (min(2 * pp, 8 // dp) if pp > 1 else 1):
        variants += [k for k in [(dp, tp, pp, m, s, 1), (dp, tp, pp, m, "gpipe", 0), (dp, tp, pp, m, "1f1b-v2", 0)]
                     if k in predictions]
ranked_count = len(configs)
configs += variants


def memory(c):
    """Peak Kokkos allocations per rank (MiB) of a short train_gpt run of configuration c."""
    dp, tp, pp, m, s, z = c
    metrics = os.path.join(tmp, "m.json")
    sched, _, chunks = s.partition("-v")
    args = ["--dp", str(dp), "--tp", str(tp), "--pp", str(pp), "--microbatches", str(m), "--schedule", sched,
            "--chunks", chunks or "1",
            "--steps", str(mem_steps), "--val-every", "0", "--metrics", metrics, "--kokkos-disable-warnings"] + model
    if z:
        args.append("--zero")
    subprocess.run(mpi + [os.path.join(build, "examples", "train_gpt")] + args, env=env, capture_output=True, text=True,
                   check=True)
    rows = [json.loads(l) for l in open(metrics)]
    peak = next(r["peak_memory_bytes"] for r in rows if "peak_memory_bytes" in r)
    return [p / 2**20 for p in peak]


def name(c):
    dp, tp, pp, m, s, z = c
    return f"dp {dp} x tp {tp} x pp {pp}, m {m}" + (f", {s}" if pp > 1 else "") + (", zero" if z else "")


results = [{"config": c, "mem": memory(c)} for c in configs]

print(f"planner vs measurement on {np_} ranks: GPT {' '.join(model)}; {len(predictions)} candidates trained "
      f"side by side, {repeats} x {rounds} interleaved rounds of 1 warm-up + 2 timed steps (median of the timed steps); "
      f"predictions: median of {repeats} calibrations")
print(machine)
print(f"placement: mpiexec {' '.join(placement)}")
print(f"{'configuration':36s} {'pred ms':>8s} {'meas ms':>8s} {'pred rank':>9s} {'meas rank':>9s}  "
      f"{'stage peak MiB: predicted / measured (error)'}")
pred = {k: (statistics.median(t for t, _ in v), v[0][1]) for k, v in predictions.items()}
meas = {k: statistics.median(t for run in v for t in run) for k, v in steps_ms.items()}
pt = [pred[r["config"]][0] for r in results]
mt = [meas[r["config"]] for r in results]
n_rank = ranked_count
prank = {i: k + 1 for k, i in enumerate(sorted(range(n_rank), key=lambda i: pt[i]))}
mrank = {i: k + 1 for k, i in enumerate(sorted(range(n_rank), key=lambda i: mt[i]))}
worst_mem = 0.0
for i, r in enumerate(results):
    dp, tp, pp, m, s, z = r["config"]
    stage_pred = pred[r["config"]][1]
    cells = []
    for st in range(pp):
        ranks = [q for q in range(np_) if q // (tp * dp) == st]
        mem = max(r["mem"][q] for q in ranks)
        err = (stage_pred[st] - mem) / mem
        worst_mem = max(worst_mem, abs(err))
        cells.append(f"{stage_pred[st]:.1f}/{mem:.1f} ({100 * err:+.0f}%)")
    if i == n_rank:
        print("variants at train_gpt's default microbatches (not ranked):")
    pr_, mr_ = (f"{prank[i]:9d}", f"{mrank[i]:9d}") if i < n_rank else (f"{'-':>9s}", f"{'-':>9s}")
    print(f"{name(r['config']):36s} {pt[i]:8.1f} {mt[i]:8.1f} {pr_} {mr_}  {'  '.join(cells)}")

# per (dp, tp, pp): the configuration the planner predicts fastest for it
best_of = {}
for i, r in enumerate(results[:n_rank]):
    k = r["config"][:3]
    if k not in best_of or pt[i] < pt[best_of[k]]:
        best_of[k] = i
layouts = list(best_of.values())
rho_layouts = spearman([pt[i] for i in layouts], [mt[i] for i in layouts])
rho_1f1b = spearman(pt[:n_rank], mt[:n_rank])
keys = sorted(predictions)
rho_all = spearman([pred[k][0] for k in keys], [meas[k] for k in keys])
# the measurement's repeatability: medians of the odd rounds against those of the even rounds
halves = [[statistics.median(t for run in steps_ms[k] for j, t in enumerate(run) if (j // 2) % 2 == h) for k in keys]
          for h in (0, 1)]
rho_halves = spearman(halves[0], halves[1])
fastest = min(keys, key=lambda k: meas[k])
top = min(keys, key=lambda k: pred[k][0])
print(f"the planner's choice: {name(top)}: measured {meas[top]:.1f} ms, {meas[top] / meas[fastest]:.2f}x the fastest "
      f"measured ({name(fastest)}, {meas[fastest]:.1f} ms)")
print(f"all {len(keys)} candidates: Spearman {rho_all:.3f}; the measurement against itself (odd vs even rounds): "
      f"{rho_halves:.3f}")
print(f"target plan_spearman_layouts measured={rho_layouts:.3f} goal=0.8 {'met' if rho_layouts >= 0.8 else 'missed'}")
print(f"target plan_spearman_1f1b measured={rho_1f1b:.3f} goal=0.8 {'met' if rho_1f1b >= 0.8 else 'missed'}")
print(f"target plan_spearman_all measured={rho_all:.3f} goal=0.8 {'met' if rho_all >= 0.8 else 'missed'}")
print(f"target plan_memory_error measured={100 * worst_mem:.1f}% goal=20% {'met' if worst_mem <= 0.2 else 'missed'}")
