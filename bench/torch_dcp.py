"""PyTorch's side of bench/dcp_ab.sh: dcp.save and dcp.load of ResNet-18 (python/datapar_models,
datapar's twin) + Adam state with 2 ranks (processes, gloo, a file store), as bench/dcp_bench.cc.

  torch_dcp.py DIR [--rounds 5] [--ranks 2]
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
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import datapar_models  # noqa: E402


def slowest(seconds):
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def make():
    model = torch.nn.parallel.DistributedDataParallel(datapar_models.resnet18(10, 1))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def rank_main(rank, ranks, directory, rounds):
    dist.init_process_group("gloo", init_method="file://" + directory + "/store", rank=rank, world_size=ranks)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, adam = make()
    adam.zero_grad()
    model(torch.randn(8, 1, 96, 96)).sum().backward()
    adam.step()
    saves, loads, written = [], [], 0
    for r in range(rounds):
        ck = "%s/ck%d" % (directory, r)
        msd, osd = get_state_dict(model, adam)
        dist.barrier()
        start = time.perf_counter()
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=ck)
        saves.append(slowest(time.perf_counter() - start))
        path = "%s/__%d_0.distcp" % (ck, rank)
        written = os.path.getsize(path) if os.path.exists(path) else 0
        fresh, fresh_adam = make()
        fmsd, fosd = get_state_dict(fresh, fresh_adam)  # outside the time, as datapar's dcp::add_optimizer
        dist.barrier()
        start = time.perf_counter()
        dcp.load({"model": fmsd, "optim": fosd}, checkpoint_id=ck)
        set_state_dict(fresh, fresh_adam, model_state_dict=fmsd, optim_state_dict=fosd)
        loads.append(slowest(time.perf_counter() - start))
    os.write(1, ("rank %d wrote %.2f MiB\n" % (rank, written / 1048576.0)).encode())  # one write: no interleaving
    dist.barrier()
    if rank == 0:
        os.write(1, ("torch dcp, %d ranks, resnet18 + adam: save %.1f ms, load %.1f ms (median of %d, slowest rank)\n" %
                     (ranks, statistics.median(saves) * 1e3, statistics.median(loads) * 1e3, rounds)).encode())
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ranks", type=int, default=2)
    a = parser.parse_args()
    mp.spawn(rank_main, args=(a.ranks, a.dir, a.rounds), nprocs=a.ranks)
