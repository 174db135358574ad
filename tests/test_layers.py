"""The package's shape: imports run one way through the layers and never in a circle.

Layers, top to bottom (a module imports only from its own layer or the ones below it)::

    commands/, cli  ->  pipeline, upgrade  ->  serving/  ->  image/  ->  patching/  ->  resolve/  ->  ground floor

Every ``import`` of a ``builder`` module counts, at the top of a file or inside a function
(a function-level import runs later, but it is still a dependency, and two of them hid the
circles this test now forbids).  A module the table below does not place fails the test: a new
module is given its layer when it is added.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from builder.util import project_root

ROOT = project_root()

#: (layer number, name) by the module's place; higher numbers are higher layers
LAYERS = {
    "commands": (6, "commands"),
    "pipeline": (5, "pipeline/upgrade"),
    "serving": (4, "serving"),
    "image": (3, "image"),
    "patching": (2, "patching"),
    "resolve": (1, "resolve"),
    "ground": (0, "ground floor"),
}
GROUND_FLOOR = {"builder", "builder.errors", "builder.util", "builder.spec", "builder.engine", "builder.fetch",
                "builder.credentials", "builder.scratch", "builder.report", "builder.data", "builder.comment_fit",
                "builder.validate", "builder.signals", "builder.values"}
FOLDERS = {"builder.commands": "commands", "builder.serving": "serving", "builder.image": "image",
           "builder.patching": "patching", "builder.resolve": "resolve"}
TOP = {"builder.cli": "commands", "builder.pipeline": "pipeline", "builder.upgrade": "pipeline"}


def layer_of(module: str) -> tuple[int, str] | None:
    """The layer of a ``builder`` module, None for one the table does not place."""
    if module in GROUND_FLOOR:
        return LAYERS["ground"]
    if module in TOP:
        return LAYERS[TOP[module]]
    for folder, key in FOLDERS.items():
        if module == folder or module.startswith(folder + "."):
            return LAYERS[key]
    return None


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
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                           for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.split(".")[0] == "builder"]
            for target in targets:
                while target not in mods and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target != name:
                    found.append(Import(name, target, node.lineno, in_function))
    return found


def upward_imports(root: Path) -> list[str]:
    """Each import from a higher layer (and each module no layer holds), as a message."""
    problems = [f"{m}: no layer holds it (add it to tests/test_layers.py)" for m in modules(root)
                if layer_of(m) is None]
    for imp in imports(root):
        have, want = layer_of(imp.importer), layer_of(imp.imported)
        if have and want and want[0] > have[0]:
            problems.append(f"{imp.importer} (line {imp.line}, {have[1]}) imports {imp.imported} ({want[1]}), "
                            "a higher layer")
    return problems


def circles(root: Path) -> list[list[str]]:
    """The import circles between package modules (strongly connected sets of two or more), sorted."""
    graph: dict[str, set[str]] = {m: set() for m in modules(root)}
    for imp in imports(root):
        graph[imp.importer].add(imp.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


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


# ----------------------------------------------------------------------------- the package itself


def test_no_module_imports_from_a_higher_layer():
    assert upward_imports(ROOT) == []


def test_no_import_circle_between_modules():
    assert circles(ROOT) == []


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


def test_an_upward_import_is_found_at_the_top_or_in_a_function(tmp_path):
    root = _package(tmp_path, {
        "builder/errors.py": "",
        "builder/resolve/__init__.py": "",
        "builder/resolve/lock.py": "from builder.errors import X\n",
        "builder/image/__init__.py": "",
        "builder/image/render.py": "from builder.resolve.lock import L\n",
        "builder/serving/__init__.py": "",
        "builder/serving/kuberay.py": "import builder.image.render\n",
        "builder/patching/__init__.py": "",
        "builder/patching/series.py": "def f():\n    from builder.image import render\n",
        "builder/stray.py": "",
    })
    problems = upward_imports(root)
    assert problems == [
        "builder.stray: no layer holds it (add it to tests/test_layers.py)",
        "builder.patching.series (line 2, patching) imports builder.image.render (image), a higher layer",
    ]


def test_a_circle_is_found_through_function_level_imports(tmp_path):
    root = _package(tmp_path, {
        "builder/image/__init__.py": "",
        "builder/image/render.py": "def f():\n    from builder.serving import kuberay\n",
        "builder/image/provenance.py": "from builder.image.render import x\n",
        "builder/serving/__init__.py": "",
        "builder/serving/kuberay.py": "from builder.image.provenance import y\n",
        "builder/resolve/__init__.py": "",
        "builder/resolve/a.py": "import builder.resolve.b\n",
        "builder/resolve/b.py": "from builder.resolve import c\n",
        "builder/resolve/c.py": "",
    })
    assert circles(root) == [["builder.image.provenance", "builder.image.render", "builder.serving.kuberay"]]
    lazy = unexplained_lazy_imports(root)
    assert lazy == ["builder.image.render line 2: from builder.serving import kuberay"]


# ----------------------------------------------------------------------------- function length


def _function_lengths():
    spec = importlib.util.spec_from_file_location("function_lengths", ROOT / "scripts" / "function_lengths.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_function_in_builder_is_longer_than_80_lines():
    long = _function_lengths().long_functions(ROOT / "builder", 80)
    assert long == [], "\n".join(f"{n:5d}  {where}" for n, where in long)


def test_the_length_check_counts_a_function_from_def_to_its_last_line(tmp_path):
    (tmp_path / "m.py").write_text("def short():\n    return 1\n\n\ndef long():\n" + "    x = 1\n" * 80)
    assert _function_lengths().long_functions(tmp_path, 80) == [(81, f"{tmp_path / 'm.py'}:5 long")]
