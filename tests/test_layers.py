"""The package's shape: what the import-linter contracts in pyproject.toml cannot say.

The layers (``commands/, cli -> pipeline, upgrade -> serving/ -> image/ -> patching/ -> resolve/ ->
ground floor``: a module imports only from its own layer or the ones below it, every module in a
layer) and the absence of import circles are contracts of ``lint-imports`` (``[tool.importlinter]``
in pyproject.toml, run by scripts/test.sh after ruff); the tests below check that the contracts
catch what they forbid.  Here: a function-level import of the package says why (a comment on its
line), no module imports another's private name, and each folder says what it offers.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

from builder.util import project_root

ROOT = project_root()
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    in_function: bool


def modules(root: Path) -> dict[str, Path]:
    """``builder.x.y`` -> file, for every module of the package under ``root`` (data excluded)."""
    out = {}
    for path in sorted((root / "builder").rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        if rel.parts[1:2] == ("data",):
            continue
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


def _walk(node: ast.AST, in_function: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    for child in ast.iter_child_nodes(node):
        yield child, in_function
        yield from _walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))


def imports(root: Path) -> list[Import]:
    """Every import of a package module by a package module (``from builder.x import y`` names the
    module ``builder.x.y`` when there is one, else ``builder.x``)."""
    mods = modules(root)
    found = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node, in_function in _walk(tree):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "builder":
                targets = [
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module for a in node.names
                ]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.split(".")[0] == "builder"]
            for target in targets:
                while target not in mods and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target != name:
                    found.append(Import(name, target, node.lineno, in_function))
    return found


def unexplained_lazy_imports(root: Path) -> list[str]:
    """Function-level imports of package modules outside ``builder/commands/`` without a comment on
    their line saying why (``build-image --help`` imports every command module, so commands load
    their stage when they run; elsewhere the header shows a module's neighbours)."""
    out = []
    mods = modules(root)
    for imp in imports(root):
        if not imp.in_function or imp.importer.startswith("builder.commands."):
            continue
        line = mods[imp.importer].read_text(encoding="utf-8").splitlines()[imp.line - 1]
        if "#" not in line:
            out.append(f"{imp.importer} line {imp.line}: {line.strip()}")
    return out


def private_imports(root: Path) -> list[str]:
    """``from builder.x import _name``: a module reaching into another's private names (a name both
    need is public in the module that owns it)."""
    out = []
    for name, path in modules(root).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("builder"):
                out += [
                    f"{name} line {node.lineno}: {a.name} from {node.module}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    return out


#: the most lines a function of the package may span, ``def`` to its last line (docs/design.md)
MAX_FUNCTION_LINES = 80


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Every function or method under ``root``/builder longer than ``limit`` lines, from its ``def`` line to its
    last (a signature, a docstring and a long literal count: ruff's statement count does not see them)."""
    out = []
    for name, path in modules(root).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    out.append(f"{name}.{node.name} (line {node.lineno}): {lines} lines")
    return out


# ----------------------------------------------------------------------------- the package itself


def test_no_function_is_longer_than_80_lines():
    assert long_functions(ROOT) == []


def test_a_long_function_is_found_signature_and_literals_included(tmp_path):
    pkg = tmp_path / "builder"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""x"""\n')
    args = "".join(f"    a{i},\n" for i in range(72))
    body = "    return [\n" + "".join(f"        {i},\n" for i in range(5)) + "    ]\n"
    (pkg / "a.py").write_text(f"def short():\n    return 1\n\n\ndef wide(\n{args}):\n{body}")
    assert long_functions(tmp_path) == ["builder.a.wide (line 5): 81 lines"]
    assert long_functions(tmp_path, limit=81) == []


def test_no_module_imports_another_modules_private_names():
    assert private_imports(ROOT) == []


def test_a_private_import_is_found(tmp_path):
    pkg = tmp_path / "builder"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""x"""\n')
    (pkg / "a.py").write_text("def _helper():\n    return 1\n")
    (pkg / "b.py").write_text("from builder.a import _helper\nfrom builder import a as _a\n")
    assert private_imports(tmp_path) == ["builder.b line 1: _helper from builder.a"]


def test_function_level_imports_of_the_package_say_why():
    assert unexplained_lazy_imports(ROOT) == []


def test_every_folder_says_what_it_offers():
    for folder in ("resolve", "patching", "image", "serving", "commands"):
        doc = ast.get_docstring(ast.parse((ROOT / "builder" / folder / "__init__.py").read_text(encoding="utf-8")))
        assert doc, f"builder/{folder}/__init__.py has no docstring"


# ----------------------------------------------------------------------------- the checks catch what they forbid


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in {"builder/__init__.py": "", **files}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` with the project's contracts on the made-up package under ``root``."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _ground_floor() -> list[str]:
    """The ground floor's modules as pyproject.toml's layers contract names them (a module added there is
    added to the made-up package too)."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    layers = next(c["layers"] for c in conf["tool"]["importlinter"]["contracts"] if c["type"] == "layers")
    return [m.strip() for m in layers[-1].split(":")]


def _layered_package(tmp_path: Path, files: dict[str, str]) -> Path:
    """A package named ``builder`` with every child the layers contract names (all empty), plus ``files``."""
    children = ["cli", "pipeline", "upgrade", *_ground_floor()]
    folders = ["commands", "serving", "image", "patching", "resolve"]
    base = {f"builder/{c}.py": "" for c in children} | {f"builder/{f}/__init__.py": "" for f in folders}
    return _package(tmp_path, {**base, **files})


@pytest.mark.skipif(not LINT_IMPORTS.is_file(), reason="import-linter is in the test extra")
def test_the_contracts_keep_this_package_and_catch_an_upward_import_at_the_top_or_in_a_function(tmp_path):
    kept = _lint_imports(
        _layered_package(
            tmp_path / "ok",
            {
                "builder/resolve/lock.py": "from builder.errors import X\n",
                "builder/image/render.py": "from builder.resolve.lock import L\n",
                "builder/pipeline.py": "def f():\n    from builder.upgrade import u  # same layer\n",
            },
        )
    )
    assert kept.returncode == 0, kept.stdout + kept.stderr
    broken = _lint_imports(
        _layered_package(
            tmp_path / "up",
            {
                "builder/image/render.py": "",
                "builder/serving/kuberay.py": "import builder.image.render\n",
                "builder/patching/series.py": "def f():\n    from builder.image import render\n",
            },
        )
    )
    assert broken.returncode == 1 and "builder.patching.series -> builder.image.render (l.2)" in broken.stdout, (
        broken.stdout
    )
    stray = _lint_imports(_layered_package(tmp_path / "stray", {"builder/stray.py": ""}))
    assert stray.returncode != 0 and "builder.stray" in stray.stdout + stray.stderr


@pytest.mark.skipif(not LINT_IMPORTS.is_file(), reason="import-linter is in the test extra")
def test_the_contracts_catch_a_circle_through_function_level_imports(tmp_path):
    circle = _lint_imports(
        _layered_package(
            tmp_path,
            {
                "builder/resolve/a.py": "import builder.resolve.b\n",
                "builder/resolve/b.py": "def f():\n    from builder.resolve import a\n",
            },
        )
    )
    assert circle.returncode == 1 and "No cycles are allowed in builder.resolve" in circle.stdout, circle.stdout
    assert "- .b -> .a (1 import)" in circle.stdout, circle.stdout


def test_an_unexplained_function_level_import_is_found(tmp_path):
    root = _package(
        tmp_path,
        {
            "builder/image/__init__.py": "",
            "builder/image/render.py": "def f():\n    from builder.serving import kuberay\n",
            "builder/image/build.py": "def f():\n    from builder.image import render  # the stage loads when it "
            "runs\n",
            "builder/serving/__init__.py": "",
            "builder/serving/kuberay.py": "",
            "builder/commands/__init__.py": "",
            "builder/commands/x.py": "def f():\n    from builder.image import render\n",
        },
    )
    lazy = unexplained_lazy_imports(root)
    assert lazy == ["builder.image.render line 2: from builder.serving import kuberay"]


def test_each_multi_stage_commands_request_is_frozen():
    """A command builds its request once (docs/design.md); a stage cannot change what was asked."""
    import dataclasses

    from builder.pipeline import PipelineRequest
    from builder.serving.cutover import PromoteRequest, RollbackRequest
    from builder.serving.smoke import SmokeConfig
    from builder.upgrade import UpgradeRequest

    for cls, kw in (
        (UpgradeRequest, {"from_version": "1.0", "to_version": "2.0"}),
        (PromoteRequest, {"source": "r/x@sha256:" + "a" * 64, "to": "r/x:prod", "spec": None, "lock": None}),
        (RollbackRequest, {"to": "r/x:prod"}),
        (SmokeConfig, {"model": "/m"}),
    ):
        req = cls(**kw)
        with pytest.raises(dataclasses.FrozenInstanceError):
            req.out_dir = "elsewhere"
    assert PipelineRequest.__dataclass_params__.frozen
