"""Generate the hand-made lock pairs of tests/data/diff/ (run from the repo root):

    .venv/bin/python tests/data/diff/make_cases.py

Every lock is built from builder.resolve.lockfile's dataclasses and written with
format_lock, so it is a real lock (the parser reads it back).  ``base.json`` is a
small base manifest (numpy 1.26.4 with a pyarrow built against numpy 1.x, torch
for CUDA 13, glibc 2.35, cp312).  Each ``<case>/`` holds ``old.lock`` and
``new.lock``; ``expected.*`` are the golden outputs (tests/test_diff.py rewrites
them with UPDATE_GOLDEN=1; review the git diff of the goldens before committing).
``handwritten.{txt,md}`` (groups 1 and 2) are written by hand, never by code: when a
change here alters them, rewrite them by hand from the inputs.
"""

from __future__ import annotations

import copy
import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from builder.resolve.lockfile import LockEntry, LockFile, WheelRef, format_lock  # noqa: E402
from builder.resolve.manifest import BaseManifest, DistFacts, Distribution  # noqa: E402
from builder.util import sha256_bytes  # noqa: E402

HERE = Path(__file__).resolve().parent


def h(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


def facts(binary=False, ext=0, np1=0, np2=0, glibc=None, abi="none") -> DistFacts:
    return DistFacts(binary=binary, extensions=ext, numpy_abi={"1": np1, "2": np2},
                     glibc=glibc, python_abi=abi)


def native(ext=4, glibc="2.17", abi="cp312", np1=0, np2=0) -> DistFacts:
    return facts(True, ext, np1, np2, glibc, abi)


def entry(name, version, f=None, via=("ray",), base=None, salt="") -> LockEntry:
    f = f or facts()
    tag = f"{f.python_abi}-{f.python_abi}-manylinux_2_17_x86_64" if f.binary else "py3-none-any"
    fn = f"{name.replace('-', '_')}-{version}-{tag}.whl"
    sha = h(name, version, salt)
    return LockEntry(
        name=name, version=version, hashes=[sha], via=list(via),
        wheel=WheelRef(url=f"https://files.pythonhosted.org/packages/{sha[:2]}/{sha[2:4]}/{fn}", sha256=sha),
        facts=f, base_version=base,
    )


def base_manifest() -> BaseManifest:
    d = {
        "vllm": ("vllm", "0.26.0", native(ext=40, glibc="2.28", abi="abi3")),
        "torch": ("torch", "2.9.0+cu130", native(ext=30, glibc="2.28", abi="cp312", np2=1)),
        "numpy": ("numpy", "1.26.4", native(ext=12, glibc="2.17", abi="cp312")),
        "pyarrow": ("pyarrow", "14.0.2", native(ext=20, glibc="2.17", abi="cp312", np1=1)),
        "transformers": ("transformers", "4.57.1", facts()),
        "requests": ("requests", "2.32.3", facts()),
        "packaging": ("packaging", "24.2", facts()),
        "pydantic-core": ("pydantic_core", "2.33.2", native(ext=1, glibc="2.17")),
    }
    return BaseManifest(
        image_ref="vllm/vllm-openai:v0.26.0",
        image_digest="sha256:" + h("image", "0.26.0"),
        os="Ubuntu 22.04.5 LTS", glibc="2.35", python_version="3.12", python_abi="cp312",
        site_packages="/usr/local/lib/python3.12/dist-packages", cuda="13.0",
        platform="x86_64-manylinux_2_35", provenance_kind="reconstructed",
        provenance_method="hand-made for tests/data/diff (make_cases.py)",
        distributions={k: Distribution(n, v, f) for k, (n, v, f) in d.items()},
    )


def header(manifest_sha: str, **over) -> dict:
    hd = {
        "build-image-lock": "1",
        "tool": "build-image 0.1.0 (uv 0.13.9)",
        "vllm": "0.26.0",
        "base-ref": "vllm/vllm-openai:v0.26.0",
        "base-digest": "sha256:" + h("image", "0.26.0"),
        "base-manifest-sha256": manifest_sha,
        "python": "3.12",
        "platform": "x86_64-manylinux_2_35",
        "inputs-sha256": h("inputs", "old"),
    }
    hd.update(over)
    return hd


def old_lock(manifest_sha: str) -> LockFile:
    es = [
        entry("ray", "2.50.0", native(ext=52), via=("-r overlay",)),
        entry("aiohttp", "3.11.10", native(ext=6)),
        entry("aiosignal", "1.3.1"),
        entry("click", "8.1.7"),
        entry("fastapi", "0.115.0", via=("ray",)),
        entry("starlette", "0.38.6", via=("fastapi",)),
        entry("filelock", "3.16.1"),
        entry("frozenlist", "1.5.0", native(ext=2), via=("aiohttp", "aiosignal")),
        entry("grpcio", "1.66.0", native(ext=1)),
        entry("jsonschema", "4.23.0"),
        entry("msgpack", "1.1.0", native(ext=1)),
        entry("pyyaml", "6.0.2", native(ext=1)),
        entry("requests", "2.32.4", via=("ray",), base="2.32.3"),
    ]
    return LockFile(header=header(manifest_sha), overlay=["ray[serve]"], allow_abi_change={}, entries=es)


def replace_entry(lock: LockFile, name: str, new: LockEntry | None) -> None:
    lock.entries = [e for e in lock.entries if e.name != name] + ([new] if new else [])


def cases(manifest_sha: str) -> dict[str, tuple[LockFile, LockFile | str]]:
    old = old_lock(manifest_sha)
    out: dict[str, tuple[LockFile, LockFile | str]] = {}

    def derive() -> LockFile:
        n = copy.deepcopy(old)
        n.header["inputs-sha256"] = h("inputs", "new")
        return n

    # 1: changes the gate rejects (one per rule)
    n = derive()
    n.overlay.append("numpy>=2")
    n.entries += [
        entry("numpy", "2.2.6", native(ext=12), via=("-r overlay",), base="1.26.4"),
        entry("torch", "2.9.1+cu130", native(ext=30, glibc="2.28", np2=1), via=("vllm",), base="2.9.0+cu130"),
        entry("fastwheel", "1.0.0", native(ext=3, glibc="2.39"), via=("ray",)),
        entry("oldwheel", "0.9.0", native(ext=1, abi="cp313"), via=("ray",)),
        entry("cupy-cuda12x", "13.3.0", native(ext=5, np2=2), via=("ray",)),
    ]
    out["g1_rejected"] = (old, n)

    # 1 (allowed): the numpy move with an escape hatch in the header
    n = derive()
    n.overlay.append("numpy>=2")
    n.allow_abi_change = {"numpy": "pyarrow rebuilt in-house against numpy 2 (TICKET-42)"}
    n.entries.append(entry("numpy", "2.2.6", native(ext=12), via=("-r overlay",), base="1.26.4"))
    out["g1_allowed"] = (old, n)

    # 2: base-image moves: a new move up, a move down, a reverted move
    n = derive()
    n.overlay.append("transformers==4.58.0")
    n.entries.append(entry("transformers", "4.58.0", via=("-r overlay",), base="4.57.1"))
    n.entries.append(entry("packaging", "24.1", via=("ray",), base="24.2"))
    replace_entry(n, "requests", None)
    out["g2_base_moves"] = (old, n)

    # 3: native distributions: added, removed, turned native, rebuilt with other facts
    n = derive()
    n.entries.append(entry("orjson", "3.10.12", native(ext=1), via=("fastapi",)))
    replace_entry(n, "msgpack", None)
    replace_entry(n, "frozenlist", entry("frozenlist", "1.5.0", native(ext=2, glibc="2.28"),
                                          via=("aiohttp", "aiosignal"), salt="manylinux_2_28"))
    replace_entry(n, "jsonschema", entry("jsonschema", "4.23.0", native(ext=1), salt="native"))
    out["g3_native"] = (old, n)

    # 4: major bumps (and a 0.x minor, which counts as major)
    n = derive()
    replace_entry(n, "click", entry("click", "9.0.0"))
    replace_entry(n, "fastapi", entry("fastapi", "0.116.1", via=("ray",)))
    replace_entry(n, "grpcio", entry("grpcio", "2.0.0", native(ext=1, glibc="2.28")))
    out["g4_major"] = (old, n)

    # 5: minor / patch bumps, one downgrade
    n = derive()
    replace_entry(n, "aiohttp", entry("aiohttp", "3.11.11", native(ext=6)))
    replace_entry(n, "filelock", entry("filelock", "3.17.0"))
    replace_entry(n, "starlette", entry("starlette", "0.38.5", via=("fastapi",)))
    replace_entry(n, "ray", entry("ray", "2.50.1", native(ext=52), via=("-r overlay",)))
    out["g5_minor"] = (old, n)

    # 6: pure-Python added / removed
    n = derive()
    n.entries.append(entry("typing-inspection", "0.4.0", via=("fastapi",)))
    replace_entry(n, "aiosignal", None)
    out["g6_pure"] = (old, n)

    # 7: noise only: a hash-only change, a '# via' change, header churn, a reordering
    n = derive()
    n.header["tool"] = "build-image 0.1.1 (uv 0.13.9)"
    replace_entry(n, "pyyaml", entry("pyyaml", "6.0.2", native(ext=1), salt="re-upload"))
    replace_entry(n, "click", entry("click", "8.1.7", via=("ray", "uvicorn")))
    text = format_lock(n)
    # hand-edit: move the 'starlette' block above 'aiohttp' (reordering)
    lines = text.splitlines(keepends=True)
    start = next(i for i, ln in enumerate(lines) if ln.startswith("starlette=="))
    end = start + 1
    while end < len(lines) and lines[end].startswith("    "):
        end += 1
    block = lines[start:end]
    del lines[start:end]
    at = next(i for i, ln in enumerate(lines) if ln.startswith("aiohttp=="))
    lines[at:at] = block
    out["g7_noise"] = (old, "".join(lines))

    # a bit of everything, plus the base image / vllm version change on top
    n = derive()
    n.header.update({"vllm": "0.26.1", "base-ref": "vllm/vllm-openai:v0.26.1",
                     "base-digest": "sha256:" + h("image", "0.26.1")})
    n.overlay.append("numpy>=2")
    n.entries += [
        entry("numpy", "2.2.6", native(ext=12), via=("-r overlay",), base="1.26.4"),
        entry("transformers", "4.58.0", via=("ray",), base="4.57.1"),
        entry("orjson", "3.10.12", native(ext=1), via=("fastapi",)),
        entry("typing-inspection", "0.4.0", via=("fastapi",)),
    ]
    replace_entry(n, "click", entry("click", "9.0.0"))
    replace_entry(n, "filelock", entry("filelock", "3.17.0"))
    replace_entry(n, "pyyaml", entry("pyyaml", "6.0.2", native(ext=1), salt="re-upload"))
    out["mixed"] = (old, n)
    return out


def main() -> None:
    m = base_manifest()
    text = m.to_json()
    (HERE / "base.json").write_text(text)
    sha = sha256_bytes(text.encode())
    for name, (old, new) in cases(sha).items():
        d = HERE / name
        d.mkdir(exist_ok=True)
        (d / "old.lock").write_text(format_lock(old))
        (d / "new.lock").write_text(new if isinstance(new, str) else format_lock(new))
        print(f"wrote {d.relative_to(ROOT)}/{{old,new}}.lock")


if __name__ == "__main__":
    main()
