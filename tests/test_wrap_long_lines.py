"""scripts/wrap_long_lines.py: long lines wrapped, the code's meaning (its AST) unchanged."""

from __future__ import annotations

import ast
import importlib.util

from builder.util import project_root

_spec = importlib.util.spec_from_file_location("wrap_long_lines", project_root() / "scripts" / "wrap_long_lines.py")
W = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(W)

WORDS = " ".join(f"word{i}" for i in range(30))
SOURCE = f'''\
def f(x, items, flag):
    message = str(f"the value {{x}} is not one of the ones this function accepts: {WORDS}, or the rest")
    call(x, "a short argument", another_argument=items, a_keyword_with_a_long_name=flag, yet_another_one=12345678, and_more=True)
    ok = x is not None and (isinstance(x, int) or isinstance(x, float)) and x > 0 and flag and items and len(items) > 2 + x
    result = sorted(items) if flag else sorted(i for i in items if i is not None and i != x and i not in (1, 2, 3, 4, 5))
    return message, ok, result  # a trailing comment that is long enough to push this line past the limit of the linter (120)
'''  # noqa: E501 - the long lines are the test's input


def test_every_line_fits_and_the_ast_is_the_same(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(SOURCE)
    assert [len(line) > 120 for line in SOURCE.splitlines()] == [False] + [True] * 5
    before, after, ok = W.fix_file(path)
    text = path.read_text()
    assert ok and before == 5 and after == 0, text
    assert max(len(line) for line in text.splitlines()) <= 120
    assert ast.dump(ast.parse(text)) == ast.dump(ast.parse(SOURCE))
    assert "# a trailing comment" in text


def test_what_cannot_be_wrapped_is_left_alone(tmp_path):
    doc = '"""' + WORDS + WORDS + '"""\n'  # a docstring: splitting it would change its value
    path = tmp_path / "d.py"
    path.write_text(doc)
    assert W.fix_file(path) == (1, 1, True)
    assert path.read_text() == doc
