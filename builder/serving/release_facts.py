"""What `plan`, `smoke` and the KubeRay settings take from each vLLM release, read from the release's own
wheel (``ast``, no import of vllm) and kept in the generated ``lockfiles/release-facts.json``:

* ``CacheConfig.gpu_memory_utilization``'s default (``vllm/config/cache.py``).  From 0.34.0 the field
  defaults to None and ``resolved_gpu_memory_utilization`` gives 1.0 with the extensible KV cache (the
  default on CUDA: the cache is sized from measured memory) and ``DEFAULT_GPU_MEMORY_UTILIZATION``
  (0.92) otherwise; the facts then say ``extensible_kv_cache`` and carry both values.
* the ``CacheDType`` literal (the ``--kv-cache-dtype`` values the release accepts);
* the ``LoadFormats`` literal of ``vllm/model_executor/model_loader/__init__.py`` (``--load-format``).

``build-image upgrade --to X -o DIR`` writes X's entry (from the wheel it ports the series against);
``facts_from_wheel`` is the one reader, and a test holds every entry whose wheel is in the download
cache to it.
"""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

from builder.errors import BadInput
from builder.report import render_json
from builder.spec import lockfiles_dir
from builder.util import atomic_write_text, output_lock, sha256_file
from builder.validate import load_json, read_bounded_text

SCHEMA = "build-image/release-facts/v1"
CACHE_PY = "vllm/config/cache.py"
LOADER_PY = "vllm/model_executor/model_loader/__init__.py"


def facts_file() -> Path:
    return lockfiles_dir() / "release-facts.json"


def _literal(tree: ast.AST, name: str) -> list[str]:
    for node in ast.walk(tree):
        target = (
            node.targets[0]
            if isinstance(node, ast.Assign)
            else (node.target if isinstance(node, ast.AnnAssign) else None)
        )
        if getattr(target, "id", None) == name and isinstance(getattr(node, "value", None), ast.Subscript):
            sl = node.value.slice
            return [
                e.value
                for e in (sl.elts if isinstance(sl, ast.Tuple) else [sl])
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            ]
    return []


def _field_default(tree: ast.AST, name: str):
    """The default of a dataclass field ``name: T = V`` or ``= Field(default=V)`` (``...`` when absent)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == name and node.value is not None:
            v = node.value
            if isinstance(v, ast.Call):
                kw = {k.arg: k.value for k in v.keywords}
                v = kw.get("default", v.args[0] if v.args else None)
            if isinstance(v, ast.Constant):
                return v.value
    return ...


def _extensible_value(tree: ast.AST) -> float | None:
    """What ``resolved_gpu_memory_utilization`` returns under ``if self.enable_extensible_kv_cache``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "resolved_gpu_memory_utilization":
            for sub in ast.walk(node):
                if (
                    isinstance(sub, ast.If)
                    and isinstance(sub.test, ast.Attribute)
                    and sub.test.attr == "enable_extensible_kv_cache"
                ):
                    for ret in sub.body:
                        if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Constant):
                            return float(ret.value.value)
    return None


def facts_from_sources(version: str, cache_py: str, loader_py: str | None, source: str) -> dict:
    """A release's entry from the text of its cache.py and model_loader/__init__.py (pure)."""
    try:
        cache = ast.parse(cache_py)
        loader = ast.parse(loader_py) if loader_py else None
    except SyntaxError as exc:
        raise BadInput(f"{source}: {CACHE_PY} or {LOADER_PY} does not parse ({exc}).") from None
    dtypes = _literal(cache, "CacheDType")
    util = _field_default(cache, "gpu_memory_utilization")
    entry: dict = {
        "kv_cache_dtypes": dtypes,
        "load_formats": _literal(loader, "LoadFormats") if loader else [],
        "from": source,
    }
    if isinstance(util, (int, float)):
        entry["default_gpu_memory_utilization"] = float(util)
    elif util is None:
        ext = _extensible_value(cache)
        fallback = _field_default(cache, "DEFAULT_GPU_MEMORY_UTILIZATION")
        if ext is None or not isinstance(fallback, (int, float)):
            raise BadInput(
                f"{source}: gpu_memory_utilization defaults to None and its resolution is not the "
                "extensible-KV-cache rule this reader knows; the plan cannot take its default."
            )
        entry.update(
            default_gpu_memory_utilization=ext,
            extensible_kv_cache=True,
            non_extensible_gpu_memory_utilization=float(fallback),
        )
    else:
        raise BadInput(f"{source}: no default for CacheConfig.gpu_memory_utilization in {CACHE_PY}.")
    if not dtypes:
        raise BadInput(f"{source}: no CacheDType literal in {CACHE_PY}.")
    return entry


def facts_from_wheel(wheel: Path, version: str) -> dict:
    """A release's entry read from its wheel (a ``.whl`` or an unpacked tree)."""
    wheel = Path(wheel)
    if wheel.is_dir():

        def read(rel: str) -> str | None:
            p = wheel / rel
            return read_bounded_text(p, "vllm source") if p.is_file() else None

        source = f"{wheel}"
    else:
        try:
            zf = zipfile.ZipFile(wheel)
        except (OSError, zipfile.BadZipFile) as exc:
            raise BadInput(f"{wheel} is not a readable wheel ({exc}).") from None

        def read(rel: str) -> str | None:
            try:
                info = zf.getinfo(rel)
            except KeyError:
                return None
            if info.file_size > 8 << 20:
                raise BadInput(f"{wheel}: {rel} is larger than a source file ({info.file_size} bytes).")
            return zf.read(info).decode("utf-8", errors="replace")

        source = f"{wheel.name} (sha256 {sha256_file(wheel)})"
    cache_py = read(CACHE_PY)
    if cache_py is None:
        raise BadInput(f"{wheel} has no {CACHE_PY}: not a vllm {version} wheel.")
    return facts_from_sources(version, cache_py, read(LOADER_PY), f"{source}: {CACHE_PY}, {LOADER_PY}")


def load(path: Path | None = None) -> dict[str, dict]:
    """The entries of the facts file (BadInput for a file of another schema)."""
    path = path or facts_file()
    if not path.is_file():
        return {}
    doc = load_json(read_bounded_text(path, "release facts"), f"release facts {path}")
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("releases"), dict):
        raise BadInput(f"release facts {path}: not a {SCHEMA} file.")
    return doc["releases"]


def write_entry(path: Path, version: str, entry: dict) -> Path:
    """Add or replace one release's entry (atomic, under the output lock; other entries stay)."""
    from packaging.version import Version

    with output_lock(path):
        releases = load(path) if path.is_file() else load()
        releases = {**releases, version: entry}
        doc = {
            "schema": SCHEMA,
            "generated": "by `build-image upgrade --to X` from each release's wheel "
            "(builder/serving/release_facts.py); do not edit",
            "releases": {v: releases[v] for v in sorted(releases, key=Version)},
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, render_json(doc, ensure_ascii=True))
    return path
