#!/usr/bin/env python3
"""Writes the small Fashion-MNIST subset that datapar ships in data/fashion-mnist/.

The subset is the first 6000 training and the first 1000 test images with their labels,
in the original IDX format and file names, gzip-compressed. It needs only the standard
library (gzip, struct), so it runs under any python3. The output is byte-for-byte
reproducible: the gzip headers carry no file name and a zero timestamp.

Usage: python3 scripts/make_fashion_mnist_subset.py [SOURCE_DIR] [OUT_DIR]
  SOURCE_DIR  the four original .gz files (default: ../shared/datasets/fashion-mnist)
  OUT_DIR     where to write (default: data/fashion-mnist)
"""
import gzip
import io
import os
import struct
import sys

IMAGES_MAGIC = 0x00000803  # unsigned byte, 3 dimensions
LABELS_MAGIC = 0x00000801  # unsigned byte, 1 dimension
COUNTS = {"train": 6000, "t10k": 1000}


def read_idx(path, magic, ndims):
    with gzip.open(path, "rb") as f:
        data = f.read()
    header = 4 * (1 + ndims)
    got_magic, *dims = struct.unpack(">%dI" % (1 + ndims), data[:header])
    if got_magic != magic:
        sys.exit("%s: magic 0x%08x, expected 0x%08x" % (path, got_magic, magic))
    return dims, data[header:]


def write_gz(path, payload):
    buf = io.BytesIO()
    # filename="" and mtime=0 keep the output identical from run to run.
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as f:
        f.write(payload)
    with open(path, "wb") as out:
        out.write(buf.getvalue())


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    source = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "..", "shared", "datasets", "fashion-mnist")
    out_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join(root, "data", "fashion-mnist")
    os.makedirs(out_dir, exist_ok=True)
    for split, count in COUNTS.items():
        (n, rows, cols), pixels = read_idx(os.path.join(source, split + "-images-idx3-ubyte.gz"), IMAGES_MAGIC, 3)
        (n_labels,), labels = read_idx(os.path.join(source, split + "-labels-idx1-ubyte.gz"), LABELS_MAGIC, 1)
        if n != n_labels or n < count:
            sys.exit("%s: %d images and %d labels; need at least %d of each" % (split, n, n_labels, count))
        write_gz(os.path.join(out_dir, split + "-images-idx3-ubyte.gz"),
                 struct.pack(">4I", IMAGES_MAGIC, count, rows, cols) + pixels[: count * rows * cols])
        write_gz(os.path.join(out_dir, split + "-labels-idx1-ubyte.gz"),
                 struct.pack(">2I", LABELS_MAGIC, count) + labels[:count])
        per_class = [labels[:count].count(c) for c in range(10)]
        print("%s: %d images, per class %s" % (split, count, per_class))


if __name__ == "__main__":
    main()
