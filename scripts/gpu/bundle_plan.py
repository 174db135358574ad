#!/usr/bin/env python3
"""Which wheels the H200 bundle carries for each vLLM release, read from the release's base manifest.

    bundle_plan.py --vllm 0.27.0 [--vllm 0.33.0 ...] [--vllm-wheel-dir DIR] [--full-torch-stack]
                   [--json | --requirements LAYER | --layers]

The plan is a set of layers; a release boots from its layers put on PYTHONPATH in order:

- ``torch-X``: the torch stack the release's base manifest pins (torch, triton, torchvision,
  torchaudio, the NVIDIA libraries torch links by soname), minus what the device already holds at
  the same version (scripts/gpu/device-packages.txt).  Of the CUDA libraries only NCCL and NVSHMEM
  travel by default: torch loads the others (cuBLAS, cuDNN, ...) from whichever ``nvidia/<lib>/lib``
  comes first on sys.path, and the device's CUDA 13 builds served torch 2.14 (vllm 0.33.0, 2026-12-01);
  torch 2.14 without a newer NCCL fails to import (``undefined symbol: ncclCommResume``).
  ``--full-torch-stack`` carries every differing one.  Releases whose stacks are equal share the layer,
  so it is uploaded once.  Empty (no layer) for a release that pins the device's own torch (0.26.0).
- ``vllm-X``: the slimmed vllm wheel, the engine/server/Gemma 4 dependencies named in
  scripts/gpu/wheels.txt at the manifest's versions, and (with --vllm-wheel-dir) every requirement of
  the vllm wheel itself that the device lacks and that is not an optional kernel package (SKIP); with
  --wheels-dir (the download cache) the requirements of those wheels too, transitively, where the device
  lacks them and the manifest pins them (openai 2.x needs distro, which the device lacks).
- ``ray-Y``: ray at the release's default lock's version (lockfiles/vllm-X/requirements.lock) with the
  lock's other entries, and the Serve dependencies named in scripts/gpu/wheels-serve.txt at the
  lock's, else the manifest's versions.  Shared between releases whose ray layers are equal.

A name missing from the manifest (and the lock) is not a dependency of that release: it is left out
and listed under ``skipped``, unless its line in the names file pins a version (``NAME==V``, for
build-image's own needs such as unidiff).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "scripts" / "gpu"

#: the torch stack: these names and every nvidia-*/cuda-* the manifest holds, except ENGINE_NVIDIA
STACK = ("torch", "triton", "torchvision", "torchaudio")
#: nvidia-* packages that belong to the engine (vLLM's requirements), not to torch
ENGINE_NVIDIA = ("nvidia-cutlass-dsl", "nvidia-ml-py", "nvidia-cudnn-frontend")
#: CUDA libraries carried when the release's version differs from the device's (the rest are loaded
#: from the device's site-packages: see the module docstring)
STACK_LINKED = ("nvidia-nccl-cu13", "nvidia-nvshmem-cu13")
#: vLLM requirements never carried: optional kernels and media packages a plain Qwen3 / Gemma 4 text
#: checkpoint does not load (/work/shared/gpu/README.md: "Not needed for a plain Qwen3 checkpoint").
#: quack-kernels travels: with the CUTLASS DSL importable (Gemma 4 needs it) vLLM's kernel warm-up on sm_90
#: compiles the ll_bf16 router GEMM, which imports quack (0.26.0 died at boot without it, H200 2026-12-03)
SKIP = (
    "flashinfer-python",
    "flashinfer-cubin",
    "flashinfer-jit-cache",
    "tilelang",
    "humming-kernels",
    "tokenspeed-mla",
    "runai-model-streamer",
    "bitsandbytes",
    "opencv-python-headless",
    "torchcodec",
    "pynvvideocodec",
    "fastsafetensors",
    "nvidia-cudnn-frontend",
    "xformers",
    "deep-gemm",
    "deep-ep",
    "nvidia-cutlass-dsl-libs-cu12",
)  # CUDA 13 here: the cu13 libs serve
#: the torch version of the device's python3 (KINDS.md; /work/shared/gpu/README.md)
DEVICE_TORCH = "2.11.0"


#: PEP 503 normalisation of a distribution name
norm = canonicalize_name


def releases() -> list[str]:
    base = ROOT / "lockfiles" / "base"
    out = [
        p.name[len("vllm-openai-v") : -len(".json")]
        for p in base.glob("vllm-openai-v*.json")
        if "-linux-" not in p.name
    ]  # the GPU proof runs the x86_64 images (linux/arm64's manifests are apart)
    return sorted(out, key=lambda v: tuple(int(x) for x in v.split(".")))


def manifest(vllm: str) -> dict[str, str]:
    """name -> version of the release's base manifest (lockfiles/base/vllm-openai-vX.json)."""
    path = ROOT / "lockfiles" / "base" / f"vllm-openai-v{vllm}.json"
    if not path.exists():
        raise SystemExit(f"no base manifest for vllm {vllm}: {path} (shipped: {', '.join(releases())})")
    dists = json.loads(path.read_text())["distributions"]
    return {norm(k): v["version"] for k, v in dists.items()}


