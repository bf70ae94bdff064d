#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Training-step benchmark driver: pmt's Gpt against the same model in PyTorch, same
threads, in one run; and data-parallel weak scaling at 2 ranks. Prints a table and the target
lines. Usage: train_step.py BUILD_DIR [TORCH_PYTHON]
PMT_TRAIN_STEP_WIDTHS=128,512 adds widths; PMT_BENCH_CSV=FILE writes one row per width. Each round also
runs pmt's step with bf16 products (PMT_BENCH_PRECISION=bf16) for the bf16 speedup target.

With PMT_MKL_BUILD=DIR (a build of pmt against MKL's CBLAS: cmake ... $(bench/fetch_mkl.sh --cmake))
each round also runs that build's step: pmt and PyTorch then compute their products with the same
BLAS (PyTorch's CPU build uses MKL), so the ratio measures the frameworks and not the BLAS."""
import os
import re
import subprocess
import sys

build, torch_py = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "")
here = os.path.dirname(os.path.abspath(__file__))
exe = os.path.join(build, "bench", "bench_train_step")
mkl_build = os.environ.get("PMT_MKL_BUILD", "")
mkl_exe = os.path.join(mkl_build, "bench", "bench_train_step") if mkl_build else ""
threads = os.cpu_count() or 1
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_PROC_BIND="false")


def run(cmd, extra_env):
    out = subprocess.run(cmd, env=dict(env, **extra_env), capture_output=True, text=True, check=True).stdout
    return out


