"""Checked by tests/models/python_models_test.cc: python/datapar_models.py against C++.

Usage: python_models_check.py DIR NAME...
For each NAME (mlp, lenet, resnet18), DIR holds what the C++ side wrote:
  NAME.keys      one line per state-dict entry: "key dim0,dim1,..." in C++ order
  NAME.pt        the C++ model's state dict (datapar::save_state_dict)
  NAME_x.pt      {"x": input, "unused": ...}
This script checks that the Python twin has the same keys, shapes and order, loads the
weights (strict), and writes NAME_y.pt = {"y": output in eval mode, "x": input} and NAME_py.pt = its
own freshly initialised state dict (for C++ to load). Exits 1 naming the first mismatch.
"""
import sys

import torch

import datapar_models


def main():
    out_dir, names = sys.argv[1], sys.argv[2:]
    for name in names:
        net = datapar_models.MODELS[name]()
        ours = [(k, ",".join(str(d) for d in v.shape)) for k, v in net.state_dict().items()]
        with open("%s/%s.keys" % (out_dir, name)) as f:
            theirs = [tuple(line.split(" ")) for line in f.read().splitlines()]
        theirs = [(t[0], t[1] if len(t) > 1 else "") for t in theirs]
        if ours != theirs:
            for i, (a, b) in enumerate(zip(ours, theirs)):
                if a != b:
                    sys.exit("%s: entry %d is %s in Python but %s in C++" % (name, i, a, b))
            sys.exit("%s: Python has %d entries, C++ %d" % (name, len(ours), len(theirs)))
        torch.save(dict(net.state_dict()), "%s/%s_py.pt" % (out_dir, name))
        net.load_state_dict(torch.load("%s/%s.pt" % (out_dir, name), weights_only=True), strict=True)
        net.eval()
        with torch.no_grad():
            x = torch.load("%s/%s_x.pt" % (out_dir, name), weights_only=True)["x"]
            y = net(x)
        # Two entries, not one: pickle writes a one-entry dict with SETITEM, which
        # libtorch 1.13's unpickler does not know.
        torch.save({"y": y, "x": x}, "%s/%s_y.pt" % (out_dir, name))


if __name__ == "__main__":
    main()
