#!/usr/bin/env python3
"""A copy of a checkpoint with one tensor multiplied by a factor: the candidate the output-equivalence gate
(`smoke --reference`) must FAIL against the original's reference.

    scale_weight.py SRC DEST TENSOR FACTOR

SRC's files are copied to DEST; the safetensors file holding TENSOR is rewritten with TENSOR * FACTOR (the
tensor's dtype kept) and everything else unchanged.  Prints what it changed as JSON.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    src, dest, name, factor = Path(argv[0]), Path(argv[1]), argv[2], float(argv[3])
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(src, dest)
    for f in sorted(dest.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            if name not in h.keys():
                continue
            meta = h.metadata()
            tensors = {k: h.get_tensor(k) for k in h.keys()}
        before = tensors[name].float().abs().mean().item()
        tensors[name] = (tensors[name].float() * factor).to(tensors[name].dtype)
        save_file(tensors, str(f), metadata=meta)
        print(
            json.dumps(
                {
                    "file": f.name,
                    "tensor": name,
                    "factor": factor,
                    "shape": list(tensors[name].shape),
                    "mean_abs_before": before,
                    "mean_abs_after": tensors[name].float().abs().mean().item(),
                }
            )
        )
        return 0
    print(f"scale_weight: no tensor {name!r} in {src}/*.safetensors", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
