#!/usr/bin/env python3
"""Pack the layers of scripts/gpu/bundle_plan.py's plan into 56 MiB parts (scripts/gpu/make-bundle.sh).

    bundle_pack.py PLAN.json WHEELS_DIR OUT_DIR [--slim-dir DIR] [--verify-pypi]

For each layer: the wheels it names (found in WHEELS_DIR by name and version; the slimmed vllm wheel in
--slim-dir), tarred uncompressed and split into OUT_DIR/LAYER/pNN/part with part.sha256 beside it, the whole
tar's sha256 in OUT_DIR/LAYER/layer.sha256.  OUT_DIR/manifest.json lists layers -> parts (and sizes, wheels)
and each release's layers in PYTHONPATH order, so the device side receives each layer once.
--verify-pypi checks every wheel that is not a slimmed vllm against the sha256 PyPI publishes for it.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import sys
import tarfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bundle_plan beside it, however this file is loaded
from bundle_plan import norm, wheel_file  # noqa: E402

from builder.util import sha256_file  # noqa: E402

#: a device call carries at most 64 MiB in all: the checkout (about 4.4 MiB), the carried code (about 2 MiB)
#: and one part
PART = 56 * 1024 * 1024


def pypi_sha256(name: str, version: str, filename: str) -> str | None:
    """The sha256 PyPI's simple index (JSON form, PEP 691) gives for FILENAME of NAME."""
    req = urllib.request.Request(
        f"https://pypi.org/simple/{norm(name)}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    for attempt in range(4):  # a name-resolution hiccup is retried, not reported as a mismatch
        try:
            with urllib.request.urlopen(req, timeout=60) as r:  # noqa: S310 - a fixed https URL
                data = json.load(r)
            break
        except OSError:
            if attempt == 3:
                raise
            time.sleep(2 + 3 * attempt)
    for u in data.get("files", []):
        if u["filename"] == filename:
            return u["hashes"].get("sha256")
    return None


def split(tar: Path, layer_dir: Path, size: int = PART) -> list[dict]:
    """tar -> layer_dir/pNN/part (+ part.sha256); returns [{dir, bytes, sha256}]."""
    parts = []
    with open(tar, "rb") as f:
        n = 0
        while True:
            chunk = f.read(size)
            if not chunk:
                break
            d = layer_dir / f"p{n:02d}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "part").write_bytes(chunk)
            digest = hashlib.sha256(chunk).hexdigest()
            (d / "part.sha256").write_text(f"{digest}  part\n")
            parts.append({"dir": f"{layer_dir.name}/{d.name}", "bytes": len(chunk), "sha256": digest})
            n += 1
    return parts


def pack(plan: dict, wheels_dir: Path, out: Path, slim_dir: Path | None = None, verify_pypi: bool = False) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    layers = {}
    missing = []
    to_verify = []
    for name, lay in plan["layers"].items():
        files = []
        for dist, ver in lay["wheels"].items():
            f = wheel_file(wheels_dir, dist, ver)
            if f is None:
                missing.append(f"{name}: {dist}=={ver}")
                continue
            files.append(f)
            to_verify.append((dist, ver, f))
        if lay.get("slim_vllm"):
            f = wheel_file(slim_dir or wheels_dir, "vllm", lay["slim_vllm"])
            if f is None:
                raise SystemExit(f"{name}: no slimmed vllm {lay['slim_vllm']} wheel in {slim_dir}")
            files.append(f)
        layer_dir = out / name
        if layer_dir.exists():
            shutil.rmtree(layer_dir)
        layer_dir.mkdir(parents=True)
        tar = out / f"{name}.tar"
        with tarfile.open(tar, "w", format=tarfile.GNU_FORMAT) as t:
            for f in sorted(files):
                t.add(f, arcname=f"whl/{f.name}")
            listing = "\n".join(f.name for f in sorted(files)) + "\n"
            info = tarfile.TarInfo("whl/LAYER.txt")
            info.size = len(listing)
            t.addfile(info, io.BytesIO(listing.encode()))
        digest = sha256_file(tar)
        parts = split(tar, layer_dir)
        (layer_dir / "layer.sha256").write_text(f"{digest}  {name}.tar\n")
        layers[name] = {
            "kind": lay["kind"],
            "version": lay["version"],
            "releases": lay["releases"],
            "bytes": tar.stat().st_size,
            "sha256": digest,
            "parts": parts,
            "wheels": [f.name for f in sorted(files)],
        }
        tar.unlink()
    verified = None
    if verify_pypi:

        def check(item):
            dist, ver, f = item
            try:
                want = pypi_sha256(dist, ver, f.name)
            except OSError as exc:
                want = f"unreadable ({exc})"
            return f.name, want, sha256_file(f)

        with ThreadPoolExecutor(8) as ex:
            results = list(ex.map(check, to_verify))
        bad = [f"{n}: PyPI {w}, file {h}" for n, w, h in results if w != h]
        if bad:
            raise SystemExit("sha256 differs from PyPI's:\n  " + "\n  ".join(bad))
        verified = len(results)
    manifest = {
        "schema": "build-image/gpu-bundle/v1",
        "part_bytes": PART,
        "layers": layers,
        "releases": {v: r["layers"] for v, r in plan["releases"].items()},
        "missing": missing,
        "pypi_verified": verified,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plan", type=Path)
    ap.add_argument("wheels", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--slim-dir", type=Path)
    ap.add_argument("--verify-pypi", action="store_true")
    a = ap.parse_args(argv)
    m = pack(json.loads(a.plan.read_text()), a.wheels, a.out, a.slim_dir, a.verify_pypi)
    for name, lay in m["layers"].items():
        print(f"{name}: {len(lay['wheels'])} wheels, {lay['bytes'] / 2**20:.0f} MiB, {len(lay['parts'])} parts")
    if m["missing"]:
        print("MISSING (not downloadable as a wheel):\n  " + "\n  ".join(m["missing"]), file=sys.stderr)
    if m["pypi_verified"] is not None:
        print(f"sha256 of {m['pypi_verified']} wheels equal to PyPI's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
