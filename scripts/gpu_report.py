"""The second half of scripts/gpu_check.sh: the machine, the gpu tests' results (CTest's JUnit
file), the GPU figures (run here, each with its peer in the same run) and the report,
OUTDIR/gpu_report.md and OUTDIR/gpu_report.json. Exits 1 when a gpu test failed, the build
failed or CTest ran no gpu test; a failed figure is reported and does not count.

Figures, where the GPUs are there (else each is reported skipped with the reason), each side
by side with its peer, --figure-rounds rounds alternating, the first epoch of each run (warm-up)
not timed, medians:
- 1 GPU: d2l's ResNet-18, LeNet and the MLP on the shipped Fashion-MNIST subset, `datapar
  train --mode single --devices cuda:0` against bench/torch_train.py (the same model,
  initialisation, batch 256, lr), through bench/compare_train.py; plain training against DDP
  and FSDP at NCCL world 1; DataParallel over cuda:0,cpu:0 --balance auto against cuda:0;
- 2 GPUs: the d2l experiment (scripts/d2l_experiment.sh: cuda:0 at batch 256 / lr 0.1 against
  DataParallel on cuda:0,cuda:1 at batch 512 / lr 0.2), and all_reduce bus bandwidth over 2
  processes on NCCL, `datapar bench collectives` against bench/torch_collectives.py.
"""
import argparse
import datetime
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

SIZES = "1MiB,4MiB,16MiB,64MiB,256MiB"
TAIL = 40


def tail(text, lines=TAIL):
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def run(command, timeout, env=None, cwd=None):
    """(exit status, stdout+stderr); status 124 when it ran past timeout."""
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout, env=env, cwd=cwd)
        return done.returncode, done.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out + f"\n(stopped after {timeout} s)"
    except OSError as e:
        return 127, str(e)


TORCH_INFO = r"""
import json, torch
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}
try:
    info["device_count"] = torch.cuda.device_count()
    info["devices"] = [dict(name=p.name, capability=f"{p.major}.{p.minor}", memory_gib=round(p.total_memory / 2**30, 1))
                       for p in map(torch.cuda.get_device_properties, range(info["device_count"]))]
    info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    if info["device_count"]:
        info["driver"] = torch.cuda.driver_version() if hasattr(torch.cuda, "driver_version") else None
except Exception as e:  # no driver: device_count() is 0 on most builds, an error on some
    info.setdefault("device_count", 0)
    info["cuda_error"] = str(e)
print(json.dumps(info))
"""


def machine(python):
    """Date, host, nvidia-smi (when there is one) and torch's view of the devices."""
    m = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
         "host": socket.gethostname(), "cpus": os.cpu_count(), "python": python}
    # In a child process, so this one never holds a CUDA context while the figures run.
    rc, text = run([python, "-c", TORCH_INFO], 300)
    try:
        m["torch"] = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        m["torch"] = {"error": tail(text, 10), "device_count": 0}
    smi = shutil.which("nvidia-smi")
    if smi:
        _, m["nvidia_smi"] = run([smi], 60)
        rc, q = run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"], 60)
        if rc == 0:
            m["gpus"] = [dict(zip(("name", "driver", "memory"), map(str.strip, line.split(","))))
                         for line in q.strip().splitlines()]
            m["driver"] = m["gpus"][0]["driver"] if m["gpus"] else None
    else:
        m["nvidia_smi"] = None
    if not m.get("driver") and m["torch"].get("driver"):
        m["driver"] = str(m["torch"]["driver"])
    return m


