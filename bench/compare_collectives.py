"""All-reduce side by side in one run: datapar on gloo and on mpi, PyTorch on gloo, plain
MPI (blocking, and MPI_I* polled with MPI_Test) and memcpy, each timed the same way
(rank 0's median per size; see tools/datapar/bench_collectives.cc). The variants take
turns, round after round, and the table shows each one's median over the rounds, so
that a noisy minute hurts all of them alike.

    python3 bench/compare_collectives.py --rounds 5 --nproc 2

Needs build/bin/datapar and build/bin/collectives_reference (an MPI build), mpirun, and
/usr/bin/python3 with torch (bench/torch_collectives.py).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROW = re.compile(r"^\| ([0-9.]+ [KMG]?i?B) \| ([0-9.]+) \|")
GOALS = "goals: >= 3x PyTorch-gloo's bus bandwidth at 1-16 MiB, >= 10x lower latency at 4 KiB"


def variants(args):
    bin_dir = os.path.join(ROOT, "build", "bin")
    common = ["--sizes", args.sizes, "--iters", str(args.iters), "--warmup", str(args.warmup)]
    mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(args.nproc)]
    reference = os.path.join(bin_dir, "collectives_reference")
    return [
        ("datapar gloo", [os.path.join(bin_dir, "datapar"), "bench", "collectives", "--nproc", str(args.nproc)] + common),
        ("datapar mpi", [os.path.join(bin_dir, "datapar"), "bench", "collectives", "--backend", "mpi",
                         "--nproc", str(args.nproc)] + common),
        ("PyTorch gloo", ["/usr/bin/python3", os.path.join(ROOT, "bench", "torch_collectives.py"),
                          "--nproc", str(args.nproc)] + common),
        ("plain MPI", mpirun + [reference] + common),
        ("MPI_Iallreduce + MPI_Test", mpirun + [reference, "--nonblocking"] + common),
    ]


def parse(output):
    """Rows of the first table -> {size: us}; rows of the memcpy table -> {size: us}."""
    tables = [{}]
    for line in output.splitlines():
        if line.startswith("memcpy"):
            tables.append({})
        match = ROW.match(line)
        if match:
            tables[-1][match.group(1)] = float(match.group(2))
    return tables


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--sizes", default="4KiB,64KiB,1MiB,4MiB,16MiB,64MiB")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    times = {}  # variant -> size -> [us per round]
    sizes = []
    for r in range(args.rounds):
        order = variants(args)
        order = order[r % len(order):] + order[:r % len(order)]  # each variant leads a round in turn
        for name, command in order:
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"{name} failed ({done.returncode}): {' '.join(command)}\n{done.stdout}\n{done.stderr}")
            tables = parse(done.stdout)
            for label, table in [(name, tables[0])] + ([("memcpy", tables[1])] if len(tables) > 1 and
                                                      name == "plain MPI" else []):
                for size, us in table.items():
                    times.setdefault(label, {}).setdefault(size, []).append(us)
                    if size not in sizes:
                        sizes.append(size)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    n = args.nproc
    labels = ["datapar gloo", "datapar mpi", "PyTorch gloo", "plain MPI", "MPI_Iallreduce + MPI_Test", "memcpy"]
    med = {l: {s: statistics.median(v) for s, v in times[l].items()} for l in labels if l in times}
    nbytes = {s: float(s.split()[0]) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[s.split()[1]]
              for s in sizes}
    busbw = lambda s, us: nbytes[s] / (us * 1e-6) / 1e9 * 2 * (n - 1) / n  # all_reduce, as nccl-tests
    print(f"all_reduce of float32, {n} processes, {args.rounds} rounds x {args.iters} iterations: "
          "median over rounds of rank 0's median per op")
    print("\ntime per all_reduce (us):\n")
    print("| size | " + " | ".join(l for l in labels if l in med) + " |")
    print("|---" * (1 + len(med)) + "|")
    for s in sizes:
        print(f"| {s} | " + " | ".join(f"{med[l][s]:.1f}" for l in labels if l in med) + " |")
    print("\nbus bandwidth (GB/s; memcpy: bytes copied per second):\n")
    print("| size | " + " | ".join(l for l in labels if l in med) + " | datapar mpi / PyTorch gloo |")
    print("|---" * (2 + len(med)) + "|")
    for s in sizes:
        cells = [f"{busbw(s, med[l][s]):.3f}" if l != "memcpy" else f"{nbytes[s] / med[l][s] / 1e3:.3f}"
                 for l in labels if l in med]
        ratio = med["PyTorch gloo"][s] / med["datapar mpi"][s]
        print(f"| {s} | " + " | ".join(cells) + f" | {ratio:.1f}x |")
    print(f"\n{GOALS}:")
    for s in [x for x in sizes if x in ("1 MiB", "4 MiB", "16 MiB")]:
        ratio = med["PyTorch gloo"][s] / med["datapar mpi"][s]
        print(f"  bus bandwidth at {s}: {ratio:.1f}x ({'met' if ratio >= 3 else 'NOT met'})")
    if "4 KiB" in sizes:
        ratio = med["PyTorch gloo"]["4 KiB"] / med["datapar mpi"]["4 KiB"]
        print(f"  latency at 4 KiB: {ratio:.1f}x lower ({'met' if ratio >= 10 else 'NOT met'})")
    print("\nper round, datapar mpi / PyTorch gloo (both medians of that round):")
    for s in sizes:
        pairs = zip(times["PyTorch gloo"][s], times["datapar mpi"][s])
        print(f"  {s}: " + " ".join(f"{t / d:.1f}x" for t, d in pairs))
    print("\nper-round medians (us), to judge the noise:")
    for l in labels:
        if l in times:
            print(f"  {l}: " + "; ".join(f"{s} " + " ".join(f"{v:.0f}" for v in times[l][s]) for s in sizes))


if __name__ == "__main__":
    main()
