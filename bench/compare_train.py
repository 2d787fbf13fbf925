"""LeNet on Fashion-MNIST, 2-process DDP: `datapar train` against the same training in a
PyTorch script (bench/torch_train.py: DDP on gloo, DistributedSampler, DataLoader), the
same batch, lr, seed, threads and loader workers. The two take turns, round after round
(each leads a round in turn); every run's epoch time, samples/s and exact test accuracy
come from its --metrics JSON lines. Prints a table per round and the medians.

    python3 bench/compare_train.py --bin build/bin/datapar --rounds 3

The issue's goals: datapar >= 1.2x PyTorch's speed, test accuracy within 1 point.
--wait-quiet waits before each run until no compiler (cc1plus) and no unstopped
`datapar ... resnet18` runs and the 1-minute load average is below --max-load, checking
every 30 s, for at most --max-wait minutes over the whole benchmark; then it measures
anyway and the table shows the load (or stops, with --stop-when-busy).
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = ("datapar", "PyTorch")
GOAL_SPEED, GOAL_POINTS = 1.2, 1.0


def busy_reasons(max_load):
    """What keeps the machine from being quiet now (empty when it is quiet)."""
    compilers, resnets = 0, 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        state = stat[stat.rindex(")") + 2]
        if comm == "cc1plus":
            compilers += 1
        elif comm == "datapar" and "resnet18" in cmdline and state not in "TtZX":
            resnets += 1
    reasons = []
    if compilers:
        reasons.append(f"{compilers} cc1plus")
    if resnets:
        reasons.append(f"{resnets} datapar resnet18 run(s)")
    load = os.getloadavg()[0]
    if load >= max_load:
        reasons.append(f"load {load:.2f}")
    return reasons


class Quiet:
    """Waits for a quiet machine; the wait budget is shared by all runs of the benchmark."""

    def __init__(self, enabled, max_load, max_wait_s, stop_when_busy=False):
        self.enabled, self.max_load, self.left = enabled, max_load, max_wait_s
        self.stop_when_busy = stop_when_busy

    def wait(self):
        """Returns (seconds waited, what was still busy when measuring: [] if quiet)."""
        waited = 0.0
        while True:
            reasons = busy_reasons(self.max_load)
            if self.enabled and reasons and self.left <= 0 and self.stop_when_busy:
                sys.exit(f"compare_train.py: still busy after waiting ({', '.join(reasons)}); "
                         "stopping (--stop-when-busy)")
            if not reasons or not self.enabled or self.left <= 0:
                return waited, reasons
            print(f"  waiting for a quiet machine: {', '.join(reasons)} "
                  f"({self.left / 60:.0f} min of waiting left)", file=sys.stderr, flush=True)
            step = min(30.0, self.left)
            time.sleep(step)
            waited += step
            self.left -= step


def commands(args, tool, metrics):
    common = ["--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--lr", str(args.lr),
              "--seed", str(args.seed), "--workers", str(args.workers), "--threads", str(args.threads),
              "--metrics", metrics, "--model", args.model] + (["--limit", str(args.limit)] if args.limit else [])
    if tool == "datapar":
        if args.nproc == 1:  # one process, no DDP: datapar's single mode on the device's first unit
            return [args.bin, "train", "--mode", "single", "--devices", f"{args.device}:0", "--data", args.data] + common
        if args.device != "cpu":
            sys.exit("compare_train.py: --device cuda compares one process (--nproc 1) only")
        return [args.bin, "launch", "--nproc-per-node", str(args.nproc), "--", args.bin, "train", "--mode", "ddp",
                "--data", args.data] + common
    return [args.python, os.path.join(ROOT, "bench", "torch_train.py"), "--nproc", str(args.nproc), "--data", args.data,
            "--loader", args.torch_loader, "--device", args.device] + (["--mode", "single"] if args.nproc == 1 else []) \
        + common


def run_one(args, tool, quiet):
    """One run: {seconds, samples_per_second, test_*, ...} summed / taken over its epochs."""
    waited, busy = quiet.wait()
    with tempfile.TemporaryDirectory(prefix="compare_train.") as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        command = commands(args, tool, metrics)
        load_before = os.getloadavg()[0]
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired as e:
            sys.exit(f"{tool} ran past --timeout {args.timeout} s: {shlex.join(command)}\n{e.stdout}\n{e.stderr}")
        load_after = os.getloadavg()[0]
        epochs = []
        if os.path.exists(metrics):
            with open(metrics) as f:
                epochs = [json.loads(line) for line in f if line.strip()]
    if done.returncode != 0 or len(epochs) != args.epochs:
        sys.exit(f"{tool} failed (exit {done.returncode}, {len(epochs)} epoch(s) of metrics): "
                 f"{shlex.join(command)}\n{done.stdout}\n{done.stderr}")
    last = epochs[-1]
    timed = epochs[args.warmup_epochs:]
    seconds = sum(e["seconds"] for e in timed)
    samples = sum(e["train_samples"] for e in timed)
    wait = sum(e["data_wait_seconds"] for e in timed)
    return {"tool": tool, "command": command, "started": started, "seconds": seconds,
            "samples_per_second": samples / seconds, "train_samples": samples, "train_loss": last["train_loss"],
            "test_accuracy": last["test_accuracy"], "test_correct": last["test_correct"],
            "test_samples": last["test_samples"], "data_wait_share": wait / seconds,
            "eval_seconds": sum(e["eval_seconds"] for e in timed), "load_before": load_before,
            "load_after": load_after, "waited": waited, "busy": busy}


def speed(results):
    """datapar's speed over PyTorch's: PyTorch's epoch seconds / datapar's."""
    return results["PyTorch"]["seconds"] / results["datapar"]["seconds"]


def points(results):
    """Test accuracy, datapar minus PyTorch, in percentage points."""
    return 100 * (results["datapar"]["test_accuracy"] - results["PyTorch"]["test_accuracy"])


def row(label, r):
    busy = f" (measured busy: {', '.join(r['busy'])})" if r["busy"] else ""
    waited = f", waited {r['waited'] / 60:.1f} min" if r["waited"] else ""
    return (f"| {label} | {r['seconds']:.2f} | {r['samples_per_second']:.0f} | {r['test_accuracy']:.4f} "
            f"({r['test_correct']}/{r['test_samples']}) | {r['train_loss']:.6f} | {100 * r['data_wait_share']:.2f}% | "
            f"{r['eval_seconds']:.2f} | {r['load_before']:.2f} / {r['load_after']:.2f}{waited}{busy} |")


HEADER = ("| run | train s | samples/s | test acc (exact) | train loss | data wait | eval s | load 1-min before / after |\n"
          "|---|---|---|---|---|---|---|---|")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "datapar"), help="the datapar binary")
    parser.add_argument("--data", default=os.path.normpath(os.path.join(ROOT, "..", "shared", "datasets",
                                                                        "fashion-mnist")),
                        help="Fashion-MNIST IDX directory (default: ../shared/datasets/fashion-mnist)")
    parser.add_argument("--batch-size", type=int, default=256, help="global batch, split over the 2 ranks (default: d2l's 256)")
    parser.add_argument("--lr", type=float, default=0.9, help="SGD learning rate (d2l's LeNet: 0.9)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=1, help="epochs per run (times add up, accuracy of the last)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup-epochs", type=int, default=0,
                        help="leave the first N epochs of each run out of its times (warm-up: cuDNN's autotuning, "
                             "the allocator's first blocks); test accuracy is still the last epoch's")
    parser.add_argument("--model", choices=["mlp", "lenet", "resnet18"], default="lenet")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: with --nproc 1, datapar train --devices cuda:0 against torch_train.py --device cuda")
    parser.add_argument("--nproc", type=int, default=2, help="processes (DDP ranks); 1: single mode, no DDP")
    parser.add_argument("--json", default="", help="also write the rounds and medians here as JSON")
    parser.add_argument("--limit", type=int, default=0, help="first N train and test samples (0: all)")
    parser.add_argument("--workers", type=int, default=2, help="loader threads (datapar) / worker processes per rank")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    parser.add_argument("--torch-loader", choices=["sample", "batch"], default="sample",
                        help="torch_train.py --loader: per-sample Dataset + collate (usual), or one fetch per batch")
    parser.add_argument("--python", default="/usr/bin/python3", help="a Python with torch")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one run may take")
    parser.add_argument("--wait-quiet", action="store_true", help="wait for a quiet machine before each run")
    parser.add_argument("--max-load", type=float, default=1.5, help="quiet: 1-minute load average below this")
    parser.add_argument("--max-wait", type=float, default=45, help="minutes of waiting at most, in all")
    parser.add_argument("--stop-when-busy", action="store_true",
                        help="with --wait-quiet: stop instead of measuring when --max-wait runs out")
    args = parser.parse_args()
    if not os.access(args.bin, os.X_OK):
        sys.exit(f"--bin {args.bin}: not an executable (build datapar or give --bin)")
    if not os.path.isdir(args.data):
        sys.exit(f"--data {args.data}: no such directory")
    if not 0 <= args.warmup_epochs < args.epochs:
        sys.exit(f"--warmup-epochs {args.warmup_epochs}: give 0 to {args.epochs - 1} (fewer than --epochs)")

    quiet = Quiet(args.wait_quiet, args.max_load, args.max_wait * 60, args.stop_when_busy)
    rounds = []
    setup = "1 process, no DDP" if args.nproc == 1 else f"{args.nproc}-process DDP"
    print(f"# {args.model}, {setup} on {args.device}, {args.epochs} epoch(s), batch {args.batch_size} "
          f"({args.batch_size // args.nproc} per rank), "
          f"lr {args.lr:g}, seed {args.seed}, {args.threads} intra-op thread(s) and {args.workers} loader workers "
          f"per process, data {args.data}{f', limit {args.limit}' if args.limit else ''}"
          f"{f'; the first {args.warmup_epochs} epoch(s) of each run not timed' if args.warmup_epochs else ''}")
    for r in range(args.rounds):
        order = TOOLS if r % 2 == 0 else TOOLS[::-1]  # each tool leads a round in turn
        results = {}
        for tool in order:
            results[tool] = run_one(args, tool, quiet)
        rounds.append(results)
        print(f"\n## round {r + 1}/{args.rounds} (started {results[order[0]]['started']}; "
              f"{order[0]} first)\n\n{HEADER}")
        for tool in order:
            print(row(tool, results[tool]))
        print(f"\ndatapar / PyTorch speed {speed(results):.2f}x, test accuracy datapar - PyTorch "
              f"{points(results):+.2f} points", flush=True)

    med = {t: {k: statistics.median(x[t][k] for x in rounds) for k in
               ("seconds", "samples_per_second", "test_accuracy", "data_wait_share", "eval_seconds")} for t in TOOLS}
    ratios = [speed(x) for x in rounds]
    diffs = [points(x) for x in rounds]
    print(f"\n## medians over {args.rounds} round(s)\n")
    print("| tool | train s | samples/s | test acc | data wait | train s less data wait | eval s |\n"
          "|---|---|---|---|---|---|---|")
    for t in TOOLS:
        m = med[t]
        busy = statistics.median(x[t]["seconds"] * (1 - x[t]["data_wait_share"]) for x in rounds)
        print(f"| {t} | {m['seconds']:.2f} | {m['samples_per_second']:.0f} | {m['test_accuracy']:.4f} | "
              f"{100 * m['data_wait_share']:.2f}% | {busy:.2f} | {m['eval_seconds']:.2f} |")
    ratio, diff = statistics.median(ratios), statistics.median(diffs)
    of_medians = med["PyTorch"]["seconds"] / med["datapar"]["seconds"]
    # Met only when both readings agree: with few rounds the median round and the
    # ratio of the median times can fall on either side of the goal.
    met = ratio >= GOAL_SPEED and of_medians >= GOAL_SPEED
    print(f"\nspeed datapar / PyTorch: median of the rounds' ratios {ratio:.2f}x (rounds: "
          f"{', '.join(f'{x:.2f}x' for x in ratios)}), ratio of the median times {of_medians:.2f}x; "
          f"goal >= {GOAL_SPEED}x: {'met' if met else 'NOT met'}"
          f"{'' if met or max(ratio, of_medians) < GOAL_SPEED else ' (by one reading only)'}")
    worst = max(abs(d) for d in diffs)
    verdict = "met in every round" if worst <= GOAL_POINTS else f"NOT met (worst round: {worst:.2f} points)"
    print(f"test accuracy datapar - PyTorch: median {diff:+.2f} points (rounds: "
          f"{', '.join(f'{d:+.2f}' for d in diffs)}); goal within {GOAL_POINTS:g} point: {verdict}")
    loads = [x[t][k] for x in rounds for t in TOOLS for k in ("load_before", "load_after")]
    print(f"load average (1 min) over the runs: {min(loads):.2f} - {max(loads):.2f}")
    print("\ncommands (metrics file per run in a temporary directory):")
    for t in TOOLS:
        print(f"  {shlex.join(rounds[0][t]['command'])}")
    if args.json:  # for scripts/gpu_report.py and the like
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "device": args.device, "nproc": args.nproc, "epochs": args.epochs,
                       "warmup_epochs": args.warmup_epochs, "timed_epochs": args.epochs - args.warmup_epochs,
                       "batch_size": args.batch_size, "lr": args.lr, "medians": med, "speed_median_of_rounds": ratio,
                       "speed_of_medians": of_medians, "accuracy_points_median": diff, "rounds": rounds}, f, indent=1)


if __name__ == "__main__":
    main()
