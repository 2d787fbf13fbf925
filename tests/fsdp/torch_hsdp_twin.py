"""PyTorch 2.15's HSDP, fully_shard on a (replicate 2, shard 2) device mesh over gloo, on
tests/testing/fsdp_net.h's model and data, hsdp_torch_test.cc's initialisation: 4 ranks (processes), 20 steps of SGD
with momentum, each Linear of the Sequential a unit and the root the rest. Rank 0 writes the
full model state dict at the end (torch.save), which the C++ side compares with its own.

    python3 torch_hsdp_twin.py INIT.pt OUT.pt RENDEZVOUS_FILE
"""
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

STEPS = 20


class Net(nn.Module):  # tests/testing/fsdp_net.h's FsdpNetImpl, the same names
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 20), nn.Tanh())
        self.head = nn.Linear(20, 5)

    def forward(self, x):
        return self.head(self.blocks(x))


def batch(r, step):  # rank r's 3 + r rows at `step`, as the C++ side computes them
    rows = torch.arange(10 * (3 + r), dtype=torch.float64).view(3 + r, 10)
    return torch.sin(rows * (0.1 * (r + 1)) + step).float()


def run(rank, init, out, rendezvous):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=4)
    model = Net()
    model.load_state_dict(torch.load(init))
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    for unit in (model.blocks[0], model.blocks[2]):
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        sgd.zero_grad()
        model(batch(rank, step)).pow(2).mean().backward()
        sgd.step()
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in state.items()}, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    # Forked: the children share this process's import of torch (2 s each when spawned).
    mp.start_processes(run, args=(sys.argv[1], sys.argv[2], sys.argv[3]), nprocs=4, start_method="fork")
