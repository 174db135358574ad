#!/usr/bin/env python3
"""The device side of the content-addressed bundle (scripts/gpu/cas_pack.py): receive parts, install layers.

    cas_device.py recv BUNDLE N      part N from BUNDLE/cNNN (carried), checked, kept in /tmp/cas/parts; then every
                                     layer whose parts are all here starts installing in the background
    cas_device.py install LAYER      (background) its wheels cut out of the parts, checked, pip install --target
    cas_device.py inventory          one INVENTORY line: boot id, parts held, each layer's state

A layer's state files are those of scripts/gpu/device-calls.sh (the run scripts read them): /tmp/L/LAYER.log while
it installs, then /tmp/L/LAYER.ok (``installed in N s``) or /tmp/L/LAYER.failed.  /tmp/L/manifest.json is the
bundle's manifest (layers, releases: what proof-run.sh and env.sh's release_pp read).  A part whose every layer is
installed is deleted (its name stays, as cNNN.done), so the disk holds each byte about twice at most.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

CAS = Path(os.environ.get("CAS_DIR", "/tmp/cas"))
L = Path(os.environ.get("LAYERS_DIR", "/tmp/L"))
PARTS, BLOBS = CAS / "parts", CAS / "blobs"


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "?"


def manifest() -> dict:
    return json.loads((L / "manifest.json").read_text())


def held(m: dict) -> set[int]:
    return {
        i
        for i, p in enumerate(m["cas"]["parts"])
        if (PARTS / p["dir"]).exists() or (PARTS / f"{p['dir']}.done").exists()
    }


def state(name: str, lay: dict, have: set[int]) -> str:
    for s in ("ok", "failed"):
        if (L / f"{name}.{s}").exists():
            return s
    if (L / f"{name}.log").exists():
        return "installing"
    need = lay["cas_parts"]
    return f"{len([p for p in need if p in have])}/{len(need)}"


def ranges(nums: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8'"""
    out: list[str] = []
    for x in nums:
        if out and out[-1].split("-")[-1] == str(x - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{x}"
        else:
            out.append(str(x))
    return ",".join(out)


def inventory() -> None:
    m = manifest()
    have = held(m)
    n = len(m["cas"]["parts"])
    missing = [i for i in range(n) if i not in have]
    fields = [f"boot={boot_id()}", f"cas={len(have)}/{n}" + (":missing=" + ranges(missing) if missing else "")]
    fields += [f"{name}={state(name, lay, have)}" for name, lay in m["layers"].items()]
    print("INVENTORY", " ".join(fields), flush=True)


def start_ready(m: dict) -> None:
    """Every layer whose parts are all here and that has not started: its install, in its own session."""
    have = held(m)
    for name, lay in m["layers"].items():
        if all(p in have for p in lay["cas_parts"]) and state(name, lay, have) not in ("ok", "failed", "installing"):
            log = open(L / f"{name}.log", "w")  # noqa: SIM115 - handed to the child
            subprocess.Popen(
                [sys.executable, __file__, "install", name],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            print(f"{name}: its parts are here; installing in the background ({L}/{name}.log)", flush=True)


def recv(bundle: Path, n: int) -> int:
    src_manifest = bundle / "manifest.json"
    L.mkdir(parents=True, exist_ok=True)
    PARTS.mkdir(parents=True, exist_ok=True)
    if not (L / "manifest.json").exists() or (L / "manifest.json").read_bytes() != src_manifest.read_bytes():
        shutil.copyfile(src_manifest, L / "manifest.json")
    m = manifest()
    p = m["cas"]["parts"][n]
    data = (bundle / p["dir"] / "part").read_bytes()
    if hashlib.sha256(data).hexdigest() != p["sha256"]:
        print(f"part {n}: sha256 mismatch", flush=True)
        return 7
    tmp = PARTS / f".{p['dir']}.tmp"
    tmp.write_bytes(data)
    tmp.rename(PARTS / p["dir"])
    print(f"part {n} received ({len(held(m))} of {len(m['cas']['parts'])}; boot {boot_id()})", flush=True)
    start_ready(m)
    inventory()
    return 0


def blob_file(m: dict, sha: str) -> Path:
    """The blob as a file in BLOBS (cut out of the parts once; a second installer waits on the first)."""
    b = m["cas"]["blobs"][sha]
    dest = BLOBS / sha[:16] / b["name"]
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(BLOBS / f".{sha[:16]}.lock", "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        if dest.exists():
            return dest
        pb = m["part_bytes"]
        h = hashlib.sha256()
        tmp = dest.with_name(dest.name + ".tmp")
        with open(tmp, "wb") as out:
            off, left = b["offset"], b["bytes"]
            while left:
                k, at = divmod(off, pb)
                with open(PARTS / m["cas"]["parts"][k]["dir"], "rb") as f:
                    f.seek(at)
                    chunk = f.read(min(left, pb - at))
                h.update(chunk)
                out.write(chunk)
                off += len(chunk)
                left -= len(chunk)
        if h.hexdigest() != sha:
            tmp.unlink()
            raise RuntimeError(f"blob {b['name']}: sha256 differs from the manifest's")
        tmp.rename(dest)
    return dest


def cleanup(m: dict) -> None:
    """Delete the parts (and blobs) that no layer still to install needs."""
    pending = [
        lay for name, lay in m["layers"].items() if not ((L / f"{name}.ok").exists() or (L / f"{name}.failed").exists())
    ]
    need_parts = {p for lay in pending for p in lay["cas_parts"]}
    need_blobs = {s for lay in pending for s in lay["blobs"]}
    for i, p in enumerate(m["cas"]["parts"]):
        f = PARTS / p["dir"]
        if i not in need_parts and f.exists():
            (PARTS / f"{p['dir']}.done").touch()
            f.unlink()
    for sha in m["cas"]["blobs"]:
        d = BLOBS / sha[:16]
        if sha not in need_blobs and d.is_dir():
            shutil.rmtree(d, ignore_errors=True)


def install(name: str) -> int:
    t0 = time.monotonic()
    m = manifest()
    lay = m["layers"][name]
    try:
        files = [str(blob_file(m, s)) for s in lay["blobs"]]
    except (OSError, RuntimeError, KeyError) as e:
        (L / f"{name}.failed").write_text(f"{name}: {e}\n")
        return 1
    target = L / name
    shutil.rmtree(target, ignore_errors=True)
    rc = subprocess.call(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--no-cache-dir",
            "--target",
            str(target),
            *files,
        ]
    )
    if rc:
        (L / f"{name}.failed").write_text("pip install failed\n")
        return 1
    (L / f"{name}.ok").write_text(f"installed in {time.monotonic() - t0:.0f} s\n")
    try:
        with open(CAS / ".cleanup.lock", "w") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            cleanup(m)
    except OSError as e:
        print(f"cleanup: {e}")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["recv"] and len(argv) == 3:
        return recv(Path(argv[1]), int(argv[2]))
    if argv[:1] == ["install"] and len(argv) == 2:
        return install(argv[1])
    if argv[:1] == ["inventory"]:
        inventory()
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
