"""PyTorch's peer of `datapar bench fsdp --hsdp` on ranks that span machines: DDP, FSDP2
(fully_shard) over every rank, and HSDP (fully_shard on a 2-D mesh (replicate, shard), the
shard dimension a machine's ranks), timed in alternating rounds as datapar times its own;
the bytes each sends over the machines' links per step read from the kernel's counters by
each machine's first rank, as datapar's link_bytes.h does. One process per rank, started
by bench/hsdp_link.sh in its network namespace:

    python3 bench/torch_hsdp.py --rank R --world 4 --master ADDR --port P [--model mlp] [--rounds 3]
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from torch_ddp import make_model  # noqa: E402  the same models as bench/torch_ddp.py
from torch_fsdp import shard_units  # noqa: E402  the same units as bench/torch_fsdp.py

DEFAULTS = {"mlp": (64, 100), "lenet": (128, 30), "resnet18": (32, 5)}  # batch per rank, steps per round


def link_tx_bytes():
    total = 0
    for name in os.listdir("/sys/class/net"):
        if name != "lo":
            with open(f"/sys/class/net/{name}/statistics/tx_bytes") as f:
                total += int(f.read())
    return total


def run(args):
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}:{args.port}", rank=args.rank,
                            world_size=args.world)
    rank, world, machine_ranks = args.rank, args.world, args.shard_size
    counts_links = rank % machine_ranks == 0
    g = torch.Generator().manual_seed(100 + rank)
    batches = [(torch.randn(args.batch, 1, 28, 28, generator=g), torch.randint(10, (args.batch,), generator=g))
               for _ in range(4)]

    def step(model, opt, i):
        x, y = batches[i % len(batches)]
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    def timed(model, opt):
        sent = link_tx_bytes() if counts_links else 0
        dist.barrier()
        start = time.perf_counter()
        for i in range(args.steps):
            step(model, opt, i)
        t = torch.tensor([(time.perf_counter() - start) / args.steps], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        b = torch.tensor([(link_tx_bytes() - sent) / args.steps if counts_links else 0.0], dtype=torch.float64)
        dist.all_reduce(b)
        return t.item(), b.item()

    def fresh():
        torch.manual_seed(0)
        return make_model(args.model)

    variants = {
        "ddp": nn.parallel.DistributedDataParallel(fresh()),
        "fsdp": shard_units(fresh(), mesh=init_device_mesh("cpu", (world,))),
        "hsdp": shard_units(fresh(), mesh=init_device_mesh("cpu", (world // machine_ranks, machine_ranks),
                                                      mesh_dim_names=("replicate", "shard"))),
    }
    opts = {k: torch.optim.Adam(m.parameters(), lr=1e-3) for k, m in variants.items()}
    for i in range(args.warmup):
        for k, m in variants.items():
            step(m, opts[k], i)
    times = {k: [] for k in variants}
    link = {k: [] for k in variants}
    for _ in range(args.rounds):
        for k, m in variants.items():
            t, b = timed(m, opts[k])
            times[k].append(t)
            link[k].append(b)
    if rank == 0:
        t = {k: statistics.median(v) for k, v in times.items()}
        b = {k: statistics.median(v) for k, v in link.items()}
        print(f"torch {torch.__version__}: {args.model}, {world} ranks, machines of {machine_ranks}, batch "
              f"{args.batch} per rank, adam, {torch.get_num_threads()} thread(s), {args.rounds} rounds of "
              f"{args.steps} steps")
        print(f"step (median, slowest rank): ddp {t['ddp'] * 1e3:.2f} ms, fsdp {t['fsdp'] * 1e3:.2f} ms, "
              f"hsdp {t['hsdp'] * 1e3:.2f} ms: hsdp/fsdp {t['hsdp'] / t['fsdp']:.3f}")
        print(f"bytes over the machines' links per step: ddp {b['ddp']:.0f}, fsdp {b['fsdp']:.0f}, "
              f"hsdp {b['hsdp']:.0f}: hsdp/fsdp {b['hsdp'] / b['fsdp']:.3f}")
        sys.stdout.flush()
    dist.barrier()
    os._exit(0)  # as bench/torch_ddp.py: gloo's destructor has hung at exit


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="mlp", choices=sorted(DEFAULTS))
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--shard-size", type=int, default=2)
    parser.add_argument("--master", required=True)
    parser.add_argument("--port", type=int, default=29911)
    parser.add_argument("--batch", type=int, default=0)
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    batch, steps = DEFAULTS[args.model]
    args.batch = args.batch or batch
    args.steps = args.steps or steps
    run(args)


if __name__ == "__main__":
    main()
