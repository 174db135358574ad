#!/usr/bin/env python3
"""Print what `builder/serving/plan.py:RELEASE_FACTS` holds, read from unpacked vllm wheels.

Usage: scripts/vllm-release-facts.py [DIR ...]
Each DIR is a site-packages-like folder holding ``vllm/config/cache.py`` (KV dtypes, utilization),
``vllm/model_executor/model_loader/__init__.py`` (``LoadFormats``: the ``--load-format`` values) and a
``vllm-X.dist-info``; without arguments, uv's unpacked-wheel cache is searched
(``$UV_CACHE_DIR`` or ~/.cache/uv, ``archive-v0/*``).  Pure reading: ``ast``, no import of vllm.
"""

from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path


def load_formats(root: Path) -> list[str]:
    """The ``LoadFormats`` Literal of ``vllm/model_executor/model_loader/__init__.py`` (the ``--load-format``
    values)."""
    src = root / "vllm" / "model_executor" / "model_loader" / "__init__.py"
    if not src.is_file():
        return []
    for node in ast.walk(ast.parse(src.read_text())):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "LoadFormats":
            sl = node.value.slice
            return [e.value for e in (sl.elts if isinstance(sl, ast.Tuple) else [sl])]
    return []


def facts(root: Path) -> tuple[str, float | None, list[str]] | None:
    cache = root / "vllm" / "config" / "cache.py"
    infos = sorted(root.glob("vllm-*.dist-info"))
    if not cache.is_file() or not infos:
        return None
    version = infos[0].name[len("vllm-"):-len(".dist-info")]
    tree = ast.parse(cache.read_text())
    util, dtypes = None, []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "CacheDType":
            sl = node.value.slice
            dtypes = [e.value for e in (sl.elts if isinstance(sl, ast.Tuple) else [sl])]
        if (isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "gpu_memory_utilization"
                and isinstance(node.value, ast.Call)):
            for kw in node.value.keywords:
                if kw.arg == "default" and isinstance(kw.value, ast.Constant):
                    util = kw.value.value
    return version, util, dtypes


def main(argv: list[str]) -> int:
    roots = [Path(a) for a in argv]
    if not roots:
        cache = Path(os.environ.get("UV_CACHE_DIR") or Path.home() / ".cache" / "uv") / "archive-v0"
        roots = sorted(p for p in cache.glob("*") if p.is_dir())
    out: dict[str, dict] = {}
    for root in roots:
        got = facts(root)
        if got and got[0] not in out:
            out[got[0]] = {"default_gpu_memory_utilization": got[1], "kv_cache_dtypes": got[2],
                           "load_formats": load_formats(root), "from": str(root)}
    print(json.dumps(dict(sorted(out.items())), indent=2))
    return 0 if out else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
