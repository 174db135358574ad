#!/usr/bin/env python3
"""Content-addressed parts for the H200 bundle: every distinct wheel travels once, however many layers hold it.

    cas_pack.py BUNDLE_DIR [--order "0.26.0 0.27.0 ..."] [--extra-layer NAME:KIND:DIR ...]
                [--part-mib 56] [--out DIR] [--audit]

--serve "V ..." keeps the ray layers of those releases (the others' are left out).
BUNDLE_DIR is the layered bundle of scripts/gpu/make-bundle.sh (manifest.json and LAYER/pNN/part): its layers are
joined and their wheels read back.  Each distinct wheel (by sha256) is a blob; the blobs are laid end to end in the
order the device needs them (the layers of the first release of --order first, then each next release's new
blobs; the ray and --extra-layer layers last) and the stream is cut into parts of --part-mib MiB:
OUT/cNNN/part with part.sha256 beside it (OUT default BUNDLE_DIR/cas).  OUT/manifest.json keeps the layered
manifest's ``layers`` and ``releases`` (the device scripts read them) and adds, per layer, ``blobs`` and
``cas_parts`` (the parts its blobs lie in), and ``cas``: the parts and the blobs (sha256 -> file name, offset,
bytes).  A layer is installable on the device as soon as its cas_parts have arrived
(scripts/gpu/cas_device.py), so a wheel shared by several vllm layers (and the torch stack shared by releases)
crosses once.  --audit prints the repeats the layered parts carried and the parts saved.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

MiB = 1024 * 1024


def layer_wheels(bundle: Path, name: str, layer: dict) -> dict[str, bytes]:
    """file name -> bytes of the wheels in layer NAME's tar (joined from its parts)."""
    data = b"".join((bundle / p["dir"] / "part").read_bytes() for p in layer["parts"])
    if hashlib.sha256(data).hexdigest() != layer["sha256"]:
        raise SystemExit(f"cas_pack: {name}: joined parts differ from the manifest's sha256")
    out = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        for m in t.getmembers():
            if m.isfile() and m.name.endswith(".whl"):
                out[Path(m.name).name] = t.extractfile(m).read()
    return out


def dir_wheels(d: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(d.glob("*.whl"))}


def layer_order(manifest: dict, order: list[str], extra: list[str]) -> list[str]:
    """Layers in the order the device needs them: per release of ORDER its engine layers, then ray, then EXTRA."""
    out: list[str] = []
    for v in order:
        out += [x for x in manifest["releases"][v] if manifest["layers"][x]["kind"] != "ray" and x not in out]
    for v in order:
        out += [x for x in manifest["releases"][v] if x not in out]
    out += [x for x in manifest["layers"] if x not in out]
    return out + [x for x in extra if x not in out]


def select(manifest: dict, order: list[str], serve: list[str]) -> dict:
    """The manifest cut to the releases of ORDER: their engine layers, and the ray layers of SERVE only."""
    keep = {x for v in order for x in manifest["releases"][v] if manifest["layers"][x]["kind"] != "ray"}
    keep |= {x for v in serve for x in manifest["releases"][v]}
    return {
        **manifest,
        "layers": {k: v for k, v in manifest["layers"].items() if k in keep},
        "releases": {v: [x for x in manifest["releases"][v] if x in keep] for v in order},
    }


