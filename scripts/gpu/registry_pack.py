#!/usr/bin/env python3
"""A registry's repositories, byte for byte, as parts that a device call can carry (and their reassembly there).

    registry_pack.py pack STORAGE OUT [--repo NAME ...] [--part-mib 56]
    registry_pack.py recv PARTS_DIR N DEST      (device) part N checked and kept; when all parts are here, the
                                                storage is joined, checked and unpacked into DEST

STORAGE is a docker-registry (distribution) filesystem root.  ``pack`` takes each --repo's folder under
docker/registry/v2/repositories (tags, manifest revisions, layer links) and every blob those link to, in one tar
cut into parts (OUT/pNNN/part, OUT/pNNN/part.sha256, OUT/manifest.json with the parts, the tar's sha256, and each
repository's tags with their digests).  A registry started over DEST serves the same manifests and blobs, so the
images have the digests they had where the tool built and pushed them: the image a device boots is the one the
tool built, by digest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import tarfile
from pathlib import Path

MiB = 1024 * 1024
V2 = Path("docker/registry/v2")


def repo_blobs(storage: Path, repo: str) -> set[str]:
    """The sha256 digests a repository's links name (layers, manifest revisions, tag currents)."""
    out: set[str] = set()
    for link in (storage / V2 / "repositories" / repo).rglob("link"):
        text = link.read_text().strip()
        if text.startswith("sha256:"):
            out.add(text.split(":", 1)[1])
    return out


def tags(storage: Path, repo: str) -> dict[str, str]:
    root = storage / V2 / "repositories" / repo / "_manifests" / "tags"
    return (
        {t.name: (t / "current" / "link").read_text().strip() for t in sorted(root.iterdir())} if root.is_dir() else {}
    )


def pack(storage: Path, out: Path, repos: list[str], part_mib: int) -> int:
    out.mkdir(parents=True, exist_ok=True)
    tar_path = out / "registry.tar"
    blobs: set[str] = set()
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
        for repo in repos:
            tar.add(storage / V2 / "repositories" / repo, arcname=str(V2 / "repositories" / repo))
            blobs |= repo_blobs(storage, repo)
        for digest in sorted(blobs):
            folder = V2 / "blobs" / "sha256" / digest[:2] / digest
            tar.add(storage / folder, arcname=str(folder))
    data_sha = hashlib.sha256()
    parts = []
    with open(tar_path, "rb") as fh:
        n = 0
        while chunk := fh.read(part_mib * MiB):
            data_sha.update(chunk)
            d = out / f"p{n:03d}"
            d.mkdir(exist_ok=True)
            (d / "part").write_bytes(chunk)
            sha = hashlib.sha256(chunk).hexdigest()
            (d / "part.sha256").write_text(sha + "\n")
            parts.append({"dir": d.name, "sha256": sha, "bytes": len(chunk)})
            n += 1
    tar_path.unlink()
    manifest = {
        "parts": parts,
        "sha256": data_sha.hexdigest(),
        "blobs": len(blobs),
        "repositories": {r: tags(storage, r) for r in repos},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(p["bytes"] for p in parts)
    print(f"registry_pack: {len(repos)} repositories, {len(blobs)} blobs, {total / MiB:.0f} MiB in {len(parts)} parts")
    return 0


def recv(parts_dir: Path, n: int, dest: Path) -> int:
    manifest = json.loads((parts_dir / "manifest.json").read_text())
    keep = Path(os.environ.get("REGISTRY_PARTS", "/tmp/regparts"))
    keep.mkdir(parents=True, exist_ok=True)
    want = manifest["parts"][n]
    data = (parts_dir / want["dir"] / "part").read_bytes()
    if hashlib.sha256(data).hexdigest() != want["sha256"]:
        print(f"recv: part {n} differs from its sha256", file=sys.stderr)
        return 1
    (keep / f"{n:03d}.tmp").write_bytes(data)
    os.replace(keep / f"{n:03d}.tmp", keep / f"{n:03d}")
    held = sorted(p.name for p in keep.iterdir() if re.fullmatch(r"\d{3}", p.name))
    print(f"recv: part {n} kept; {len(held)}/{len(manifest['parts'])} held")
    if len(held) < len(manifest["parts"]) or (dest / ".complete").exists():
        return 0
    digest = hashlib.sha256()
    joined = keep / "registry.tar"
    with open(joined, "wb") as fh:
        for i in range(len(manifest["parts"])):
            chunk = (keep / f"{i:03d}").read_bytes()
            digest.update(chunk)
            fh.write(chunk)
            (keep / f"{i:03d}").unlink()
    if digest.hexdigest() != manifest["sha256"]:
        print("recv: the joined storage differs from its sha256", file=sys.stderr)
        return 1
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(joined) as tar:
        tar.extractall(dest, filter="tar")
    joined.unlink()
    (dest / ".complete").write_text(manifest["sha256"] + "\n")
    print(f"recv: registry storage complete in {dest} ({manifest['blobs']} blobs)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("storage", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--repo", action="append", required=True)
    p.add_argument("--part-mib", type=int, default=56)
    r = sub.add_parser("recv")
    r.add_argument("parts_dir", type=Path)
    r.add_argument("n", type=int)
    r.add_argument("dest", type=Path)
    a = ap.parse_args()
    if a.cmd == "pack":
        return pack(a.storage, a.out, a.repo, a.part_mib)
    return recv(a.parts_dir, a.n, a.dest)


if __name__ == "__main__":
    sys.exit(main())
