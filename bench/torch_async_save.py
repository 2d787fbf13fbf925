"""PyTorch's side of bench/async_save_ab.sh: dcp.save, then dcp.async_save with training steps
for as long as it is in flight, as bench/async_save_bench.cc (the same models, batches, Adam,
2 ranks: processes, gloo, a file store; the async save's exchanges on a gloo group of its own).

  torch_async_save.py DIR [--model resnet18|mlp] [--rounds 3] [--ranks 2]
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import get_state_dict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import datapar_models  # noqa: E402


def slowest(seconds):
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def make_job(name):
    if name == "mlp":  # datapar's Mlp({1024, 8192, 8192, 8192, 10}): 143 M parameters
        sizes = [1024, 8192, 8192, 8192, 10]
        layers = []
        for i in range(len(sizes) - 1):
            layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
            if i + 2 < len(sizes):
                layers.append(torch.nn.ReLU())
        return torch.nn.Sequential(*layers), torch.randn(8, 1024)
    return datapar_models.resnet18(10, 1), torch.randn(32, 1, 28, 28)


def rank_main(rank, ranks, directory, model_name, rounds):
    dist.init_process_group("gloo", init_method="file://" + directory + "/store", rank=rank, world_size=ranks)
    saver_group = dist.new_group(backend="gloo")  # as PyTorch advises for async_save
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, x = make_job(model_name)
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        adam.zero_grad()
        model(x).pow(2).mean().backward()
        adam.step()

    step()
    syncs, blocked, writes, paces, during = [], [], [], [], []
    for r in range(rounds):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(3):
            step()
        alone = (time.perf_counter() - start) / 3
        msd, osd = get_state_dict(model, adam)
        dist.barrier()
        start = time.perf_counter()
        dcp.save({"model": msd, "optim": osd}, checkpoint_id="%s/sync%d" % (directory, r))
        syncs.append(slowest(time.perf_counter() - start))
        msd, osd = get_state_dict(model, adam)
        dist.barrier()
        start = time.perf_counter()
        future = dcp.async_save({"model": msd, "optim": osd}, checkpoint_id="%s/async%d" % (directory, r),
                                process_group=saver_group)
        blocked_for = time.perf_counter() - start
        steps, stepping = 0, 0.0
        while not future.done():
            s = time.perf_counter()
            step()
            stepping += time.perf_counter() - s
            steps += 1
        future.result()
        written = time.perf_counter() - start
        blocked.append(slowest(blocked_for))
        writes.append(slowest(written))
        pace = alone / (stepping / steps) if steps else 1.0
        paces.append(-slowest(-pace))
        during.append(steps)
        dist.barrier()
    if rank == 0:
        os.write(1, ("torch dcp, %d ranks, %s + adam: sync save %.1f ms; async save blocked %.1f ms (%.3f of sync), "
                     "written in %.1f ms; training pace during the write %.3f of without (%.0f steps) "
                     "(medians of %d, slowest rank)\n" %
                     (ranks, model_name, statistics.median(syncs) * 1e3, statistics.median(blocked) * 1e3,
                      statistics.median(blocked) / statistics.median(syncs), statistics.median(writes) * 1e3,
                      statistics.median(paces), statistics.median(during), rounds)).encode())
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--model", default="resnet18", choices=["resnet18", "mlp"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2)
    a = parser.parse_args()
    mp.spawn(rank_main, args=(a.ranks, a.dir, a.model, a.rounds), nprocs=a.ranks)