LOCK_ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ \\;]+)")
LOCK_RAY = re.compile(r"^# ray: (\S+)")


def lock(vllm: str) -> tuple[str | None, dict[str, str]]:
    """(ray version of the header, name -> version of every entry) of lockfiles/vllm-X/requirements.lock."""
    path = ROOT / "lockfiles" / f"vllm-{vllm}" / "requirements.lock"
    ray, entries = None, {}
    if not path.exists():
        return None, {}
    for line in path.read_text().splitlines():
        m = LOCK_RAY.match(line)
        if m:
            ray = m.group(1)
        m = LOCK_ENTRY.match(line)
        if m:
            entries[norm(m.group(1))] = m.group(2)
    if ray is None:
        ray = entries.get("ray")
    return ray, entries


def names_file(path: Path) -> dict[str, str | None]:
    """NAME or NAME==VERSION lines (comments and blanks ignored) -> {name: fallback version or None}."""
    out: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, ver = line.partition("==")
        out[norm(name.strip())] = ver.strip() or None
    return out


def device() -> dict[str, str | None]:
    """What the device holds: device-packages.txt, with the torch stack's CUDA libraries of the
    release whose manifest pins the device's torch."""
    dev = names_file(GPU / "device-packages.txt")
    for v in releases():
        m = manifest(v)
        if m.get("torch") == DEVICE_TORCH:
            for name, ver in m.items():
                if is_stack(name) and name not in STACK:
                    dev[name] = ver
            break
    return dev


def is_stack(name: str) -> bool:
    if name in STACK:
        return True
    if name.startswith(ENGINE_NVIDIA):
        return False
    return name.startswith(("nvidia-", "cuda-"))


