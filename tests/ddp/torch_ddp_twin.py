"""PyTorch's own DistributedDataParallel on a scenario of tests/testing/ddp_scenarios.h.

The PyTorch twin of ddp_probe: the same ProbeNet (seeded like datapar's), the same batches
(each step's rows drawn from one generator seeded 1000 + 10 * step, rank after rank), SGD
with lr 0.1 and momentum 0.9, two processes on gloo. Rank 0 saves the final state dict, which
tests/ddp/ddp_test.cc compares with datapar's DDP.

Usage: torch_ddp_twin.py SCENARIO OUT_FILE   (scenarios: even, one_bucket)
"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
STEPS = 5
ROWS = 8  # per rank and step, as scenario("even") and scenario("one_bucket")


class ProbeNet(torch.nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.fc1 = torch.nn.Linear(20, hidden)
        self.fc2 = torch.nn.Linear(hidden, 5)
        self.extra = torch.nn.Linear(20, 5)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))) + self.extra(x)


def worker(rank, init_file, scenario, out_file):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=WORLD)
    torch.manual_seed(1)
    model = ProbeNet()
    bucket_cap_mb = 25 if scenario == "one_bucket" else 0.004
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(1000 + 10 * step)
        x = torch.randn(ROWS * WORLD, 20, generator=gen)
        y = torch.randint(5, (ROWS * WORLD,), generator=gen)
        mine = slice(rank * ROWS, (rank + 1) * ROWS)
        sgd.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x[mine]), y[mine]).backward()
        sgd.step()
    if rank == 0:
        torch.save(model.state_dict(), out_file)
    dist.destroy_process_group()


def main():
    scenario, out_file = sys.argv[1], sys.argv[2]
    assert scenario in ("even", "one_bucket"), scenario
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        # Forked: the children share this process's import of torch (2 s each when spawned).
        mp.start_processes(worker, args=(os.path.join(d, "init"), scenario, out_file), nprocs=WORLD,
                           start_method="fork")


if __name__ == "__main__":
    main()
