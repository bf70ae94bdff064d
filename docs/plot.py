#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Pictures of a train_gpt run: a timeline PNG from its --trace file (ranks as rows, one colour per
action) and a loss-curve PNG from its --metrics file. Needs matplotlib (Debian: python3-matplotlib).

  python3 docs/plot.py timeline run-trace.json docs/img/timeline_1f1b.png [--steps FIRST LAST]
  (interleaved schedules: bars labelled microbatch.chunk)
  python3 docs/plot.py loss run-metrics.json docs/img/loss.png

Benchmark pictures (docs/benchmarks.md), from the output of the benchmarks:

  python3 docs/plot.py steptime train_step.csv docs/img/bench_step_time.png   (PMT_BENCH_CSV of bench/train_step.py)
  python3 docs/plot.py allreduce allreduce.txt docs/img/bench_allreduce.png   (bench_allreduce's tables, np 2 and 4)
  python3 docs/plot.py bubble pipeline.txt docs/img/bench_bubble.png          (bench_pipeline sleep tables, pp 2 and 4)
"""
import json
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLOURS = {"forward": "#4c72b0", "backward": "#dd8452", "send-activation": "#55a868", "send-gradient": "#55a868",
           "recv-activation": "#c44e52", "recv-gradient": "#c44e52", "all_reduce": "#8172b3",
           "dp gradient bucket": "#8172b3", "adamw": "#937860", "clip": "#937860", "zero-adamw": "#937860"}


# "forward 3", "recv-gradient 2 chunk 1" (interleaved schedules name the model chunk)
ACTION = re.compile(r"^(.*?) (\d+)(?: chunk (\d+))?$")


def timeline(trace_path, png, first=None, last=None):
    events = json.load(open(trace_path))["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    steps = sorted((e for e in spans if e["name"].startswith("step ")), key=lambda e: e["ts"])
    lo, hi = (min(e["ts"] for e in spans), max(e["ts"] + e["dur"] for e in spans))
    if first is not None and steps:
        chosen = [e for e in steps if first <= int(e["name"].split()[1]) <= last]
        lo, hi = min(e["ts"] for e in chosen), max(e["ts"] + e["dur"] for e in chosen)
    ranks = sorted(names)
    fig, ax = plt.subplots(figsize=(12, 0.55 * len(ranks) + 1.4))
    seen = set()
    chunked = False
    for row, pid in enumerate(ranks):
        for e in spans:
            if e["pid"] != pid or e["ts"] + e["dur"] < lo or e["ts"] > hi or e["name"].startswith("step "):
                continue
            m = ACTION.match(e["name"])
            kind, mb, chunk = (m.group(1), m.group(2), m.group(3)) if m else (e["name"], None, None)
            colour = COLOURS.get(kind)
            chunked = chunked or chunk is not None
            if colour is None or e["tid"] not in (0, 1, 3):
                continue
            height = 0.8 if e["tid"] == 0 else 0.3
            label = kind if kind not in seen else None
            seen.add(kind)
            ax.broken_barh([((e["ts"] - lo) / 1e3, max(e["dur"], 1) / 1e3)], (row - height / 2, height), color=colour,
                           label=label, alpha=0.55 if chunk and int(chunk) % 2 else 1.0)
            if e["tid"] == 0 and e["dur"] / (hi - lo) > 0.02:
                ax.text((e["ts"] - lo + e["dur"] / 2) / 1e3, row, mb if chunk is None else f"{mb}.{chunk}", ha="center",
                        va="center", fontsize=7, color="white" if not chunk or int(chunk) % 2 == 0 else "black")
    ax.set_xlim(0, (hi - lo) / 1e3)
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([names[p] for p in ranks], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=5, fontsize=8, frameon=False)
    ax.set_title("pmt train_gpt timeline (tall bars: forward / backward with their microbatch"
                 + ("; m.c: microbatch m of model chunk c, odd chunks lighter" if chunked else "")
                 + "; thin: p2p and optimizer)", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def finish(fig, ax, png, xlabel, ylabel, grid="major", legend_size=None):
    """The benchmark and loss pictures' common end: labels, grid, legend, written as a PNG."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which=grid)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def loss(metrics_path, png):
    rows = [json.loads(line) for line in open(metrics_path)]
    train = [r for r in rows if "loss" in r]
    val = [r for r in rows if "val_loss" in r]  # not the end-of-run report line (peak memory, ...)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot([r["step"] for r in train], [r["loss"] for r in train], lw=0.8, label="training loss")
    ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", label="validation loss")
    finish(fig, ax, png, "step", "cross-entropy (nats per byte)")


def steptime(csv_path, png):
    """Step time against model width: pmt, PyTorch, and the step's matmuls alone (the floor)."""
    rows = [line.strip().split(",") for line in open(csv_path)][1:]
    width = [int(r[0]) for r in rows]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.plot(width, [float(r[1]) for r in rows], "o-", label="pmt step")
    if all(r[2] for r in rows):
        ax.plot(width, [float(r[2]) for r in rows], "s-", label="PyTorch step")
    ax.plot(width, [float(r[4]) for r in rows], "^--", label="the step's matmuls alone (floor)")
    ax.set_xticks(width)
    ax.set_yscale("log")
    finish(fig, ax, png, "model width (4 blocks, context 128, batch 8)", "ms per training step", grid="both")


def tables(log_path, header, row, key):
    """Rows of the tables in a benchmark's output: each line matching `row` (its groups, through
    `key`) under the last line matching `header` (its first group, an int)."""
    out, current = {}, None
    for line in open(log_path):
        m = re.search(header, line)
        if m:
            current = int(m.group(1))
        m = re.match(row, line)
        if m and current is not None:
            k, value = key(current, m)
            out.setdefault(k, []).append(value)
    return out


def allreduce(log_path, png):
    """Bus bandwidth against message size, pmt's all_reduce and raw MPI_Allreduce, per rank count."""
    by_ranks = tables(log_path, r"^pmt bench_allreduce: (\d+) ranks",
                      r"^\s*(\d+)\s+\d+ \|\s+[\d.]+\s+[\d.]+\s+([\d.]+) \|\s+[\d.]+\s+[\d.]+\s+([\d.]+) \|",
                      lambda n, m: (n, tuple(float(x) for x in m.groups())))
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for n, rows in sorted(by_ranks.items()):
        size = [r[0] for r in rows]
        line, = ax.plot(size, [r[1] for r in rows], "o-", label=f"pmt, {n} ranks")
        ax.plot(size, [r[2] for r in rows], "x--", color=line.get_color(), label=f"MPI_Allreduce, {n} ranks")
    ax.set_xscale("log", base=2)
    finish(fig, ax, png, "message size (bytes)", "bus bandwidth (GB/s)")


def bubble(log_path, png):
    """Pipeline bubble against microbatches per schedule and stage count, with (p-1)/(m+p-1)."""
    series = tables(log_path, r"pp = (\d+) stages", r"^(\S+)\s+(\d+)\s+([\d.]+)%\s+([\d.]+)%",
                    lambda p, m: ((p, m.group(1)), (int(m.group(2)), float(m.group(3)), float(m.group(4)))))
    fig, ax = plt.subplots(figsize=(7, 3.8))
    theory_drawn = set()
    for (stages, sched), rows in sorted(series.items()):
        rows.sort()
        line, = ax.plot([r[0] for r in rows], [r[1] for r in rows], "o-", label=f"{sched}, pp {stages}")
        key = (stages, sched.endswith("v2"))
        if key not in theory_drawn:
            theory_drawn.add(key)
            ax.plot([r[0] for r in rows], [r[2] for r in rows], ":", color="grey")
    ax.plot([], [], ":", color="grey", label="theory (p-1)/(m+p-1), (p-1)/(2m+p-1) interleaved")
    ax.set_xscale("log", base=2)
    finish(fig, ax, png, "microbatches m", "bubble (% of the step)", legend_size=8)


if __name__ == "__main__":
    modes = {"loss": loss, "steptime": steptime, "allreduce": allreduce, "bubble": bubble}
    if len(sys.argv) < 4 or sys.argv[1] not in ("timeline",) + tuple(modes):
        sys.exit(__doc__)
    if sys.argv[1] == "timeline":
        rng = (int(sys.argv[5]), int(sys.argv[6])) if len(sys.argv) > 6 and sys.argv[4] == "--steps" else (None, None)
        timeline(sys.argv[2], sys.argv[3], *rng)
    else:
        modes[sys.argv[1]](sys.argv[2], sys.argv[3])
