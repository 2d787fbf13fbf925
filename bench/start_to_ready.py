"""Process start to group ready: the wall time of a launcher, 2 workers, one 4 KiB all_reduce
each and exit, for datapar (`datapar launch`'s forked workers, and the user's own mpirun on
backend mpi) and PyTorch (torchrun of pip's torch 2.15, gloo), in one run, the variants
taking turns.

    python3 bench/start_to_ready.py --rounds 5
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "bin")
# PyTorch 2.x from pip (scripts/setup_torch.sh): Debian's torchrun (1.13) fails on Python 3.11.
TORCH_PYTHON = os.path.expanduser("~/.cache/datapar/torch-2.15.0/bin/python3")
TORCH_WORKER = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1024)
dist.all_reduce(t)
dist.destroy_process_group()
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    worker = os.path.join(tempfile.mkdtemp(), "worker.py")
    with open(worker, "w") as f:
        f.write(TORCH_WORKER)
    datapar = os.path.join(BIN, "datapar")
    job = ["--", datapar, "bench", "collectives", "--sizes", "4KiB", "--iters", "1", "--warmup", "0"]
    variants = [
        ("datapar launch (default)", [datapar, "launch", "--nproc-per-node", "2"] + job),
        ("mpirun -np 2 (backend mpi)", ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np",
                                        "2"] + job[1:] + ["--backend", "mpi"]),
        ("datapar --version (the front end: no libtorch)", [datapar, "--version"]),
        ("datapar devices (datapar-torch: libtorch loaded, nothing else)", [datapar, "devices"]),
        ("torchrun (PyTorch gloo)", [TORCH_PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", "2", worker]),
    ]
    times = {name: [] for name, _ in variants}
    for r in range(args.rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for name, command in order:
            start = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True)
            times[name].append(time.perf_counter() - start)
            if done.returncode != 0:
                sys.exit(f"{name} failed:\n{done.stdout}\n{done.stderr}")
    torch_median = statistics.median(times["torchrun (PyTorch gloo)"])
    print(f"wall time, median of {args.rounds} rounds (s), and against torchrun:\n")
    print("| variant | median | runs | / torchrun |")
    print("|---|---|---|---|")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"| {name} | {m:.2f} | {' '.join(f'{t:.2f}' for t in ts)} | {m / torch_median:.2f}x |")


if __name__ == "__main__":
    main()
