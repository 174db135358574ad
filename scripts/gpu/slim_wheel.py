#!/usr/bin/env python3
"""Slim the vllm wheel for the H200 device bundle.

Drops FlashAttention 2 (Hopper uses FA3) and the vllm-rs binary, and rewrites
RECORD so that pip still installs the result.  Usage:
    slim_wheel.py IN.whl OUT.whl
"""

import base64
import hashlib
import sys
import zipfile

DROP = ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/vllm-rs")


def main(src: str, dst: str) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zout:
        record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        lines = []
        for info in zin.infolist():
            name = info.filename
            if name in DROP or name == record_name:
                continue
            data = zin.read(name)
            zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            lines.append(f"{name},sha256={digest},{len(data)}")
        lines.append(f"{record_name},,")
        zout.writestr(record_name, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
