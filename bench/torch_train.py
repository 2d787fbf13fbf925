"""The PyTorch peer of

    datapar launch --nproc-per-node 2 -- datapar train --mode ddp --model lenet \
        --data DIR --epochs 1 --batch-size B --lr LR --seed S

doing the same work the same way (tools/datapar/train.cc):
- d2l's LeNet (python/datapar_models.py, the twin of datapar::models::LeNet), built after
  torch.manual_seed(seed), then Xavier-uniform on every Conv2d and Linear weight (biases
  keep PyTorch's default initialisation), as datapar's xavier_init: the same values as
  datapar's (see datapar_lenet);
- plain SGD (momentum 0 unless --momentum), mean cross-entropy, DistributedDataParallel
  on gloo (default buckets), one process per rank (started as torchrun would), `--threads`
  intra-op threads each;
- the global batch split evenly: every rank takes batch / world size per step;
- DistributedSampler(shuffle=True, seed) with set_epoch(epoch): the same permutation and
  per-rank lists as datapar's sampler (no drop_last; wrap padding); a torch DataLoader with
  `--workers` worker processes (datapar: the same number of loader threads), last batch
  kept;
- Fashion-MNIST read from the gz (or plain) IDX files with gzip + numpy, scaled to [0, 1]
  (datapar does not normalise either); --limit N takes the first N train and test samples;
- the epoch's time is the span datapar reports: from just after the loader's epoch started
  (iter(loader)) to the end of the last step, the slowest rank's (all-reduce max); the
  training loss and accuracy are summed over ranks;
- test accuracy exact over the whole test set: DistributedSampler(shuffle=False), padding
  positions skipped, counts all-reduced.

Also datapar's MLP (--model mlp: datapar_models.Mlp after torch.manual_seed(seed), PyTorch's
default initialisation, as datapar's), d2l's ResNet-18 (--model resnet18: datapar_models.resnet18, weights of every Conv2d and
Linear from N(0, 0.01^2) after torch.manual_seed(seed), as datapar's d2l_init), on CUDA
(--device cuda: rank r on cuda:r, batches copied there; DDP still over gloo, which moves CUDA
tensors too), and with --mode single (--nproc 1): the bare model, no DDP, as `datapar train
--mode single`.

Rank 0 prints one line per epoch and a `metrics {json}` line with datapar's --metrics keys
(and writes them to --metrics FILE as JSON lines), so bench/compare_train.py reads both
tools alike.

    /usr/bin/python3 bench/torch_train.py --data /work/shared/datasets/fashion-mnist \
        --epochs 1 --batch-size 256 --lr 0.9 --seed 0
"""
import argparse
import gzip
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
import datapar_models  # noqa: E402  (PyTorch twins of datapar's C++ models)


