"""Collectives side by side in one run: datapar's default single-node path (`datapar launch`
with no flags: forked workers, Gloo with shared memory between them), the "mpirun path": the
ranks started by the user's own `mpirun --bind-to none` on backend mpi (as `datapar launch
--runner mpirun` started them until issue 14 removed it), datapar on gloo over TCP only
($DATAPAR_SHM=0) and on mpi, PyTorch on gloo, plain MPI (blocking, and MPI_I* polled with
MPI_Test; all_reduce only) and memcpy, each timed the same way
(rank 0's median per size; see tools/datapar/bench_collectives.cc). The variants take
turns, round after round, and the table shows each one's median over the rounds, so
that a noisy minute hurts all of them alike.

    python3 bench/compare_collectives.py --rounds 5 --nproc 2 [--op broadcast|all_gather]

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
ROW = re.compile(r"^(?:\[rank 0\] )?\| ([0-9.]+ [KMG]?i?B) \| ([0-9.]+) \|")
DEFAULT = "datapar launch (default)"
MPIRUN = "mpirun, backend mpi"


def variants(args):
    bin_dir = os.path.join(ROOT, "build", "bin")
    common = ["--sizes", args.sizes, "--iters", str(args.iters), "--warmup", str(args.warmup)]
    ours = common + ["--op", args.op]
    mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(args.nproc)]
    reference = os.path.join(bin_dir, "collectives_reference")
    datapar = os.path.join(bin_dir, "datapar")
    tcp_only = dict(os.environ, DATAPAR_SHM="0")
    launch = [datapar, "launch", "--nproc-per-node", str(args.nproc)]
    found = [
        (DEFAULT, launch + ["--", datapar, "bench", "collectives"] + ours, None),
        (MPIRUN, mpirun + ["--bind-to", "none", datapar, "bench", "collectives", "--backend", "mpi"] + ours, None),
        ("datapar gloo TCP", [datapar, "bench", "collectives", "--nproc", str(args.nproc)] + ours, tcp_only),
        ("datapar mpi", [datapar, "bench", "collectives", "--backend", "mpi", "--nproc", str(args.nproc)] + ours, None),
        ("PyTorch gloo", ["/usr/bin/python3", os.path.join(ROOT, "bench", "torch_collectives.py"),
                          "--nproc", str(args.nproc)] + ours, None),
    ]
    if args.op == "all_reduce":
        found += [("plain MPI", mpirun + [reference] + common, None),
                  ("MPI_Iallreduce + MPI_Test", mpirun + [reference, "--nonblocking"] + common, None)]
    return found


def speedup(med, label, size):
    """How many times faster `label` is than PyTorch on gloo at `size` (time ratio)."""
    return med["PyTorch gloo"][size] / med[label][size]


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
    parser.add_argument("--op", default="all_reduce", choices=["all_reduce", "broadcast", "all_gather"])
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
        for name, command, env in order:
            done = subprocess.run(command, capture_output=True, text=True, env=env)
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
    labels = [DEFAULT, MPIRUN, "datapar gloo TCP", "datapar mpi", "PyTorch gloo", "plain MPI",
              "MPI_Iallreduce + MPI_Test", "memcpy"]
    med = {l: {s: statistics.median(v) for s, v in times[l].items()} for l in labels if l in times}
    nbytes = {s: float(s.split()[0]) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[s.split()[1]]
              for s in sizes}
    # Bus bandwidth as nccl-tests: all_reduce 2(n-1)/n of the buffer, all_gather (n-1)/n of the
    # gathered total, broadcast the buffer.
    factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1), "broadcast": 1.0}[args.op]
    busbw = lambda s, us: nbytes[s] / (us * 1e-6) / 1e9 * factor
    print(f"{args.op} of float32 (size: bytes per process), {n} processes, {args.rounds} rounds x {args.iters} "
          "iterations: median over rounds of rank 0's median per op")
    print(f"\ntime per {args.op} (us):\n")
    print("| size | " + " | ".join(l for l in labels if l in med) + " |")
    print("|---" * (1 + len(med)) + "|")
    for s in sizes:
        print(f"| {s} | " + " | ".join(f"{med[l][s]:.1f}" for l in labels if l in med) + " |")
    print("\nbus bandwidth (GB/s; memcpy: bytes copied per second):\n")
    print("| size | " + " | ".join(l for l in labels if l in med) +
          " | default / PyTorch gloo | default / mpirun path |")
    print("|---" * (3 + len(med)) + "|")
    for s in sizes:
        cells = [f"{busbw(s, med[l][s]):.3f}" if l != "memcpy" else f"{nbytes[s] / med[l][s] / 1e3:.3f}"
                 for l in labels if l in med]
        print(f"| {s} | " + " | ".join(cells) +
              f" | {speedup(med, DEFAULT, s):.2f}x | {med[MPIRUN][s] / med[DEFAULT][s]:.2f}x |")
    print("\ngoals (issue 14), ratios of medians over the rounds:")
    if args.op == "all_reduce":
        print("  the default single-node path against the mpirun path (MPI's shared memory), not slower:")
        for s in sizes:
            r = med[MPIRUN][s] / med[DEFAULT][s]
            print(f"    {s}: {r:.2f}x ({'met' if r >= 1 else 'NOT met'})")
    else:
        print("  the default single-node path against PyTorch on gloo, bus bandwidth >= 3x:")
        for s in [x for x in sizes if x in ("1 MiB", "4 MiB", "16 MiB")]:
            r = speedup(med, DEFAULT, s)
            print(f"    {s}: {r:.2f}x ({'met' if r >= 3 else 'NOT met'})")
    for label in (DEFAULT, MPIRUN):
        print(f"\nper round, {label} / PyTorch gloo (speed ratio of that round's medians):")
        for s in sizes:
            pairs = zip(times["PyTorch gloo"][s], times[label][s])
            print(f"  {s}: " + " ".join(f"{t / d:.2f}x" for t, d in pairs))
    print("\nper-round medians (us), to judge the noise:")
    for l in labels:
        if l in times:
            print(f"  {l}: " + "; ".join(f"{s} " + " ".join(f"{v:.0f}" for v in times[l][s]) for s in sizes))


if __name__ == "__main__":
    main()
