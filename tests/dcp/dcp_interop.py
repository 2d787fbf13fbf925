"""PyTorch's side of datapar's torch.distributed.checkpoint interop tests (dcp_python_test.cc).

  dcp_interop.py save DIR REF {ddp|fsdp}   2 ranks train a step and dcp.save; REF: the expected state
  dcp_interop.py load DIR REF NPROCS {ddp|fsdp}
                                           NPROCS ranks dcp.load DIR into the twin model and Adam,
                                           check them against REF (written by datapar) and the
                                           step after it; exit 0 when everything matches
  dcp_interop.py convert DIR REF            format_utils.dcp_to_torch_save, checked against REF
  dcp_interop.py accuracy DIR DATA NPROCS   NPROCS ranks dcp.load the "model." entries of a
                                           `datapar train --model mlp` checkpoint into
                                           python/datapar_models.Mlp and count right answers on
                                           DATA's test set (prints "correct K of N")

The model: Sequential(Linear(6, 8), ReLU, Linear(8, 3)), Adam(lr=0.01), loss out.pow(2).mean(),
every rank on the same batch (so DDP and FSDP steps equal one process's).
"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     get_state_dict, set_model_state_dict, set_state_dict)


def start(fn, args, nprocs):
    """The ranks as forked children: they share the modules this process imported (torch's
    import costs each spawned child 2 s, most of a test's time). Safe here: nothing ran a
    parallel region or started a thread before the fork."""
    mp.start_processes(fn, args=args, nprocs=nprocs, start_method="fork")


def model_and_optimizer(seed, kind="none"):
    torch.manual_seed(seed)
    model = wrap(torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)), kind)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)  # after fully_shard: over its DTensors


def step(model, optimizer, x):
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()


def wrap(model, kind):
    if kind == "fsdp":
        from torch.distributed.fsdp import fully_shard
        fully_shard(model)
        return model
    if kind == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    return model


def full_state(model, optimizer, distributed):
    """{"model.<name>": tensor, "optim.state.<name>.<key>": tensor}, whole, on every rank."""
    if distributed:
        options = StateDictOptions(full_state_dict=True)
        msd = get_model_state_dict(model, options=options)
        osd = get_optimizer_state_dict(model, optimizer, options=options)
    else:
        msd, osd = get_state_dict(model, optimizer)
    out = {"model." + k: v.detach().clone() for k, v in msd.items()}
    for name, state in osd["state"].items():
        for key, value in state.items():
            out["optim.state.%s.%s" % (name, key)] = value.detach().clone()
    return out


def init(rank, world, store):
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)


def finish():
    """Ends a rank once every rank is done: os._exit, not destroy_process_group and the
    interpreter's teardown, where PyTorch 2.15's gloo now and then aborts ("terminate called
    without an active exception") on a loaded machine, after the work is complete."""
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def save_rank(rank, world, store, directory, kind):
    init(rank, world, store)
    model, optimizer = model_and_optimizer(0, kind)
    torch.manual_seed(1)
    step(model, optimizer, torch.randn(5, 6))
    msd, osd = get_state_dict(model, optimizer)
    dcp.save({"model": msd, "optim": osd, "progress": {"epoch": 3, "step": 17}}, checkpoint_id=directory)
    finish()


def save(directory, ref, kind):
    store = tempfile.mktemp()
    start(save_rank, (2, store, directory, kind), 2)
    # The same in one process: what datapar must load, and the step after it.
    model, optimizer = model_and_optimizer(0)
    torch.manual_seed(1)
    step(model, optimizer, torch.randn(5, 6))
    expected = full_state(model, optimizer, False)
    x2 = torch.randn(5, 6)
    step(model, optimizer, x2)
    expected["x2"] = x2
    for name, value in model.state_dict().items():
        expected["after." + name] = value.detach().clone()
    torch.save(expected, ref)


def compare(got, want, what):
    bad = 0
    for key, value in want.items():
        if key not in got:
            print("%s: %s missing" % (what, key))
            bad += 1
        elif not torch.allclose(got[key].float(), value.float(), rtol=1e-5, atol=1e-6):
            print("%s: %s differs by %g" % (what, key, (got[key].float() - value.float()).abs().max()))
            bad += 1
    return bad


def load_rank(rank, world, store, directory, ref, kind, results):
    init(rank, world, store)
    want = torch.load(ref, weights_only=True)
    model, optimizer = model_and_optimizer(123, kind)  # other weights, all to be replaced
    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optim": osd, "progress": {"epoch": 0, "step": 0}}
    dcp.load(state, checkpoint_id=directory)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    bad = compare(full_state(model, optimizer, True), {k: v for k, v in want.items()
                                                        if k.startswith(("model.", "optim."))}, "rank %d" % rank)
    if state["progress"] != {"epoch": 3, "step": 17}:
        print("rank %d: progress %s" % (rank, state["progress"]))
        bad += 1
    step(model, optimizer, want["x2"])
    after = {"after." + k[len("model."):]: v for k, v in full_state(model, optimizer, True).items() if k.startswith("model.")}
    bad += compare(after, {k: v for k, v in want.items() if k.startswith("after.")}, "rank %d after a step" % rank)
    with open(results + str(rank), "w") as f:
        f.write(str(bad))
    finish()


def load(directory, ref, nprocs, kind):
    store = tempfile.mktemp()
    results = tempfile.mktemp()
    start(load_rank, (nprocs, store, directory, ref, kind, results), nprocs)
    bad = sum(int(open(results + str(r)).read()) for r in range(nprocs))
    print("dcp_interop load: %d mismatches on %d ranks (%s)" % (bad, nprocs, kind))
    return 0 if bad == 0 else 1


def convert(directory, ref):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    out = tempfile.mktemp()
    dcp_to_torch_save(directory, out)
    whole = torch.load(out, weights_only=False)
    got = {"model." + k: v for k, v in whole["model"].items()}
    for name, state in whole["optim"]["state"].items():
        for key, value in state.items():
            got["optim.state.%s.%s" % (name, key)] = value
    want = torch.load(ref, weights_only=True)
    bad = compare(got, {k: v for k, v in want.items() if k.startswith(("model.", "optim."))}, "dcp_to_torch_save")
    if whole["progress"] != {"epoch": 3, "step": 17} or whole["optim"]["param_groups"][0]["lr"] != 0.01:
        print("dcp_to_torch_save: progress %s, param_groups %s" % (whole["progress"], whole["optim"]["param_groups"]))
        bad += 1
    print("dcp_interop convert: %d mismatches" % bad)
    return 0 if bad == 0 else 1


def test_set(data):
    import gzip

    def read(name, header):
        path = os.path.join(data, name)
        opener = gzip.open if not os.path.exists(path) else open
        with opener(path if os.path.exists(path) else path + ".gz", "rb") as f:
            return f.read()[header:]

    images = torch.frombuffer(bytearray(read("t10k-images-idx3-ubyte", 16)), dtype=torch.uint8)
    labels = torch.frombuffer(bytearray(read("t10k-labels-idx1-ubyte", 8)), dtype=torch.uint8).long()
    return images.reshape(-1, 1, 28, 28).float() / 255, labels  # datapar train: scaled to [0, 1]


def accuracy_rank(rank, world, store, directory, data, results):
    init(rank, world, store)
    import datapar_models
    model = datapar_models.Mlp()
    wrapped = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    state = {"model": get_model_state_dict(wrapped)}
    dcp.load(state, checkpoint_id=directory)
    set_model_state_dict(wrapped, state["model"])
    images, labels = test_set(data)
    model.eval()
    with torch.no_grad():
        correct = int((model(images).argmax(1) == labels).sum())
    with open(results + str(rank), "w") as f:
        f.write("%d %d" % (correct, len(labels)))
    finish()


def accuracy(directory, data, nprocs):
    store = tempfile.mktemp()
    results = tempfile.mktemp()
    start(accuracy_rank, (nprocs, store, directory, data, results), nprocs)
    answers = {open(results + str(r)).read() for r in range(nprocs)}
    if len(answers) != 1:
        print("dcp_interop accuracy: the ranks disagree: %s" % answers)
        return 1
    correct, total = answers.pop().split()
    print("correct %s of %s" % (correct, total))
    return 0


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "save":
        save(sys.argv[2], sys.argv[3], sys.argv[4])
    elif mode == "load":
        sys.exit(load(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]))
    elif mode == "accuracy":
        sys.exit(accuracy(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    elif mode == "convert":
        sys.exit(convert(sys.argv[2], sys.argv[3]))
    else:
        sys.exit("unknown mode " + mode)
