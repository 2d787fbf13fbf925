#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into fuzz/corpus/<target>/.

Run with a Python that has torch (Debian's /usr/bin/python3 has 1.13): real files as
PyTorch writes them, so the fuzzers start from inputs that reach deep into each reader.
    python3 fuzz/make_seeds.py
"""
import gzip
import io
import os
import struct
import zipfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def out(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def saved(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def records(file_bytes):
    """(data.pkl, [storage record sizes in key order]) of a torch.save file."""
    with zipfile.ZipFile(io.BytesIO(file_bytes)) as z:
        pkl = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        prefix = pkl[: -len("data.pkl")]
        sizes = {}
        for n in z.namelist():
            if n.startswith(prefix + "data/"):
                sizes[int(n[len(prefix) + 5:])] = z.getinfo(n).file_size
        return z.read(pkl), [sizes[k] for k in sorted(sizes)]


def checkpoint():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    return {
        "format": "datapar.checkpoint/1",
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "epoch": 3,
        "progress": {"seed": 0, "consumed_samples": 12},
        "rng": {"cpu": torch.get_rng_state()[:16].clone(), "cuda": []},
    }


def main():
    torch.manual_seed(0)
    objects = {
        "state_dict": torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)).state_dict(),
        "checkpoint": checkpoint(),
        "containers": {"a": [1, -2, 70000, 1 << 40], "b": (0.5, True, None, "text"), 3: {"x": []}},
        "views": {"w": torch.arange(12.0).view(3, 4), "t": torch.arange(12.0).view(3, 4).t()[1:]},
        "dtypes": {str(t): torch.ones(2, dtype=t) for t in (torch.float64, torch.int64, torch.uint8, torch.bool, torch.float16)},
    }
    for name, obj in objects.items():
        pkl, sizes = records(saved(obj))
        out("pickle", name, pkl)
        # checkpoint_fuzz: even first byte = a whole file; odd = record sizes and a data.pkl.
        out("checkpoint", name + ".file", b"\x00" + saved(obj))
        if len(sizes) < 8 and all(s < 65536 for s in sizes):
            header = bytes([1, len(sizes)]) + b"".join(struct.pack("<H", s) for s in sizes)
            out("checkpoint", name + ".pkl", header + pkl)

    # Floods of empty containers in one list, appended 1000 at a time as Python's pickler
    # does (issue 27: 4 million empty dicts in 9 MB cost 2.3 GB before the memory budget).
    for kind, one in (("dicts", b"}"), ("lists", b"]"), ("tuples", b")")):
        out("pickle", "flood-" + kind, b"\x80\x02]" + (b"(" + one * 1000 + b"e") * 3 + b".")

    # idx_fuzz: first byte = ndims (bit 0: 3, else 1) and a sample limit (bits 1-3).
    images = struct.pack(">IIII", 0x803, 3, 4, 4) + bytes(range(48))
    labels = struct.pack(">II", 0x801, 3) + bytes([0, 9, 4])
    out("idx", "images", b"\x01" + images)
    out("idx", "images.gz", b"\x01" + gzip.compress(images, mtime=0))
    out("idx", "images.limit2", bytes([1 | (2 << 1)]) + images)
    out("idx", "labels", b"\x00" + labels)
    out("idx", "labels.gz", b"\x00" + gzip.compress(labels, mtime=0))
    out("idx", "labels.short", b"\x00" + labels[:-1])


if __name__ == "__main__":
    main()