def gpus_needed_by_source(source):
    """{"Suite.Name": n} from DATAPAR_REQUIRE_GPUS(n) in each TEST of tests/gpu/*.cc."""
    needed = {}
    gpu_dir = os.path.join(source, "tests", "gpu")
    test = re.compile(r"^\s*TEST(?:_F|_P)?\(\s*(\w+)\s*,\s*(\w+)\s*\)", re.M)
    for name in sorted(os.listdir(gpu_dir)) if os.path.isdir(gpu_dir) else []:
        if not name.endswith(".cc"):
            continue
        with open(os.path.join(gpu_dir, name)) as f:
            text = f.read()
        starts = list(test.finditer(text))
        for i, t in enumerate(starts):
            body = text[t.end():starts[i + 1].start() if i + 1 < len(starts) else len(text)]
            r = re.search(r"DATAPAR_REQUIRE_GPUS\(\s*(\d+)\s*\)", body)
            if r:
                needed[f"{t.group(1)}.{t.group(2)}"] = int(r.group(1))
    return needed


def gpus_needed_by_script(build, name):
    """For a test that runs a script: the N of its "needs N CUDA devices" message."""
    rc, text = run(["ctest", "--show-only=json-v1", "-R", f"^{re.escape(name)}$"], 60, cwd=build)
    try:
        tests = json.loads(text)["tests"]
    except (ValueError, KeyError):
        return None
    for t in tests:
        for arg in t.get("command", []):
            if os.path.isfile(arg) and arg.endswith(".sh"):
                with open(arg) as f:
                    r = re.search(r"needs (\d+) CUDA device", f.read())
                if r:
                    return int(r.group(1))
    return None


def tests(junit, source, build):
    """Each gpu test: name, gpus (needed), status passed / failed / skipped, reason, seconds."""
    if not junit or not os.path.exists(junit):
        return []
    needed = gpus_needed_by_source(source)
    found = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name")
        output = case.findtext("system-out") or ""
        status = case.get("status", "")
        skipped, failure = case.find("skipped"), case.find("failure")
        reason = ""
        if failure is not None or status == "fail":
            result = "failed"
            reason = (failure.get("message") if failure is not None else "") or "failed"
        elif skipped is not None or status in ("notrun", "disabled"):
            result = "skipped"
            gtest = re.search(r": Skipped\n(.+)", output)
            script = re.search(r"^skipped: (.+)$", output, re.M)
            reason = (gtest or script).group(1).strip() if (gtest or script) else \
                (skipped.get("message") if skipped is not None else status) or "skipped (no reason printed)"
        else:
            result = "passed"
        n = needed.get(name)
        if n is None:
            r = re.search(r"needs (\d+) CUDA device", reason)
            n = int(r.group(1)) if r else gpus_needed_by_script(build, name)
        found.append({"name": name, "gpus": n, "status": result, "reason": reason,
                      "seconds": float(case.get("time") or 0),
                      **({"output_tail": tail(output)} if result == "failed" else {})})
    return found


def time_left(args):
    """Seconds until --deadline (the caller's whole budget), or a day when there is none."""
    return args.deadline - time.time() if args.deadline else 86400.0


def run_figure_command(args, command, limit, env=None):
    """Runs one command of a figure, printed first, within `limit` and the deadline."""
    timeout = min(limit, time_left(args))
    if timeout < 20:
        return 124, f"not started: {time_left(args):.0f} s left before the check's deadline"
    print(f"gpu_report:   $ {' '.join(command)}", flush=True)
    return run(command, timeout, env=env)