def vllm_requirements(wheel: Path, extras: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """The requirement names of a wheel's METADATA for Linux x86_64 / py3.12: the unconditional ones and
    those of the requested EXTRAS."""
    return [name for name, _ in requirements_with_extras(wheel, extras)]


def requirements_with_extras(wheel: Path, extras: set[str] | frozenset[str] = frozenset()) -> list[tuple[str, set]]:
    """(name, extras it asks of that requirement) for each requirement that applies (see vllm_requirements)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode("utf-8", "replace")
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker and not any(_marker_true(req.marker, e) for e in ([None] + sorted(extras))):
            continue
        asked = {norm(x) for x in req.extras}
        name = norm(req.name)
        if name not in [n for n, _ in out]:
            out.append((name, asked))
    return out


def _marker_true(marker: Marker, extra: str | None = None) -> bool:
    env = {
        "python_version": "3.12",
        "python_full_version": "3.12.3",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "sys_platform": "linux",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": extra or "",
    }
    return marker.evaluate(env)


def wheel_file(wheels_dir: Path, name: str, version: str) -> Path | None:
    """NAME==VERSION's wheel in WHEELS_DIR (file names carry the name and the version)."""
    for f in sorted(Path(wheels_dir).glob("*.whl")):
        dist, ver = f.name.split("-")[:2]
        if norm(dist) != norm(name):
            continue
        try:
            if Version(ver) == Version(version):
                return f
        except InvalidVersion:
            if ver == version:
                return f
    return None


def closure(
    wheels: dict[str, str], sources: list[dict[str, str]], wheels_dir: Path, dev: dict, exclude: set[str] = frozenset()
) -> list[str]:
    """Add to WHEELS the requirements of its wheels found in WHEELS_DIR (again for those added) that the
    device lacks, at the first of SOURCES that pins them; returns the names added.  Wheels not yet
    downloaded are read on the next pass (make-bundle.sh plans and downloads until nothing is added)."""
    added: list[str] = []
    asked: dict[str, set[str]] = {}
    todo = list(wheels)
    while todo:
        name = todo.pop()
        f = wheel_file(wheels_dir, name, wheels[name])
        if f is None:
            continue
        for req, extras in requirements_with_extras(f, asked.get(name, set())):
            if req in dev or req in exclude or is_stack(req) or req in SKIP or req == "vllm":
                continue
            if req in wheels:
                if not extras <= asked.setdefault(req, set()):
                    asked[req] |= extras
                    todo.append(req)  # read again with the new extras
                continue
            ver = _pick(req, sources, None)
            if ver is None:
                continue
            wheels[req] = ver
            asked[req] = set(extras)
            added.append(req)
            todo.append(req)
    return sorted(added)


def _pick(name: str, sources: list[dict[str, str]], fallback: str | None) -> str | None:
    for s in sources:
        if name in s:
            return s[name]
    return fallback


def release_plan(
    vllm: str,
    *,
    wheel_dir: Path | None = None,
    full_stack: bool = False,
    dev: dict[str, str | None] | None = None,
    wheels_dir: Path | None = None,
) -> dict:
    """One release's wheels by layer kind, with what was left to the device or skipped, and why."""
    m = manifest(vllm)
    if "vllm" in m and m["vllm"] != vllm:
        raise SystemExit(f"manifest of {vllm} pins vllm {m['vllm']}")
    dev = device() if dev is None else dev
    ray_ver, lock_entries = lock(vllm)
    torch_wheels: dict[str, str] = {}
    left: list[dict] = []
    skipped: list[dict] = []
    for name in sorted(m):
        if not is_stack(name):
            continue
        ver = m[name]
        if dev.get(name) == ver:
            continue
        if name in STACK or name in STACK_LINKED or full_stack:
            if name == "torch" and ver == DEVICE_TORCH:
                continue
            torch_wheels[name] = ver
        else:
            left.append(
                {
                    "name": name,
                    "pinned": ver,
                    "device": dev.get(name),
                    "why": "loaded from the device's site-packages by soname (CUDA 13)",
                }
            )
    if m.get("torch") == DEVICE_TORCH:
        torch_wheels = {}  # the device's own torch stack serves this release
    engine: dict[str, str] = {}
    wanted = names_file(GPU / "wheels.txt")
    auto: list[str] = []
    if wheel_dir is not None:
        wheel = find_wheel(wheel_dir, vllm)
        if wheel is not None:
            for name in vllm_requirements(wheel):
                if name in wanted or name in dev or is_stack(name) or name in SKIP or name == "vllm":
                    continue
                wanted[name] = None
                auto.append(name)
    for name, fallback in sorted(wanted.items()):
        ver = _pick(name, [m], fallback)
        if ver is None:
            skipped.append({"name": name, "why": f"not in the {vllm} base manifest"})
        elif dev.get(name) == ver:
            continue
        elif is_stack(name):
            continue
        else:
            engine[name] = ver
    deps: list[str] = []
    if wheels_dir is not None:
        deps = closure(engine, [m], wheels_dir, dev)
    ray_wheels: dict[str, str] = {}
    if ray_ver:
        ray_wheels["ray"] = ray_ver
        for name, ver in lock_entries.items():
            if name not in engine and name != "vllm" and not is_stack(name):
                ray_wheels[name] = ver
        for name, fallback in sorted(names_file(GPU / "wheels-serve.txt").items()):
            if name in engine or name in ray_wheels:
                continue
            ver = _pick(name, [lock_entries, m], fallback)
            if ver is None:
                skipped.append({"name": name, "why": f"in neither the {vllm} lock nor its base manifest"})
            elif dev.get(name) != ver and not is_stack(name):
                ray_wheels[name] = ver
        if wheels_dir is not None:
            deps += closure(ray_wheels, [lock_entries, m], wheels_dir, dev, exclude=set(engine))
    return {
        "vllm": vllm,
        "torch": m.get("torch"),
        "ray": ray_ver,
        "torch_wheels": torch_wheels,
        "engine_wheels": engine,
        "ray_wheels": ray_wheels,
        "auto_added": sorted(auto),
        "requirements_added": sorted(set(deps)),
        "left_to_device": left,
        "skipped": skipped,
    }


def find_wheel(wheel_dir: Path, vllm: str) -> Path | None:
    found = sorted(Path(wheel_dir).glob(f"vllm-{vllm}-*.whl"))
    return found[0] if found else None


def _digest(wheels: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(sorted(wheels.items())).encode()).hexdigest()[:8]


def plan(
    vllms: list[str], *, wheel_dir: Path | None = None, full_stack: bool = False, wheels_dir: Path | None = None
) -> dict:
    """The bundle for several releases: layers (each uploaded once) and each release's layer order."""
    dev = device()
    rels = [release_plan(v, wheel_dir=wheel_dir, full_stack=full_stack, dev=dev, wheels_dir=wheels_dir) for v in vllms]
    # each distinct (kind, version, content) is one layer, named KIND-VERSION, or KIND-VERSION-DIGEST where
    # releases need two contents of one version (ray 2.59.0 with each release's versions of its dependencies)
    found: dict[tuple[str, str, str], dict] = {}
    wanted: dict[str, list[tuple[str, str, str]]] = {}
    for r in rels:
        keys = []
        parts = (
            ([("torch", r["torch"], r["torch_wheels"], {})] if r["torch_wheels"] else [])
            + [("vllm", r["vllm"], r["engine_wheels"], {"slim_vllm": r["vllm"]})]
            + ([("ray", r["ray"], r["ray_wheels"], {})] if r["ray_wheels"] else [])
        )
        for kind, ver, wheels, extra in parts:
            key = (kind, ver, _digest(wheels))
            lay = found.setdefault(
                key,
                {
                    "kind": kind,
                    "version": ver,
                    "digest": key[2],
                    "releases": [],
                    "wheels": dict(sorted(wheels.items())),
                    **extra,
                },
            )
            lay["releases"].append(r["vllm"])
            keys.append(key)
        wanted[r["vllm"]] = keys
    versions = [(k, v) for k, v, _ in found]

    def name(key: tuple[str, str, str]) -> str:
        kind, ver, digest = key
        return f"{kind}-{ver}" if versions.count((kind, ver)) == 1 else f"{kind}-{ver}-{digest}"

    layers = {name(k): lay for k, lay in found.items()}
    order = {v: [name(k) for k in keys] for v, keys in wanted.items()}
    return {
        "schema": "build-image/gpu-bundle-plan/v1",
        "device_torch": DEVICE_TORCH,
        "layers": layers,
        "releases": {
            r["vllm"]: {
                **{k: r[k] for k in ("torch", "ray", "auto_added", "requirements_added", "left_to_device", "skipped")},
                "layers": order[r["vllm"]],
            }
            for r in rels
        },
    }


def requirements(p: dict, layer: str) -> list[str]:
    return [f"{n}=={v}" for n, v in p["layers"][layer]["wheels"].items()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm", action="append", required=True, help="a shipped release (repeatable), or 'all'")
    ap.add_argument("--vllm-wheel-dir", type=Path, help="where vllm-X-*.whl lie: its requirements are read too")
    ap.add_argument("--wheels-dir", type=Path, help="downloaded wheels: their requirements the device lacks are added")
    ap.add_argument("--full-torch-stack", action="store_true", help="carry every CUDA library that differs")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true", help="the whole plan as JSON (default)")
    g.add_argument("--requirements", metavar="LAYER", help="NAME==VERSION lines of one layer")
    g.add_argument("--layers", action="store_true", help="one line per layer: NAME KIND RELEASES")
    a = ap.parse_args(argv)
    vllms = releases() if a.vllm == ["all"] else a.vllm
    p = plan(vllms, wheel_dir=a.vllm_wheel_dir, full_stack=a.full_torch_stack, wheels_dir=a.wheels_dir)
    if a.requirements:
        if a.requirements not in p["layers"]:
            print(f"no layer {a.requirements}: {', '.join(p['layers'])}", file=sys.stderr)
            return 2
        print("\n".join(requirements(p, a.requirements)))
    elif a.layers:
        for name, lay in p["layers"].items():
            print(name, lay["kind"], ",".join(lay["releases"]))
    else:
        print(json.dumps(p, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