def pack(
    bundle: Path,
    out: Path,
    order: list[str],
    extras: list[tuple[str, str, Path]],
    part_bytes: int,
    serve: list[str] | None = None,
) -> dict:
    manifest = json.loads((bundle / "manifest.json").read_text())
    order = order or list(manifest["releases"])
    manifest = select(manifest, order, serve or [])
    layers = {k: dict(v) for k, v in manifest["layers"].items()}
    extra_dirs = {name: d for name, _, d in extras}
    for name, kind, d in extras:
        layers[name] = {"kind": kind, "version": "", "releases": [], "wheels": sorted(f.name for f in d.glob("*.whl"))}
    blobs: dict[str, dict] = {}
    out.mkdir(parents=True, exist_ok=True)
    stream_path = out / "stream.tmp"
    offset = 0
    with open(stream_path, "wb") as stream:  # one layer in memory at a time
        for name in layer_order(manifest, order, [e[0] for e in extras]):
            wheels = dir_wheels(extra_dirs[name]) if name in extra_dirs else layer_wheels(bundle, name, layers[name])
            shas = []
            for fname, data in sorted(wheels.items()):
                sha = hashlib.sha256(data).hexdigest()
                shas.append(sha)
                if sha not in blobs:
                    blobs[sha] = {"name": fname, "offset": offset, "bytes": len(data)}
                    stream.write(data)
                    offset += len(data)
            layers[name]["blobs"] = shas
    parts = []
    with open(stream_path, "rb") as stream:
        i = 0
        while chunk := stream.read(part_bytes):
            d = out / f"c{i:03d}"
            d.mkdir(exist_ok=True)
            digest = hashlib.sha256(chunk).hexdigest()
            if not (d / "part.sha256").exists() or (d / "part.sha256").read_text().split()[0] != digest:
                (d / "part").write_bytes(chunk)
                (d / "part.sha256").write_text(f"{digest}  part\n")
            parts.append({"dir": d.name, "bytes": len(chunk), "sha256": digest})
            i += 1
    stream_path.unlink()
    for stale in sorted(out.glob("c[0-9][0-9][0-9]"))[len(parts) :]:
        for f in stale.iterdir():
            f.unlink()
        stale.rmdir()
    for lay in layers.values():
        lay["cas_parts"] = sorted(
            {
                k
                for s in lay["blobs"]
                for k in range(
                    blobs[s]["offset"] // part_bytes,
                    (blobs[s]["offset"] + max(blobs[s]["bytes"], 1) - 1) // part_bytes + 1,
                )
            }
        )
        lay.pop("parts", None)
    doc = {
        "schema": "build-image/gpu-bundle-cas/v1",
        "part_bytes": part_bytes,
        "order": order,
        "layers": layers,
        "releases": manifest["releases"],
        "cas": {"parts": parts, "blobs": blobs, "bytes": offset},
        "layered": {
            "parts": sum(len(v["parts"]) for v in manifest["layers"].values()),
            "bytes": sum(v["bytes"] for v in manifest["layers"].values()),
        },
    }
    (out / "manifest.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def audit(doc: dict) -> str:
    """The repeats among the layers (bytes of wheels held by more than one layer) and the parts saved."""
    held: dict[str, list[str]] = {}
    for name, lay in doc["layers"].items():
        for s in lay["blobs"]:
            held.setdefault(s, []).append(name)
    rep = sum(doc["cas"]["blobs"][s]["bytes"] * (len(v) - 1) for s, v in held.items())
    vllm_rep = sum(
        doc["cas"]["blobs"][s]["bytes"] * (len([x for x in v if x.startswith("vllm-")]) - 1)
        for s, v in held.items()
        if any(x.startswith("vllm-") for x in v)
    )
    return (
        f"layered: {doc['layered']['parts']} parts, {doc['layered']['bytes'] / MiB:,.0f} MiB; "
        f"content-addressed: {len(doc['cas']['parts'])} parts, {doc['cas']['bytes'] / MiB:,.0f} MiB "
        f"({len(doc['cas']['blobs'])} distinct wheels); repeats {rep / MiB:,.0f} MiB "
        f"(among the vllm layers {vllm_rep / MiB:,.0f} MiB)"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--order", default="", help="releases in the order the device boots them")
    ap.add_argument("--extra-layer", action="append", default=[], help="NAME:KIND:DIR of wheels (a layer of its own)")
    ap.add_argument("--serve", default="", help="releases whose ray layers travel too (smoke --serve)")
    ap.add_argument("--part-mib", type=int, default=56)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--audit", action="store_true")
    a = ap.parse_args(argv)
    extras = []
    for e in a.extra_layer:
        name, kind, d = e.split(":", 2)
        extras.append((name, kind, Path(d)))
    doc = pack(a.bundle, a.out or a.bundle / "cas", a.order.split(), extras, a.part_mib * MiB, a.serve.split())
    for name, lay in doc["layers"].items():
        print(f"{name}: {len(lay['blobs'])} wheels in parts {lay['cas_parts'][0]}..{lay['cas_parts'][-1]}")
    print(audit(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