def figure_compare(args, gpus, datapar, out, model, lr):
    """datapar train --mode single on cuda:0 against bench/torch_train.py, the same model,
    initialisation, batch 256 and lr, through bench/compare_train.py (rounds alternating)."""
    timed = max(args.figure_epochs - 1, 1)
    fig = {"name": f"{model}, one GPU: datapar train vs PyTorch",
           "setup": f"Fashion-MNIST subset ({os.path.join(args.source, 'data', 'fashion-mnist')}), batch 256, "
                    f"lr {lr:g}, seed 0, {args.figure_epochs} epochs (the first not timed), {args.figure_rounds} "
                    f"rounds alternating (medians)"}
    if gpus < 1:
        return dict(fig, status="skipped", reason=f"no CUDA device (torch.cuda.device_count() is {gpus})")
    result = os.path.join(out, f"figure-{model}-one-gpu.json")
    command = [args.python, os.path.join(args.source, "bench", "compare_train.py"), "--bin", datapar,
               "--data", os.path.join(args.source, "data", "fashion-mnist"), "--model", model,
               "--device", "cuda", "--nproc", "1", "--batch-size", "256", "--lr", str(lr),
               "--epochs", str(args.figure_epochs), "--warmup-epochs", str(args.figure_epochs - timed),
               "--rounds", str(args.figure_rounds), "--python", args.python, "--json", result]
    rc, text = run_figure_command(args, command, 480)
    fig["command"] = " ".join(command)
    with open(os.path.join(out, f"figure-{model}-one-gpu.log"), "w") as f:
        f.write(text)
    if rc != 0 or not os.path.exists(result):
        return dict(fig, status="failed", reason=f"exit {rc}", output_tail=tail(text))
    with open(result) as f:
        r = json.load(f)
    rows = []
    for tool in ("datapar", "PyTorch"):
        m = r["medians"][tool]
        rows.append({"run": tool, "seconds_per_epoch": m["seconds"] / timed,
                     "samples_per_second": m["samples_per_second"], "test_accuracy": m["test_accuracy"],
                     "rounds_samples_per_second": [x[tool]["samples_per_second"] for x in r["rounds"]]})
    return dict(fig, status="measured", rows=rows,
                summary=f"datapar / PyTorch speed {r['speed_of_medians']:.2f}x (median of the rounds' ratios "
                        f"{r['speed_median_of_rounds']:.2f}x); test accuracy datapar - PyTorch "
                        f"{r['accuracy_points_median']:+.2f} points")


def figure_one_gpu(args, gpus, datapar, out):
    return figure_compare(args, gpus, datapar, out, "resnet18", 0.1)


def figure_lenet_one_gpu(args, gpus, datapar, out):
    return figure_compare(args, gpus, datapar, out, "lenet", 0.9)


def figure_mlp_one_gpu(args, gpus, datapar, out):
    return figure_compare(args, gpus, datapar, out, "mlp", 0.1)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def figure_two_gpu_d2l(args, gpus, datapar, out):
    fig = {"name": "d2l experiment: 1 GPU (batch 256, lr 0.1) vs DataParallel on 2 GPUs (batch 512, lr 0.2)",
           "setup": f"scripts/d2l_experiment.sh DEVICES=cuda RUNS='single dp', {args.figure_epochs} epochs"}
    if gpus < 2:
        return dict(fig, status="skipped", reason=f"needs 2 CUDA devices; torch.cuda.device_count() is {gpus}")
    d2l_out = os.path.join(out, "d2l-two-gpus")
    env = dict(os.environ, DEVICES="cuda", RUNS="single dp", EPOCHS=str(args.figure_epochs), BIN=datapar,
               OUT=d2l_out)
    command = ["bash", os.path.join(args.source, "scripts", "d2l_experiment.sh")]
    rc, text = run_figure_command(args, command, 300, env=env)
    fig["command"] = f"DEVICES=cuda RUNS='single dp' EPOCHS={args.figure_epochs} BIN={datapar} OUT={d2l_out} " \
                     + " ".join(command)
    with open(os.path.join(out, "figure-two-gpu-d2l.log"), "w") as f:
        f.write(text)
    runs = {"1 GPU": "single.jsonl", "2 GPUs (DataParallel)": "dp.jsonl"}
    if rc != 0 or not all(os.path.exists(os.path.join(d2l_out, p)) for p in runs.values()):
        return dict(fig, status="failed", reason=f"exit {rc}", output_tail=tail(text))
    rows = []
    for label, path in runs.items():
        epochs = read_jsonl(os.path.join(d2l_out, path))
        rows.append({"run": label, "seconds_per_epoch": statistics.median(e["seconds"] for e in epochs),
                     "samples_per_second": statistics.median(e["samples_per_second"] for e in epochs),
                     "test_accuracy": epochs[-1]["test_accuracy"]})
    return dict(fig, status="measured", rows=rows,
                summary=f"2 GPUs / 1 GPU speed {rows[1]['samples_per_second'] / rows[0]['samples_per_second']:.2f}x "
                        "(samples/s, median epoch)")


