"""Checked by tests/models/python_models_test.cc: after the same manual_seed, the Python twins
in python/datapar_models.py start from exactly the values the C++ models start from.

Usage: python_seed_check.py DIR SEED NAME...
DIR/NAME_seeded.pt is the C++ model's state dict right after torch::manual_seed(SEED) and
construction. Exits 1 naming the first entry that differs.
"""
import sys

import torch

import datapar_models


def main():
    out_dir, seed, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    for name in names:
        torch.manual_seed(seed)
        ours = datapar_models.MODELS[name]().state_dict()
        theirs = torch.load("%s/%s_seeded.pt" % (out_dir, name), weights_only=True)
        for key, value in ours.items():
            if not torch.equal(value, theirs[key]):
                sys.exit("%s: %s differs after manual_seed(%d): max difference %g" %
                         (name, key, seed, (value.double() - theirs[key].double()).abs().max()))


if __name__ == "__main__":
    main()
