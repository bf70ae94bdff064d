#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What pmt's instrumentation costs: the same training step (bench_train_step) built with the
instrumentation compiled out, built normally with the trace recorder off (the default: Kokkos Tools
regions are skipped when no tool is loaded), and with the recorder on. Interleaved rounds, the
median of each, for a small model (where fixed per-call costs weigh most) and the benchmark's
width-256 model. Ends with the target line: recorder off vs compiled out <= 1.02.

  python3 bench/trace_overhead.py BUILD_DIR [ROUNDS]
"""
import os
import re
import statistics
import subprocess
import sys

build = sys.argv[1] if len(sys.argv) > 1 else "build"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
models = {"small (2 layers, width 64, context 32, batch 4)": ["2", "64", "4", "32", "4", "256", "40"],
          "width 256 (4 layers, context 128, batch 8)": ["4", "256", "4", "128", "8", "256", "7"]}
variants = {"compiled out": ("bench_train_step_noinstr", {}), "recorder off": ("bench_train_step", {}),
            "recorder on": ("bench_train_step", {"PMT_BENCH_TRACE": "1"})}


def step_ms(exe, args, extra):
    env = dict(os.environ, **extra)
    out = subprocess.run([os.path.join(build, "bench", exe)] + args, env=env, capture_output=True, text=True,
                         check=True).stdout
    return float(re.search(r"pmt_step ms=([0-9.]+)", out).group(1))


print(f"pmt instrumentation overhead: median of {rounds} interleaved rounds, ms per training step")
print(f"{'model':48s} {'compiled out':>13s} {'recorder off':>13s} {'recorder on':>12s} {'off/out':>8s} {'on/out':>7s}")
worst = 0.0
for name, args in models.items():
    times = {v: [] for v in variants}
    for _ in range(rounds):
        for v, (exe, extra) in variants.items():
            times[v].append(step_ms(exe, args, extra))
    med = {v: statistics.median(t) for v, t in times.items()}
    off, on = med["recorder off"] / med["compiled out"], med["recorder on"] / med["compiled out"]
    worst = max(worst, off)
    print(f"{name:48s} {med['compiled out']:13.3f} {med['recorder off']:13.3f} {med['recorder on']:12.3f} {off:8.3f} {on:7.3f}")
cost = subprocess.run([os.path.join(build, "bench", "bench_train_step"), "instrument"], capture_output=True, text=True,
                      check=True).stdout
region, event = (float(x) for x in re.search(r"region_ns=([0-9.]+) region_and_event_ns=([0-9.]+)", cost).groups())
print(f"one instrumentation point with no Kokkos tool and the recorder off: {region:.1f} ns (region only), "
      f"{event:.1f} ns (region + event)")
print(f"target tracing_off_overhead measured={worst:.3f} goal=1.020 {'met' if worst <= 1.02 else 'missed'}")