def figure_train_runs(args, gpus, datapar, out, name, key, runs, model="resnet18", lr="0.1"):
    """`datapar train` runs side by side on one GPU (ResNet-18 unless `model`, the shipped subset,
    batch 256), for --figure-rounds rounds, each run leading a round in turn; per run the median
    over rounds of its median epoch (the first epoch, warm-up, left out when there are more)."""
    fig = {"name": name, "setup": f"{model}, Fashion-MNIST subset, batch 256, lr {lr}, {args.figure_epochs} epochs "
                                  f"(the first not timed), {args.figure_rounds} rounds alternating (medians)"}
    if gpus < 1:
        return dict(fig, status="skipped", reason=f"no CUDA device (torch.cuda.device_count() is {gpus})")
    common = ["--model", model, "--epochs", str(args.figure_epochs), "--batch-size", "256",
              "--lr", lr, "--seed", "0", "--data", os.path.join(args.source, "data", "fashion-mnist")]
    samples = {label: [] for label, _ in runs}
    last = {}
    texts = []
    for round_ in range(args.figure_rounds):
        shift = round_ % len(runs)
        for label, argv in runs[shift:] + runs[:shift]:
            metrics = os.path.join(out, f"figure-{key}-{len(samples[label])}-{re.sub(r'[^a-z0-9]+', '-', label.lower())}.jsonl")
            command = [a.replace("{datapar}", datapar) for a in argv] + common + ["--metrics", metrics]
            rc, text = run_figure_command(args, command, 240)
            texts.append(f"$ {' '.join(command)}\n{text}")
            if rc != 0 or not os.path.exists(metrics):
                fig["command"] = " ".join(command)
                with open(os.path.join(out, f"figure-{key}.log"), "w") as f:
                    f.write("\n".join(texts))
                return dict(fig, status="failed", reason=f"{label}: exit {rc}", output_tail=tail(text))
            epochs = read_jsonl(metrics)
            kept = epochs[1:] if len(epochs) > 1 else epochs
            samples[label].append((statistics.median(e["seconds"] for e in kept),
                                   statistics.median(e["samples_per_second"] for e in kept)))
            last[label] = epochs[-1]["test_accuracy"]
    with open(os.path.join(out, f"figure-{key}.log"), "w") as f:
        f.write("\n".join(texts))
    rows = [{"run": label, "seconds_per_epoch": statistics.median(x[0] for x in samples[label]),
             "samples_per_second": statistics.median(x[1] for x in samples[label]), "test_accuracy": last[label],
             "rounds_samples_per_second": [x[1] for x in samples[label]]}
            for label, _ in runs]
    fig["command"] = "; ".join(" ".join(a.replace("{datapar}", datapar) for a in argv) + " " + " ".join(common)
                               for _, argv in runs)
    return dict(fig, status="measured", rows=rows,
                summary="; ".join(f"{r['run']} / {rows[0]['run']} speed "
                                  f"{r['samples_per_second'] / rows[0]['samples_per_second']:.2f}x" for r in rows[1:])
                + " (samples/s, medians)")


def figure_ddp_world_one(args, gpus, datapar, out):
    return figure_train_runs(args, gpus, datapar, out,
                             "DDP's and FSDP's overhead, one GPU: plain training vs DDP and FSDP world 1 on NCCL",
                             "ddp-world-one", [
                                 ("plain, cuda:0", ["{datapar}", "train", "--devices", "cuda:0"]),
                                 ("DDP world 1, nccl", ["{datapar}", "launch", "--nproc-per-node", "1", "--",
                                                        "{datapar}", "train", "--mode", "ddp", "--backend", "nccl"]),
                                 ("FSDP world 1, nccl", ["{datapar}", "launch", "--nproc-per-node", "1", "--",
                                                         "{datapar}", "train", "--mode", "fsdp", "--backend", "nccl"]),
                             ])


