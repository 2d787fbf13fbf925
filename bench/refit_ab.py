#!/usr/bin/env python3
"""datapar bench ddp and bench fsdp of two builds, taking turns: a refactoring's cost.

  bench/refit_ab.py BEFORE_BIN AFTER_BIN [ROUNDS] [MODELS]
  bench/refit_ab.py /work/before/build/bin build/bin 3 "mlp lenet"

Each round runs, for each model, `datapar bench ddp --model M --zero` (plain DDP's step and
ZeRO-1's) and `datapar bench fsdp --model M` (FSDP's step) of one build, then of the other,
the order swapped every round, so that a drift of a shared machine hits both. Prints each
figure's median and best per build, and after/before of each: LeNet's step on a 2-core
machine is bimodal from run to run (the same binary: about 6.5 or 10-12 ms), so its median
depends on which mode the rounds hit, and the best shows the code.
"""
import re
import statistics
import subprocess
import sys

FIGURES = {
    "ddp": ("ddp", re.compile(r"^ddp step: ([0-9.]+) ms", re.M)),
    "zero": ("ddp", re.compile(r"^zero \(ZeroRedundancyOptimizer, [^)]*\): step ([0-9.]+) ms", re.M)),
    "fsdp": ("fsdp", re.compile(r"^step \(median, slowest rank\): ddp [0-9.]+ ms, fsdp ([0-9.]+) ms", re.M)),
    # ZeRO's own part of a step, apart from forward and backward: what its refit touched.
    "zero update": ("ddp", re.compile(r"optimizer step \(shard update and broadcasts\) ([0-9.]+) /", re.M)),
}


def run(bin_dir, command, model):
    args = [f"{bin_dir}/datapar", "bench", command, "--model", model]
    if command == "ddp":
        args.append("--zero")
    out = subprocess.run(args, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        sys.exit(f"{' '.join(args)} exited {out.returncode}:\n{out.stdout}{out.stderr}")
    return out.stdout


def main():
    before, after = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    models = (sys.argv[4] if len(sys.argv) > 4 else "mlp lenet").split()
    times = {}  # (side, model, figure) -> [ms]
    for r in range(rounds):
        sides = [("before", before), ("after", after)]
        if r % 2:
            sides.reverse()
        for side, bin_dir in sides:
            for model in models:
                outputs = {c: run(bin_dir, c, model) for c in ("ddp", "fsdp")}
                for figure, (command, pattern) in FIGURES.items():
                    m = pattern.search(outputs[command])
                    if not m:
                        sys.exit(f"no {figure} figure in bench {command} of {bin_dir}:\n{outputs[command]}")
                    times.setdefault((side, model, figure), []).append(float(m.group(1)))
                print(f"round {r + 1}/{rounds} {side} {model}: " +
                      ", ".join(f"{f} {times[(side, model, f)][-1]:.3f} ms" for f in FIGURES), flush=True)
    print("\n| model | figure | median before / after (ms) | after / before | best before / after (ms) "
          "| after / before | rounds (before; after) |")
    print("|---|---|---|---|---|---|---|")
    for model in models:
        for figure in FIGURES:
            b, a = times[("before", model, figure)], times[("after", model, figure)]
            mb, ma = statistics.median(b), statistics.median(a)
            bb, ba = min(b), min(a)
            print(f"| {model} | {figure} | {mb:.3f} / {ma:.3f} | {ma / mb:.3f} | {bb:.3f} / {ba:.3f} | {ba / bb:.3f} | "
                  f"{' '.join(f'{x:.2f}' for x in b)}; {' '.join(f'{x:.2f}' for x in a)} |")


if __name__ == "__main__":
    main()
