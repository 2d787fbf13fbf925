"""PyTorch's FSDP2 (torch.distributed.fsdp.fully_shard) on gloo, measured the way
`datapar bench fsdp` measures datapar: the same models, batches, thread count and optimizer
(Adam, lr 1e-3), DDP and FSDP steps timed in alternating rounds (the slowest rank's time per
step, medians over the rounds), and each rank's parameters + gradients + optimizer state.
Units as datapar's: every Linear and Conv2d of the model's Sequentials, a residual block
whole, the rest the root's.

    python3 bench/torch_fsdp.py --model mlp --nproc 2 [--rounds 5] [--no-reshard]
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from torch_ddp import make_model  # noqa: E402  the same models as bench/torch_ddp.py

DEFAULTS = {"mlp": (64, 100), "lenet": (128, 30), "resnet18": (32, 5)}  # batch per rank, steps per round


def shard_units(model, reshard=True, mesh=None):
    """fully_shard on datapar's units; `mesh`: over a device mesh (a 2-D one: HSDP)."""
    import datapar_models
    blocks = [m for m in model.modules() if isinstance(m, datapar_models.Residual)]
    inside = {id(m) for b in blocks for m in b.modules()}
    for m in model.modules():
        if isinstance(m, datapar_models.Residual) or (isinstance(m, (nn.Linear, nn.Conv2d)) and id(m) not in inside):
            fully_shard(m, reshard_after_forward=reshard, mesh=mesh)
    fully_shard(model, reshard_after_forward=reshard, mesh=mesh)
    return model


def local_bytes(t):
    if t is None:
        return 0
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def footprint(model, opt):
    params = sum(local_bytes(p) for p in model.parameters())
    grads = sum(local_bytes(p.grad) for p in model.parameters())
    state = sum(local_bytes(v) for s in opt.state.values() for v in s.values()
                if torch.is_tensor(v) and v.dim() > 0)
    return params, grads, state


def run(rank, args):
    os.sched_setaffinity(0, {rank % os.cpu_count()})  # a core per rank, as `datapar bench` binds its ranks
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=args.nproc)
    world = args.nproc
    g = torch.Generator().manual_seed(100 + rank)
    batches = [(torch.randn(args.batch, 1, 28, 28, generator=g), torch.randint(10, (args.batch,), generator=g))
               for _ in range(4)]

    def step(model, opt, i):
        x, y = batches[i % len(batches)]
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    def timed(model, opt):
        dist.barrier()
        start = time.perf_counter()
        for i in range(args.steps):
            step(model, opt, i)
        t = torch.tensor([(time.perf_counter() - start) / args.steps], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(make_model(args.model))
    ddp_opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    torch.manual_seed(0)
    fsdp = shard_units(make_model(args.model), args.reshard)
    fsdp_opt = torch.optim.Adam(fsdp.parameters(), lr=1e-3)
    for i in range(args.warmup):
        step(ddp, ddp_opt, i)
        step(fsdp, fsdp_opt, i)
    ddp_times, fsdp_times = [], []
    for _ in range(args.rounds):
        ddp_times.append(timed(ddp, ddp_opt))
        fsdp_times.append(timed(fsdp, fsdp_opt))
    whole, shards = footprint(ddp, ddp_opt), footprint(fsdp, fsdp_opt)
    if rank == 0:
        t_ddp, t_fsdp = statistics.median(ddp_times), statistics.median(fsdp_times)
        mib = 1 << 20
        print(f"torch {torch.__version__} fully_shard: {args.model}, {world} ranks, batch {args.batch} per rank, adam, "
              f"{torch.get_num_threads()} thread(s), {args.rounds} rounds of {args.steps} steps"
              f"{'' if args.reshard else ' (no reshard)'}")
        print(f"step (median, slowest rank): ddp {t_ddp * 1e3:.2f} ms, fsdp {t_fsdp * 1e3:.2f} ms: "
              f"fsdp/ddp {t_fsdp / t_ddp:.3f}")
        print(f"per rank, parameters + gradients + optimizer state: ddp {sum(whole) / mib:.2f} MiB, "
              f"fsdp {sum(shards) / mib:.2f} MiB ({shards[0] / mib:.2f} + {shards[1] / mib:.2f} + "
              f"{shards[2] / mib:.2f})")
        print(f"samples/s: ddp {world * args.batch / t_ddp:.0f} fsdp {world * args.batch / t_fsdp:.0f}")
        sys.stdout.flush()
    dist.barrier()
    os._exit(0)  # as bench/torch_ddp.py: gloo's destructor has hung at exit


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="mlp", choices=sorted(DEFAULTS))
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--batch", type=int, default=0)
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-reshard", dest="reshard", action="store_false")
    parser.add_argument("--port", type=int, default=29611)
    args = parser.parse_args()
    batch, steps = DEFAULTS[args.model]
    args.batch = args.batch or batch
    args.steps = args.steps or steps
    mp.start_processes(run, args=(args,), nprocs=args.nproc, start_method="spawn")


if __name__ == "__main__":
    main()
