"""PyTorch's torch.distributed on gloo (or nccl: rank r's tensors on cuda:r), timed the way `datapar bench collectives` times datapar:
per size, `warmup` untimed runs, then `iters` runs each after a barrier, rank 0's median.

    /usr/bin/python3 bench/torch_collectives.py --nproc 2 --sizes 4KiB,1MiB,16MiB
    python3 bench/torch_collectives.py --backend nccl --nproc 2 --sizes 1MiB,16MiB,256MiB

On nccl a timed run ends when the operation has finished on the GPU (torch.cuda.synchronize),
as datapar's ends when one element of the result has reached the host.
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def parse_sizes(text):
    sizes = []
    for item in text.split(","):
        digits = len(item) - len(item.lstrip("0123456789"))
        sizes.append(int(item[:digits]) * UNITS[item[digits:] or "B"])
    return sizes


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if n == int(n) else f"{n:.1f} {unit}"
        n /= 1024


def run(rank, args):
    torch.set_num_threads(1)
    gpu = args.backend == "nccl"
    device = torch.device(f"cuda:{rank}" if gpu else "cpu")
    if gpu:
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=args.nproc,
                            **({"device_id": device} if gpu else {}))
    n = args.nproc
    settle = (lambda: torch.cuda.synchronize(device)) if gpu else (lambda: None)
    if rank == 0:
        print(f"torch.distributed {torch.__version__}: {args.op}, backend {args.backend}, {n} processes, "
              f"{args.iters} iterations (median)")
        print("| size | time (us) | algbw (GB/s) | busbw (GB/s) |\n|---|---|---|---|")
    warm = torch.ones(1024, device=device)  # as datapar: warm the connections up before any size is timed
    for _ in range(20):
        dist.all_reduce(warm)
    settle()
    for size in parse_sizes(args.sizes):
        count = max(1, size // 4)
        tensor = torch.ones(count, device=device)
        outputs = [torch.empty(count, device=device) for _ in range(n)]

        def once():
            if args.op == "all_reduce":
                dist.all_reduce(tensor)
            elif args.op == "broadcast":
                dist.broadcast(tensor, 0)
            else:
                dist.all_gather(outputs, tensor)

        for _ in range(args.warmup):
            once()
        settle()
        seconds = []
        for _ in range(args.iters):
            dist.barrier()
            start = time.perf_counter()
            once()
            settle()
            seconds.append(time.perf_counter() - start)
        t = statistics.median(seconds)
        moved = count * 4 * (n if args.op == "all_gather" else 1)
        algbw = moved / t / 1e9
        factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n}.get(args.op, 1.0)
        if rank == 0:
            print(f"| {human(count * 4)} | {t * 1e6:.1f} | {algbw:.3f} | {algbw * factor:.3f} |", flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    parser.add_argument("--op", default="all_reduce", choices=["all_reduce", "broadcast", "all_gather"])
    parser.add_argument("--sizes", default="4KiB,64KiB,1MiB,4MiB,16MiB,64MiB")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    if args.port == 0:
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            args.port = s.getsockname()[1]
    mp.spawn(run, args=(args,), nprocs=args.nproc)


if __name__ == "__main__":
    main()