def figure_cuda_graph(args, gpus, datapar, out, model, lr):
    """Issue 50: a small model's step eagerly and captured in a CUDA graph (goal 1.5x)."""
    return figure_train_runs(args, gpus, datapar, out,
                             f"CUDA graphs, one GPU: {model}'s step eager vs --cuda-graph", f"cuda-graph-{model}", [
                                 ("eager, cuda:0", ["{datapar}", "train", "--devices", "cuda:0"]),
                                 ("--cuda-graph", ["{datapar}", "train", "--devices", "cuda:0", "--cuda-graph"]),
                             ], model=model, lr=lr)


def figure_cuda_graph_mlp(args, gpus, datapar, out):
    return figure_cuda_graph(args, gpus, datapar, out, "mlp", "0.1")


def figure_cuda_graph_lenet(args, gpus, datapar, out):
    return figure_cuda_graph(args, gpus, datapar, out, "lenet", "0.9")


def figure_unlike_devices(args, gpus, datapar, out):
    return figure_train_runs(args, gpus, datapar, out,
                             "Unlike devices, one GPU: cuda:0 alone vs DataParallel cuda:0,cpu:0 --balance auto",
                             "unlike-devices", [
                                 ("cuda:0 alone", ["{datapar}", "train", "--devices", "cuda:0"]),
                                 ("cuda:0,cpu:0 balanced", ["{datapar}", "train", "--mode", "dp", "--devices", "cuda:0,cpu:0",
                                                            "--balance", "auto"]),
                             ])


ROW = re.compile(r"^(?:\[rank 0\] )?\| ([0-9.]+ [KMG]?i?B) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|", re.M)


def figure_collectives(args, gpus, datapar, out):
    fig = {"name": "all_reduce on NCCL, 2 processes: datapar bench collectives vs torch.distributed",
           "setup": f"sizes {SIZES} per process, 20 iterations, rank 0's median; bus bandwidth as nccl-tests"}
    if gpus < 2:
        return dict(fig, status="skipped", reason=f"needs 2 CUDA devices; torch.cuda.device_count() is {gpus}")
    commands = {
        "datapar": [datapar, "bench", "collectives", "--backend", "nccl", "--nproc", "2", "--sizes", SIZES],
        "PyTorch": [args.python, os.path.join(args.source, "bench", "torch_collectives.py"), "--backend", "nccl",
                    "--nproc", "2", "--sizes", SIZES],
    }
    tables, texts = {}, []
    for tool, command in commands.items():
        rc, text = run_figure_command(args, command, 180)
        texts.append(f"$ {' '.join(command)}\n{text}")
        tables[tool] = {m.group(1): (float(m.group(2)), float(m.group(4))) for m in ROW.finditer(text)}
        if rc != 0 or not tables[tool]:
            fig["command"] = " ".join(command)
            return dict(fig, status="failed", reason=f"{tool}: exit {rc}", output_tail=tail(text))
    with open(os.path.join(out, "figure-collectives.log"), "w") as f:
        f.write("\n".join(texts))
    fig["command"] = "; ".join(" ".join(c) for c in commands.values())
    rows = [{"size": size, "datapar_us": us, "datapar_busbw_gbs": bw,
             "pytorch_us": tables["PyTorch"].get(size, (None, None))[0],
             "pytorch_busbw_gbs": tables["PyTorch"].get(size, (None, None))[1]}
            for size, (us, bw) in tables["datapar"].items()]
    return dict(fig, status="measured", rows=rows)


