"""List the functions of builder/ longer than a limit (default 80 lines), longest first."""
import ast
import sys
from pathlib import Path


def long_functions(root: Path, limit: int) -> list[tuple[int, str]]:
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    found.append((length, f"{path}:{node.lineno} {node.name}"))
    return sorted(found, reverse=True)


if __name__ == "__main__":
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 80
    rows = long_functions(Path(__file__).resolve().parent.parent / "builder", limit)
    for length, where in rows:
        print(f"{length:5d}  {where}")
    sys.exit(1 if rows else 0)