def steal_s():
    """CPU seconds the hypervisor gave to other guests so far (all vCPUs; /proc/stat), 0 if unknown."""
    try:
        with open("/proc/stat") as f:
            return int(f.readline().split()[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def cpu_name():
    """The CPU's model name (/proc/cpuinfo), '?' where unknown."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def median(xs):
    """The middle element (the upper one of an even count), as the rounds' medians below."""
    return sorted(xs)[len(xs) // 2]


def fields(line_tag, text):
    m = re.search(line_tag + r" (.*)", text)
    return dict(kv.split("=") for kv in m.group(1).split())



STEPS = 7
peak_at_start = max(float(fields("peak", run([exe, "peak"], {"OMP_NUM_THREADS": str(threads)}))["gflops"]) for _ in range(3))
# 4 blocks, 64-wide heads, context 128, batch 8, vocabulary 256; widths 256 and 768 carry the targets,
# PMT_TRAIN_STEP_WIDTHS adds others (e.g. 128,256,512,768 for the plot of docs/benchmarks.md)
widths = sorted({256, 768} | {int(w) for w in os.environ.get("PMT_TRAIN_STEP_WIDTHS", "").split(",") if w.strip()})
configs = [(f"width {w}", 4, w, max(1, w // 64), 128, 8, 256) for w in widths]
print(f"pmt bench train_step: fp32, one rank, {threads} threads (PyTorch: the same threads)")
print(f"{'model':<10} {'pmt ms':>9} {'tok/s':>9} {'GFLOP/s':>9} {'torch ms':>9} {'pmt/torch':>10}")
results, products, bf16_results = {}, {}, {}
# pmt and PyTorch alternate, ROUNDS times; each time is the median of the rounds' medians, and each
# ratio the median of the rounds' ratios: a round's runs are adjacent in time, so a slow phase of
# the machine (seconds long on this VM) weighs on both sides of its ratio
ROUNDS = int(os.environ.get("PMT_TRAIN_STEP_ROUNDS", "5"))
for name, L, C, H, T, B, V in configs:
    args = [str(a) for a in (L, C, H, T, B, V, STEPS)]
    pmt_ms, torch_ms, mkl_ms, prod_ms, mkl_prod_ms, bf16_ms = [], [], [], [], [], []
    for _ in range(ROUNDS):
        p = fields("pmt_step", run([exe] + args, {"OMP_NUM_THREADS": str(threads)}))
        pmt_ms.append(float(p["ms"]))
        # the same step with bf16 products (fp32 masters): TrainerOptions::precision
        b = fields("pmt_step", run([exe] + args, {"OMP_NUM_THREADS": str(threads), "PMT_BENCH_PRECISION": "bf16"}))
        bf16_ms.append(float(b["ms"]))
        bf16_isa = b.get("precision", "?")
        if mkl_exe:
            m = fields("pmt_step", run([mkl_exe] + args, {"OMP_NUM_THREADS": str(threads)}))
            mkl_ms.append(float(m["ms"]))
        # the step's matmuls alone (bench_train_step products): what each BLAS needs for them
        for binary, times in ((exe, prod_ms), (mkl_exe, mkl_prod_ms)):
            if binary:
                times.append(float(fields("pmt_products", run([binary, "products"] + args,
                                                              {"OMP_NUM_THREADS": str(threads)}))["ms"]))
        if torch_py:
            t = fields("torch_step", run([torch_py, os.path.join(here, "torch_gpt.py")] + args + [str(threads)], {}))
            torch_ms.append(float(t["ms"]))
            torch_version = t["version"]
    ms, flops = sorted(pmt_ms)[ROUNDS // 2], float(p["flops_per_step"])
    round_ratio = sorted(a / b for a, b in zip(pmt_ms, torch_ms))[ROUNDS // 2] if torch_py else None
    p["tokens_per_s"] = str(B * T / (ms / 1e3))
    t_ms = sorted(torch_ms)[ROUNDS // 2] if torch_py else None
    results[name] = (ms, flops, t_ms, round_ratio)
    bf16_results[name] = (median(bf16_ms), median([a / b for a, b in zip(pmt_ms, bf16_ms)]), bf16_isa)
    # per BLAS: (matmuls alone, their ratio to torch's step, pmt's step minus them), each paired by round
    for label, step_ms, alone_ms in ((name, pmt_ms, prod_ms), (name + ", MKL", mkl_ms, mkl_prod_ms)):
        if alone_ms:
            products[label] = (median(alone_ms), median([a / b for a, b in zip(alone_ms, torch_ms)]) if torch_py else None,
                               median([a - b for a, b in zip(step_ms, alone_ms)]),
                               median([a / b for a, b in zip(step_ms, alone_ms)]))
    if mkl_exe:
        mkl_ratio = sorted(a / b for a, b in zip(mkl_ms, torch_ms))[ROUNDS // 2] if torch_py else None
        results[name + " mkl"] = (sorted(mkl_ms)[ROUNDS // 2], flops, t_ms, mkl_ratio)
    ratio = f"{round_ratio:10.2f}" if t_ms else "       n/a"
    print(f"{name:<10} {ms:9.1f} {float(p['tokens_per_s']):9.0f} {flops / ms / 1e6:9.1f} "
          f"{(f'{t_ms:9.1f}' if t_ms else '      n/a')} {ratio}"
          f"   pmt matmul: {p.get('matmul', '?')} (OpenBLAS core {p.get('blas_core', '?')})")
for name, L, C, H, T, B, V in configs:
    if name + " mkl" in results:
        ms, flops, t_ms, r = results[name + " mkl"]
        print(f"{name + ', MKL':<10} {ms:9.1f} {B * T / (ms / 1e3):9.0f} {flops / ms / 1e6:9.1f} "
              f"{(f'{t_ms:9.1f}' if t_ms else '      n/a')} {(f'{r:10.2f}' if r else '       n/a')}   (pmt built against MKL's CBLAS)")
# The floor: the step's Linear and LM-head matmuls alone, with the BLAS pmt was built against
# (bench_train_step products; 6 P tokens of the step's FLOPs). No framework on that BLAS takes less
# than this for the step; "the rest" is pmt's step minus it, paired by round (attention, GELU,
# LayerNorm, bias, loss, clipping, AdamW: everything that is not one of those matmuls).
for name, (pr_ms, pr_ratio, rest_ms, _) in products.items():
    t_ms = results[name.split(",")[0]][2]
    budget = "" if not t_ms else (f"; the 0.7 x torch goal leaves {0.7 * t_ms - pr_ms:.1f} ms for the rest"
                                  if name.startswith("width 256") else "")
    print(f"{name:<10} the step's matmuls alone: {pr_ms:.1f} ms"
          f"{f' = {pr_ratio:.2f} x torch' if pr_ratio else ''}, the rest of pmt's step {rest_ms:.1f} ms{budget}")
for name, (b_ms, speedup, isa) in bf16_results.items():
    print(f"{name:<10} bf16 products: {b_ms:.1f} ms, {speedup:.2f} x faster than fp32 (products on {isa}; "
          f"fp32 masters, the other ops fp32)")
if torch_py:
    print(f"(PyTorch {torch_version}; each time: median over {ROUNDS} alternating runs of the median of {STEPS} steps; "
          f"pmt/torch: median of the {ROUNDS} rounds' ratios)")

# Data-parallel weak scaling: each rank its own batch, one thread per rank, ranks bound to cores.
# bench_train_step's paired mode times, in each of DP_ROUNDS rounds, one step of rank 0 alone (the
# other rank asleep) and one step of both ranks, a fraction of a second apart; the efficiency is
# the median of the rounds' ratios (separate 1-rank and 2-rank runs seconds apart would read
# the VM's slow phases as much as pmt).
DP_ROUNDS = int(os.environ.get("PMT_DP_ROUNDS", "15"))
s0 = steal_s()
dp = fields("pmt_dp_paired", run(["mpiexec", "-n", "2", "--bind-to", "core", exe, "4", "256", "4", "128", "8", "256",
                                  str(DP_ROUNDS)], {"OMP_NUM_THREADS": "1", "PMT_BENCH_DP_PAIRED": "1"}))
one, two, eff = float(dp["one_ms"]), float(dp["dp_ms"]), float(dp["efficiency"])
print(f"DP weak scaling (width 256, batch 8 per rank, 1 thread per rank): 1 rank {one:.1f} ms/step, "
      f"2 ranks {two:.1f} ms/step -> efficiency {eff:.2f} (median of {DP_ROUNDS} paired rounds)")
print(f"  per round: {dp['per_round'].replace(',', ' ')}; vCPU time stolen by the hypervisor meanwhile: "
      f"{steal_s() - s0:.2f} s")
print(f"  both ranks each alone at the same time, without communicating: {float(dp['concurrent_ms']):.1f} ms/step, "
      f"efficiency {float(dp['concurrent_efficiency']):.2f} (the shared machine's part of the loss; the rest is "
      f"the gradient all-reduce and the waits at the step's collectives)")

# The peak is the best of runs at the start and at the end: one slow phase of the VM (a thread
# descheduled) must not lower the denominator of the MFU.
peak_gflops = max([peak_at_start] + [float(fields("peak", run([exe, "peak"], {"OMP_NUM_THREADS": str(threads)}))["gflops"])
                                     for _ in range(3)])
peak_isa = fields("peak", run([exe, "peak"], {"OMP_NUM_THREADS": "1"})).get("isa", "?")
print(f"measured fp32 peak: {peak_gflops:.1f} GFLOP/s ({threads} threads, {peak_isa} FMA chains)")
ms768, flops768, t768, r768 = results["width 768"]
if peak_gflops > 0:
    print(f"MFU at width 768: {flops768 / ms768 / 1e6 / peak_gflops * 100:.1f} % of {peak_gflops:.0f} GFLOP/s")
if torch_py:
    r256 = results["width 256"][3]
    print(f"target train_step_width256_vs_torch measured={r256:.3f} goal=0.700 {'met' if r256 <= 0.7 else 'missed'}")
    print(f"target train_step_width768_vs_torch measured={r768:.3f} goal=1.000 {'met' if r768 <= 1.0 else 'missed'}")
    if "width 256 mkl" in results:  # the same BLAS on both sides (PyTorch's is MKL)
        for name, goal in (("width 256", 0.7), ("width 768", 1.0)):
            r = results[name + " mkl"][3]
            print(f"target train_step_{name.replace(' ', '')}_vs_torch_same_blas measured={r:.3f} goal={goal:.3f} "
                  f"{'met' if r <= goal else 'missed'}")
if peak_gflops > 0:
    mfu = flops768 / ms768 / 1e6 / peak_gflops
    print(f"target train_step_width768_fraction_of_peak measured={mfu:.3f} goal=0.550 {'met' if mfu >= 0.55 else 'missed'}")
# bf16 products against pmt's own fp32 step, paired by round; the line names what ran them
b_ms, speedup, isa = bf16_results["width 768"]
print(f"target train_step_width768_bf16_speedup measured={speedup:.3f} goal=1.500 {'met' if speedup >= 1.5 else 'missed'} "
      f"(products: {isa}; CPU {cpu_name()})")
# the step against its own floor (pmt's default BLAS path, paired by round): what pmt adds to the products
floor = products["width 256"][3]
print(f"target train_step_width256_vs_matmul_floor measured={floor:.3f} goal=1.150 {'met' if floor <= 1.15 else 'missed'}")
csv = os.environ.get("PMT_BENCH_CSV", "")
if csv:  # one row per width, for bench/plots.py
    with open(csv, "w") as f:
        f.write("width,pmt_ms,torch_ms,pmt_over_torch,matmuls_alone_ms,peak_gflops\n")
        for (name, L, C, H, T, B, V) in configs:
            ms, _, t_ms, r = results[name]
            f.write(f"{C},{ms:.2f},{t_ms or ''},{r or ''},{products[name][0]:.2f},{peak_gflops:.1f}\n")
print(f"target dp2_weak_scaling_efficiency measured={eff:.3f} goal=0.900 {'met' if eff >= 0.9 else 'missed'}")