# In order of what a one-GPU lease should see first; the deadline cuts the tail.
FIGURES = (figure_one_gpu, figure_unlike_devices, figure_ddp_world_one, figure_cuda_graph_mlp, figure_cuda_graph_lenet,
           figure_lenet_one_gpu, figure_mlp_one_gpu, figure_two_gpu_d2l, figure_collectives)


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def markdown(report):
    m = report["machine"]
    t = m.get("torch", {})
    lines = [f"# datapar GPU check, {m['date']}", "",
             f"- host: {m['host']} ({m['cpus']} CPUs)",
             f"- devices: " + (", ".join(f"{g['name']} ({g['memory']})" for g in m.get("gpus", [])) or
                               ", ".join(f"{d['name']} ({d['memory_gib']} GiB, sm {d['capability']})"
                                         for d in t.get("devices", [])) or "none (no CUDA device visible)"),
             f"- driver: {m.get('driver') or 'none found'}",
             f"- torch {t.get('torch')}, CUDA {t.get('cuda')}, cuDNN {t.get('cudnn')}, NCCL {t.get('nccl')}; "
             f"torch.cuda.device_count() {t.get('device_count')} ({m['python']})",
             f"- datapar: {report['source']}; total time {report['seconds']:.0f} s"
             f" (configure and build {report.get('build_seconds', 0):.0f} s)", ""]
    if report.get("failed_step"):
        lines += [f"**The {report['failed_step']} failed**; no test ran. Last lines of its log:", "", "```",
                  report["failed_log_tail"], "```", ""]
    c = report["counts"]
    lines += ["## gpu tests (ctest -L gpu)", ""] + (["Not asked for (GPU_CHECK_SKIP_TESTS): figures only.", ""]
                                                     if report.get("tests_not_asked") else []) + [
              f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped of {c['total']}.", "",
              "| test | GPUs | result | reason |", "|---|---|---|---|"]
    for x in report["tests"]:
        lines.append(f"| {x['name']} | {x['gpus'] if x['gpus'] is not None else '?'} | {x['status']} | "
                     f"{x['reason'].replace('|', '/')} |")
    for x in report["tests"]:
        if x["status"] == "failed":
            lines += ["", f"### {x['name']} (failed): last lines of its output", "", "```", x["output_tail"], "```"]
    if report.get("ctest_problem"):
        lines += ["", f"**{report['ctest_problem']}**", "", "```", report.get("ctest_log_tail", ""), "```"]
    lines += ["", "## Figures", ""]
    if report.get("figures_not_asked"):
        lines += ["None: a rerun of some tests (GPU_CHECK_TESTS) makes no figure.", ""]
    for f in report["figures"]:
        lines += [f"### {f['name']}", "", f"{f['setup']}.", ""]
        if f["status"] == "skipped":
            lines += [f"Skipped: {f['reason']}.", ""]
            continue
        if f["status"] == "failed":
            lines += [f"**Failed** ({f['reason']}): `{f.get('command', '')}`", "", "```", f["output_tail"], "```", ""]
            continue
        if "size" in f["rows"][0]:
            lines += ["| size | datapar us | datapar busbw GB/s | PyTorch us | PyTorch busbw GB/s |", "|---|---|---|---|---|"]
            lines += [f"| {r['size']} | {fmt(r['datapar_us'], '.1f')} | {fmt(r['datapar_busbw_gbs'], '.2f')} | "
                      f"{fmt(r['pytorch_us'], '.1f')} | {fmt(r['pytorch_busbw_gbs'], '.2f')} |" for r in f["rows"]]
        else:
            lines += ["| run | s / epoch | samples/s | samples/s per round | test accuracy |", "|---|---|---|---|---|"]
            lines += [f"| {r['run']} | {r['seconds_per_epoch']:.2f} | {r['samples_per_second']:.0f} | "
                      f"{', '.join(f'{x:.0f}' for x in r.get('rounds_samples_per_second', [])) or '-'} | "
                      f"{r['test_accuracy']:.4f} |" for r in f["rows"]]
        lines += [""] + ([f["summary"] + ".", ""] if f.get("summary") else []) + [f"`{f['command']}`", ""]
    if m.get("nvidia_smi"):
        lines += ["## nvidia-smi", "", "```", m["nvidia_smi"].rstrip(), "```", ""]
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", required=True)
    p.add_argument("--build", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--python", required=True)
    p.add_argument("--started", type=float, required=True, help="when gpu_check.sh started (epoch seconds)")
    p.add_argument("--build-seconds", type=float, default=0, help="configure and build took this long")
    p.add_argument("--failed-step", default="", help="configure or build, when it failed")
    p.add_argument("--failed-log", default="")
    p.add_argument("--ctest-junit", default="")
    p.add_argument("--ctest-log", default="")
    p.add_argument("--ctest-rc", type=int, default=0)
    p.add_argument("--no-tests", action="store_true", help="the tests were not asked for (figures only)")
    p.add_argument("--figure-epochs", type=int, default=5)
    p.add_argument("--figure-rounds", type=int, default=3)
    p.add_argument("--figure-only", default="",
                   help="a regular expression: only the figures whose function name it finds (e.g. 'resnet|lenet')")
    p.add_argument("--deadline", type=float, default=0,
                   help="epoch seconds: no figure command runs past it (a lease's end); the report is written "
                        "after each figure, so what ran is kept")
    p.add_argument("--figures", choices=("all", "none"), default="all",
                   help="none: a rerun of some tests (GPU_CHECK_TESTS), no figure")
    args = p.parse_args()

    report = {"source": "", "machine": machine(args.python), "build_seconds": args.build_seconds}
    manifest = os.path.join(args.source, "third_party", "MANIFEST")
    if os.path.exists(manifest):
        with open(manifest) as f:
            report["source"] = "bundle, " + next((line[2:].strip() for line in f if line.startswith("# source:")),
                                                 "source unknown")
    else:
        rc, rev = run(["git", "-C", args.source, "describe", "--always", "--dirty"], 30)
        report["source"] = f"checkout {rev.strip()}" if rc == 0 else "checkout"
    if args.failed_step:
        report["failed_step"] = args.failed_step
        with open(args.failed_log, errors="replace") as f:
            report["failed_log_tail"] = tail(f.read())
    report["tests"] = tests(args.ctest_junit, args.source, args.build)
    counts = {s: sum(t["status"] == s for t in report["tests"]) for s in ("passed", "failed", "skipped")}
    report["counts"] = dict(counts, total=len(report["tests"]))
    report["tests_not_asked"] = args.no_tests
    if not args.failed_step and not args.no_tests and (not report["tests"] or (args.ctest_rc and not counts["failed"])):
        report["ctest_problem"] = ("CTest ran no gpu test" if not report["tests"]
                                   else f"ctest exited {args.ctest_rc} with no failed test in its JUnit file")
        if args.ctest_log and os.path.exists(args.ctest_log):
            with open(args.ctest_log, errors="replace") as f:
                report["ctest_log_tail"] = tail(f.read())

    gpus = int(report["machine"]["torch"].get("device_count") or 0)
    datapar = os.path.join(args.build, "bin", "datapar")
    report["figures"] = []
    report["figures_not_asked"] = args.figures == "none"

    def write():
        report["seconds"] = time.time() - args.started
        with open(os.path.join(args.out, "gpu_report.json"), "w") as f:
            json.dump(report, f, indent=1)
        with open(os.path.join(args.out, "gpu_report.md"), "w") as f:
            f.write(markdown(report) + "\n")

    write()  # the tests' results, before any figure
    for figure in FIGURES:
        if args.failed_step or args.figures == "none":
            break
        if args.figure_only and not re.search(args.figure_only, figure.__name__):
            continue
        print(f"gpu_report: figure {figure.__name__} ({time_left(args):.0f} s before the deadline)", flush=True)
        report["figures"].append(figure(args, gpus, datapar, args.out))
        f = report["figures"][-1]
        print(f"gpu_report:   {f['status']}: {f.get('summary') or f.get('reason', '')}", flush=True)
        write()
    write()
    bad = args.failed_step or counts["failed"] or report.get("ctest_problem")
    print(f"gpu_report: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped; "
          f"figures: {', '.join(f['status'] for f in report['figures']) or 'none'}; "
          f"report in {os.path.join(args.out, 'gpu_report.md')} and gpu_report.json")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