def read_idx(root, name, magic, header):
    """The IDX file `name` (or `name`.gz) under root as a uint8 array, header checked."""
    for path, opener in ((os.path.join(root, name), open), (os.path.join(root, name + ".gz"), gzip.open)):
        if os.path.exists(path):
            with opener(path, "rb") as f:
                raw = f.read()
            break
    else:
        sys.exit(f"torch_train.py: {name}[.gz] not found in {root}")
    dims = np.frombuffer(raw, dtype=">u4", count=header // 4)
    if dims[0] != magic:
        sys.exit(f"torch_train.py: {path}: magic {dims[0]:#x}, expected {magic:#x}")
    data = np.frombuffer(raw, dtype=np.uint8, offset=header)
    return data.reshape([int(d) for d in dims[1:]])


def load_split(root, train, limit):
    split = "train" if train else "t10k"
    images = read_idx(root, f"{split}-images-idx3-ubyte", 0x803, 16)
    labels = read_idx(root, f"{split}-labels-idx1-ubyte", 0x801, 8)
    if limit > 0:
        images, labels = images[:limit], labels[:limit]
    x = torch.from_numpy(images.copy()).unsqueeze(1).to(torch.float32).div_(255.0)  # (N, 1, 28, 28)
    y = torch.from_numpy(labels.astype(np.int64))
    return TensorDataset(x, y)


class Batched(Dataset):
    """--loader batch: the dataset indexed by a whole list of indices at once (one
    index_select per batch, as datapar's loader does) instead of per sample + collate."""

    def __init__(self, tensors):
        self.x, self.y = tensors.tensors

    def __len__(self):
        return len(self.x)

    def __getitem__(self, indices):
        index = torch.as_tensor(indices, dtype=torch.long)
        return self.x.index_select(0, index), self.y.index_select(0, index)


def make_loader(data, sampler, batch, workers, batched):
    if not batched:  # the usual script: per-sample __getitem__ and default_collate in the workers
        return DataLoader(data, batch_size=batch, sampler=sampler, num_workers=workers)
    batches = torch.utils.data.BatchSampler(sampler, batch_size=batch, drop_last=False)
    return DataLoader(Batched(data), batch_size=None, sampler=batches, num_workers=workers)


def datapar_lenet(seed):
    """d2l's LeNet initialised exactly as datapar's is after torch::manual_seed(seed): both
    build their layers in definition order (each drawing its default initialisation), then
    Xavier redraws every weight (the biases keep their default draws)."""
    torch.manual_seed(seed)
    net = datapar_models.LeNet()
    xavier_init(net)
    return net


def datapar_resnet18(seed):
    """d2l's ResNet-18 initialised as datapar's: default draws in definition order, then
    N(0, 0.01^2) on every Conv2d and Linear weight (tools/datapar/train.cc, d2l_init)."""
    torch.manual_seed(seed)
    net = datapar_models.resnet18()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                m.weight.normal_(0, 0.01)
    return net


def datapar_mlp(seed):
    """datapar's MLP (784-512-512-10) after torch::manual_seed(seed): default draws only."""
    torch.manual_seed(seed)
    return datapar_models.Mlp()


def xavier_init(model):
    """datapar's xavier_init: Xavier-uniform on Conv2d and Linear weights, in module order."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_uniform_(m.weight)


def evaluate(model, test, rank, world, batch, workers, batched, device):
    """Exact test accuracy over all ranks: (correct, samples) summed over the job."""
    model.eval()
    sampler = DistributedSampler(test, num_replicas=world, rank=rank, shuffle=False)
    loader = make_loader(test, sampler, batch, workers, batched)
    correct = samples = position = 0
    n = len(test)
    with torch.no_grad():
        for x, y in loader:
            rows = x.shape[0]
            # Position p of this rank's list is position rank + p * world of the padded list.
            real = (torch.arange(position, position + rows) * world + rank) < n
            position += rows
            predicted = model(x.to(device)).argmax(1).cpu()
            correct += int(predicted.eq(y).logical_and(real).sum())
            samples += int(real.sum())
    counts = torch.tensor([correct, samples], dtype=torch.int64)
    dist.all_reduce(counts, op=dist.ReduceOp.SUM)
    return int(counts[0]), int(counts[1])


def run(rank, args):
    world = args.nproc
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world)
    if args.batch_size % world:
        sys.exit(f"--batch-size {args.batch_size} does not split evenly over {world} ranks")
    rank_batch = args.batch_size // world
    train, test = load_split(args.data, True, args.limit), load_split(args.data, False, args.limit)
    device = torch.device(f"cuda:{rank}" if args.device == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if rank == 0:
        print(f"torch {torch.__version__} train: {args.model}, {args.mode} (gloo) on {world} processes x "
              f"{torch.get_num_threads()} thread(s), batch {args.batch_size} ({rank_batch} per rank), lr {args.lr:g}, "
              f"{len(train)} train / {len(test)} test samples ({args.data}), DataLoader with {args.workers} "
              f"worker(s), {args.loader} fetch", flush=True)

    net = {"mlp": datapar_mlp, "lenet": datapar_lenet, "resnet18": datapar_resnet18}[args.model](args.seed).to(device)
    model = nn.parallel.DistributedDataParallel(net) if args.mode == "ddp" else net
    sgd = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)

    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = make_loader(train, sampler, rank_batch, args.workers, args.loader == "batch")
    out = open(args.metrics, "w") if rank == 0 and args.metrics else None
    for epoch in range(args.epochs):
        model.train()
        sampler.set_epoch(epoch)
        batches = iter(loader)  # the epoch's workers start here (datapar: loader.start_epoch)
        loss_sum, correct, rows, wait = 0.0, 0, 0, 0.0
        start = time.perf_counter()
        while True:
            t = time.perf_counter()
            try:
                x, y = next(batches)
            except StopIteration:
                break
            wait += time.perf_counter() - t
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            sgd.zero_grad()
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            loss.backward()
            sgd.step()
            loss_sum += loss.item() * x.shape[0]
            correct += int(logits.argmax(1).eq(y).sum())
            rows += x.shape[0]
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the epoch ends when its last kernel has
        times = torch.tensor([time.perf_counter() - start, wait], dtype=torch.float64)
        sums = torch.tensor([loss_sum, float(correct), float(rows)], dtype=torch.float64)
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)  # the epoch lasts as long as its slowest rank

        eval_start = time.perf_counter()
        test_correct, test_samples = evaluate(model, test, rank, world, rank_batch, args.workers,
                                              args.loader == "batch", device)
        eval_seconds = time.perf_counter() - eval_start
        if rank != 0:
            continue
        train_samples = int(sums[2])
        m = {
            "epoch": epoch + 1, "epochs": args.epochs,
            "train_loss": float(sums[0]) / train_samples, "train_accuracy": float(sums[1]) / train_samples,
            "test_accuracy": test_correct / test_samples if test_samples else 0.0,
            "test_correct": test_correct, "test_samples": test_samples, "train_samples": train_samples,
            "seconds": float(times[0]), "samples_per_second": train_samples / float(times[0]),
            "eval_seconds": eval_seconds, "data_wait_seconds": float(times[1]),
            "data_wait_share": float(times[1]) / float(times[0]),
            "model": args.model, "mode": args.mode, "world_size": world, "batch_size": args.batch_size, "lr": args.lr,
        }
        print(f"epoch {m['epoch']}/{m['epochs']}  loss {m['train_loss']:.3f}  train acc {m['train_accuracy']:.3f}  "
              f"test acc {m['test_accuracy']:.3f} ({test_correct}/{test_samples})  {m['seconds']:.1f} s  "
              f"{m['samples_per_second']:.0f} samples/s  eval {eval_seconds:.1f} s  "
              f"data wait {100 * m['data_wait_share']:.2f}%", flush=True)
        print("metrics " + json.dumps(m, sort_keys=True), flush=True)
        if out:
            out.write(json.dumps(m, sort_keys=True) + "\n")
            out.flush()
    if out:
        out.close()
    dist.barrier()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "datasets", "fashion-mnist"),
                        help="directory with the Fashion-MNIST IDX files (.gz or plain)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=256, help="global batch, split evenly over the ranks")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=0, help="first N train and N test samples (0: all)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--model", choices=["mlp", "lenet", "resnet18"], default="lenet")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: rank r trains on cuda:r")
    parser.add_argument("--mode", choices=["ddp", "single"], default="ddp",
                        help="single (--nproc 1): the bare model without DDP, as datapar train --mode single")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes per rank")
    parser.add_argument("--loader", choices=["sample", "batch"], default="sample",
                        help="sample: the usual per-sample Dataset + collate; batch: one index_select per batch")
    parser.add_argument("--metrics", default="", help="rank 0 writes one JSON line per epoch here")
    parser.add_argument("--port", type=int, default=0, help="store port (default: a free one)")
    parser.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)  # set for the ranks it starts
    args = parser.parse_args()
    if not os.path.isdir(args.data):
        sys.exit(f"--data {args.data}: no such directory")
    if args.mode == "single" and args.nproc != 1:
        sys.exit(f"--mode single trains one process: give --nproc 1, not {args.nproc}")
    if args.device == "cuda" and torch.cuda.device_count() < args.nproc:
        sys.exit(f"--device cuda --nproc {args.nproc}: torch sees {torch.cuda.device_count()} CUDA device(s)")
    if args.rank >= 0:  # one rank, started below
        run(args.rank, args)
        return
    if not args.port:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            args.port = s.getsockname()[1]
    # One fresh interpreter per rank, as torchrun (and datapar launch) start them, not
    # torch.multiprocessing.spawn: its children default to the "spawn" start method, so
    # every DataLoader worker would start a new interpreter, import torch and unpickle
    # the whole dataset each epoch; a script under torchrun forks its workers.
    ranks = [subprocess.Popen([sys.executable, os.path.abspath(__file__)] + sys.argv[1:] +
                              ["--port", str(args.port), "--rank", str(r)]) for r in range(args.nproc)]
    first_done = None
    while any(p.poll() is None for p in ranks):
        failed = any(p.poll() for p in ranks)  # a rank failed: the others would wait for it
        if first_done is None and any(p.poll() == 0 for p in ranks):
            first_done = time.monotonic()
        # Once a rank has finished cleanly, the others have nothing left but shutting down;
        # one was seen hanging there once (rank 0 in a futex wait after rank 1 had exited).
        stuck = first_done is not None and time.monotonic() - first_done > 60
        if failed or stuck:
            for p in ranks:
                if p.poll() is None:
                    print(f"torch_train.py: stopping rank {ranks.index(p)} "
                          f"({'another rank failed' if failed else 'still running 60 s after another finished'})",
                          file=sys.stderr, flush=True)
                    p.terminate()
        time.sleep(0.2)
    sys.exit(next((p.returncode for p in ranks if p.returncode), 0))


if __name__ == "__main__":
    main()
