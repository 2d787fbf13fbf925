"""PyTorch's DistributedDataParallel on gloo, measured the way `datapar bench ddp` measures
datapar: the same models, batches, thread count and phases (local steps without
synchronisation, DDP steps, the gradient buckets' all-reduces alone), the slowest rank's
time per step, each training phase's step parts (median forward, backward, optimizer step)
and CPU time (the training thread's, the other threads').

    /usr/bin/python3 bench/torch_ddp.py --model mlp --nproc 2 [--gradient-as-bucket-view] [--powersgd 4:2]

One rank of a job on several hosts (bench/ddp_link.sh; gloo's interface from GLOO_SOCKET_IFNAME):

    python3 bench/torch_ddp.py --nproc 2 --rank R --master ADDR:PORT ...
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

DEFAULTS = {"mlp": (64, 200), "lenet": (128, 50), "resnet18": (32, 10)}  # batch per rank, steps


def make_model(name):
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                             nn.Linear(512, 10))
    if name == "lenet":  # d2l's LeNet
        return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.Sigmoid(), nn.AvgPool2d(2, 2),
                             nn.Conv2d(6, 16, 5), nn.Sigmoid(), nn.AvgPool2d(2, 2), nn.Flatten(),
                             nn.Linear(400, 120), nn.Sigmoid(), nn.Linear(120, 84), nn.Sigmoid(), nn.Linear(84, 10))
    import datapar_models  # python/datapar_models.py: the PyTorch twins of datapar's models
    return datapar_models.ResNet18()


def time_steps(warmup, steps, step, parts=None):
    """Per step, the slowest rank's: [wall, forward, backward, optimizer, CPU training
    thread, CPU other threads] (parts: medians, when the step records them)."""
    for i in range(warmup):
        step(i)
    if parts is not None:
        for v in parts.values():
            v.clear()
    dist.barrier()
    thread_start, process_start = time.thread_time(), time.process_time()
    start = time.perf_counter()
    for i in range(steps):
        step(i)
    elapsed = time.perf_counter() - start
    thread_cpu, process_cpu = time.thread_time() - thread_start, time.process_time() - process_start
    medians = [statistics.median(parts[k]) if parts else 0.0 for k in ("forward", "backward", "optimizer")]
    t = torch.tensor([elapsed / steps] + medians + [thread_cpu / steps, (process_cpu - thread_cpu) / steps],
                     dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def run(rank, args):
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=rank, world_size=args.nproc)
    world = args.nproc
    g = torch.Generator().manual_seed(100 + rank)
    batches = [(torch.randn(args.batch, 1, 28, 28, generator=g), torch.randint(10, (args.batch,), generator=g))
               for _ in range(4)]

    def train_step(model, opt, parts, i):
        x, y = batches[i % len(batches)]
        opt.zero_grad()
        start = time.perf_counter()
        out = model(x)
        parts["forward"].append(time.perf_counter() - start)
        start = time.perf_counter()
        F.cross_entropy(out, y).backward()
        parts["backward"].append(time.perf_counter() - start)
        start = time.perf_counter()
        opt.step()
        parts["optimizer"].append(time.perf_counter() - start)

    local_parts = {"forward": [], "backward": [], "optimizer": []}
    ddp_parts = {"forward": [], "backward": [], "optimizer": []}
    torch.manual_seed(0)
    local = make_model(args.model)
    local_opt = torch.optim.SGD(local.parameters(), lr=0.01)
    local_times = time_steps(args.warmup, args.steps, lambda i: train_step(local, local_opt, local_parts, i),
                             local_parts)

    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(make_model(args.model),
                                              gradient_as_bucket_view=args.gradient_as_bucket_view)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    ddp_times = time_steps(args.warmup, args.steps, lambda i: train_step(ddp, opt, ddp_parts, i), ddp_parts)
    t_local, t_ddp = local_times[0], ddp_times[0]

    # The same bytes as DDP's buckets (25 MB cap, 1 MB first), all-reduced alone.
    sizes, current, cap = [], 0, 1 << 20
    for p in reversed(list(ddp.parameters())):
        current += p.numel()
        if current * 4 >= cap:
            sizes.append(current)
            current, cap = 0, 25 << 20
    if current:
        sizes.append(current)
    flats = [torch.zeros(n) for n in sizes]

    def comm(_):
        works = [dist.all_reduce(f, async_op=True) for f in flats]
        for w in works:
            w.wait()

    t_comm = time_steps(args.warmup, args.steps, comm)[0]
    hook_line = None
    if args.powersgd:  # PyTorch's powerSGD_hook, as `datapar bench ddp --comm-hook powersgd:RANK:START`
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
        approx_rank, start = (int(v) for v in args.powersgd.split(":"))
        torch.manual_seed(0)
        hooked = nn.parallel.DistributedDataParallel(make_model(args.model))
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=approx_rank,
                                       start_powerSGD_iter=start)
        hooked.register_comm_hook(state, powersgd.powerSGD_hook)
        hooked_opt = torch.optim.SGD(hooked.parameters(), lr=0.01)
        hooked_parts = {"forward": [], "backward": [], "optimizer": []}
        rounds = []
        for _ in range(2):  # the first round's warmup starts the compression
            before, iters = state.total_numel_after_compression, state.iter
            rounds.append(time_steps(args.warmup, args.steps,
                                     lambda i: train_step(hooked, hooked_opt, hooked_parts, i), hooked_parts)[0])
        per_step = (state.total_numel_after_compression - before) / (state.iter - iters) * 4
        whole = sum(p.numel() for p in hooked.parameters()) * 4
        hook_line = (f"comm hook powersgd:{args.powersgd}: step {rounds[-1] * 1e3:.2f} ms against plain DDP's "
                     f"{ddp_times[0] * 1e3:.2f} ms ({rounds[-1] / ddp_times[0]:.3f}); gradient bytes each rank "
                     f"all-reduces per step: {per_step:.0f} against {whole} (1/{whole / per_step:.1f})")
    if rank == 0:
        hidden = max(0.0, min(1.0, 1 - (t_ddp - t_local) / t_comm)) if world > 1 else 0.0
        print(f"torch {torch.__version__} DDP: model {args.model}, backend gloo, {world} process(es) x "
              f"{torch.get_num_threads()} thread(s), batch {args.batch} per rank, {args.steps} steps"
              f"{', gradient_as_bucket_view' if args.gradient_as_bucket_view else ''}")
        print(f"local step (no synchronisation): {t_local * 1e3:.2f} ms, {world * args.batch / t_local:.0f} "
              f"samples/s over all ranks (the ceiling)")
        print(f"ddp step: {t_ddp * 1e3:.2f} ms ({t_local / t_ddp:.2f} of the ceiling)")
        print(f"all-reduce of the gradients alone: {t_comm * 1e3:.2f} ms ({len(flats)} buckets, "
              f"{sum(sizes) * 4 / 1e6:.2f} MB)")
        print(f"all-reduce time hidden behind backward: {hidden * 100:.0f}%")
        for name, t in (("local", local_times), ("ddp", ddp_times)):
            print(f"{name} step parts (medians): forward {t[1] * 1e3:.2f} ms, backward {t[2] * 1e3:.2f} ms, "
                  f"optimizer {t[3] * 1e3:.2f} ms; CPU per step: training thread {t[4] * 1e3:.2f} ms, "
                  f"other threads {t[5] * 1e3:.2f} ms")
        if hook_line:
            print(hook_line)
        print(f"samples/s: {world * args.batch / t_ddp:.0f}")
    # torch 1.13's gloo group sometimes hangs in its destructor at exit (seen here twice, for
    # 10 minutes, after the results were printed): meet once more, then leave at once.
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="mlp", choices=sorted(DEFAULTS))
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--batch", type=int, default=0)
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--gradient-as-bucket-view", action="store_true",
                        help="DistributedDataParallel(gradient_as_bucket_view=True): no gradient copies")
    parser.add_argument("--port", type=int, default=0, help="store port (default: a free one)")
    parser.add_argument("--rank", type=int, default=-1,
                        help="run this one rank of --nproc, the store at --master (no processes spawned)")
    parser.add_argument("--master", default="", metavar="ADDR:PORT", help="rank 0's store, with --rank")
    parser.add_argument("--powersgd", default="", metavar="RANK:START",
                        help="also time DDP with PyTorch's powerSGD_hook (START at most --warmup), with its bytes")
    args = parser.parse_args()
    batch, steps = DEFAULTS[args.model]
    args.batch = args.batch or batch
    args.steps = args.steps or steps
    if args.rank >= 0:
        if not args.master:
            parser.error("--rank needs --master ADDR:PORT")
        run(args.rank, args)
        return
    if not args.port:
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            args.port = s.getsockname()[1]
    args.master = f"127.0.0.1:{args.port}"
    mp.spawn(run, args=(args,), nprocs=args.nproc)


if __name__ == "__main__":
    main()
