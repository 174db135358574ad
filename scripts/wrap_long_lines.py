#!/usr/bin/env python3
"""Wrap the lines of Python files that are longer than the linter's limit (120), without changing
what the code means: ``scripts/wrap_long_lines.py FILE...`` (prints, per file, long lines before
and after).

Per long line, the first of these that applies:

* a break after a comma inside brackets when the rest then fits, aligned with the bracket;
* a string literal that crosses the limit is split at a space into two adjacent literals
  (implicit concatenation; a part without placeholders loses its ``f``), the second aligned
  with the first (after a break before the string, when it starts late on the line);
* a trailing comment moves onto its own line above;
* a break after the last comma that fits, or before a low-precedence operator (``else``, ``or``,
  ``and``, a ternary ``if``, ``+``, ``==``, ``in``), parenthesizing the expression when it is not
  inside brackets;
* a comment line is re-flowed.

Every change is kept only if the file's AST (``ast.dump``, positions left out) stays the same,
so behaviour cannot change; what the tool cannot wrap (docstrings, verbatim data in
multi-line strings, long names) is left to a person.
"""
import ast
import io
import sys
import tokenize
from pathlib import Path

LIMIT = 120


def tokens_of(src):
    return list(tokenize.generate_tokens(io.StringIO(src).readline))


def string_split_points(tok: str):
    """Offsets in the token text where it may be split (after a space), with the prefix."""
    i = 0
    while tok[i] not in "'\"":
        i += 1
    prefix = tok[:i]
    q = tok[i]
    if tok[i:i + 3] in ('"""', "'''"):
        return prefix, None, []
    body_start, body_end = i + 1, len(tok) - 1
    is_f = "f" in prefix.lower()
    depth = 0
    points = []
    j = body_start
    while j < body_end:
        c = tok[j]
        if c == "\\" and "r" not in prefix.lower():
            j += 2
            continue
        if is_f:
            if c in "{}" and tok[j:j + 2] in ("{{", "}}"):
                j += 2
                continue
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
        if c == " " and depth == 0 and j + 1 < body_end:
            points.append(j + 1)  # split after the space
        j += 1
    return prefix, q, points


def split_string_line(lines, tokens, lineno):
    """Split the string token on ``lineno`` that crosses the limit; True when done."""
    line = lines[lineno - 1]
    depth = 0
    for t in tokens:
        if t.start[0] > lineno:
            break
        if t.type == tokenize.OP and t.string in "([{":
            depth += 1
        elif t.type == tokenize.OP and t.string in ")]}":
            depth -= 1
        if t.type != tokenize.STRING or t.start[0] != lineno or t.end[0] != lineno:
            continue
        if depth <= 0:
            continue
        col0, col1 = t.start[1], t.end[1]
        if col1 <= LIMIT - 1 and len(line.rstrip("\n")) > LIMIT:
            # this string ends before the limit: only split a later one
            continue
        prefix, q, points = string_split_points(t.string)
        if q is None:
            continue
        # the first part must end (with its closing quote) at or before LIMIT
        good = [p for p in points if col0 + p + 1 <= LIMIT and p > len(prefix) + 1 + 8 and len(t.string) - p > 12]
        if not good:
            continue
        p = max(good)
        first = t.string[:p] + q
        rest = prefix + q + t.string[p:]
        if "f" in prefix.lower():  # a part without placeholders need not be an f-string
            plain = prefix.replace("f", "").replace("F", "")
            if "{" not in first and "}" not in first:
                first = plain + first[len(prefix):]
            if "{" not in rest and "}" not in rest:
                rest = plain + rest[len(prefix):]
        indent = " " * col0
        new_line = line[:col0] + first + "\n" + indent + rest + line[col1:]
        lines[lineno - 1:lineno] = new_line.splitlines(keepends=True)
        return True
    return False


def _closing(tokens, idx):
    """Index of the token closing the bracket that is innermost-open at token ``idx``."""
    depth = 0
    for j in range(idx + 1, len(tokens)):
        t = tokens[j]
        if t.type == tokenize.OP and t.string in "([{":
            depth += 1
        elif t.type == tokenize.OP and t.string in ")]}":
            if depth == 0:
                return j
            depth -= 1
    return None


def break_after_comma(lines, tokens, lineno, mode="any", before=None):
    line = lines[lineno - 1]
    stack = []  # open brackets: [token, alignment column]
    cands = []
    prev = None
    for idx, t in enumerate(tokens):
        if t.start[0] > lineno:
            break
        if (stack and prev is not None and stack[-1][0] is prev and t.start[0] == prev.start[0]
                and t.type not in (tokenize.NL, tokenize.COMMENT)):
            stack[-1][1] = t.start[1]  # the first token after the bracket, on its line: the alignment
        if t.type == tokenize.OP and t.string in "([{":
            stack.append([t, None])
        elif t.type == tokenize.OP and t.string in ")]}":
            if stack:
                stack.pop()
        if t.start[0] == lineno and t.type == tokenize.OP and t.string == "," and stack and t.end[1] <= LIMIT:
            nxt = tokens[idx + 1] if idx + 1 < len(tokens) else None
            if nxt is None or nxt.start[0] != lineno or nxt.type in (tokenize.NL, tokenize.COMMENT, tokenize.NEWLINE):
                prev = t
                continue
            col = stack[-1][1] if stack[-1][1] is not None else stack[-1][0].start[1] + 1
            close = _closing(tokens, idx)
            opener = stack[-1][0]
            if close is not None and tokens[close].start[0] == lineno and opener.start[0] == lineno \
                    and tokens[close].start[1] - opener.end[1] < 50:
                prev = t
                continue  # a small bracket within the line: not the place to break
            if before is not None and t.end[1] > before:
                prev = t
                continue
            if col < nxt.start[1] and col < t.end[1]:
                cands.append((len(stack), t.end[1], col, nxt.start[1]))
        prev = t
    if not cands:
        return False
    if mode == "fits":
        fit = [c for c in cands if c[2] + len(line.rstrip("\n")) - c[3] <= LIMIT]
        if not fit:
            return False
        _, cut, col, nxt_col = max(fit, key=lambda c: (-c[0], c[1]))
    else:
        _, cut, col, nxt_col = max(cands, key=lambda c: c[1])
    rest = line[nxt_col:]
    following = lines[lineno] if lineno < len(lines) else ""
    if (mode in ("any", "fits") and rest.rstrip().endswith(",") and "#" not in rest and following.strip()
            and len(following) - len(following.lstrip()) == col
        and not following.lstrip().startswith(("#", ")", "]", "}"))):
        lines[lineno - 1:lineno + 1] = [line[:cut].rstrip() + "\n",
                                        " " * col + rest.rstrip() + " " + following.lstrip()]
        return True
    new = line[:cut].rstrip() + "\n" + " " * col + rest
    lines[lineno - 1:lineno] = new.splitlines(keepends=True)
    return True


def break_before_late_string(lines, tokens, lineno):
    """A string that crosses the limit but starts late on the line: break at a comma before it first."""
    for t in tokens:
        if t.start[0] > lineno:
            break
        if t.type == tokenize.STRING and t.start[0] == lineno == t.end[0] and t.end[1] > LIMIT:
            if t.start[1] < 60:
                return False
            return break_after_comma(lines, tokens, lineno, "plain", before=t.start[1])
    return False


OPS = ("else", "or", "and", "if", "+", "==", "in", "for")


def break_before_operator(lines, tokens, lineno):
    """Break before a low-precedence operator (``else``, ``or``, ``and``, a ternary ``if``, ``+``);
    at bracket depth 0 the expression is parenthesized first."""
    line = lines[lineno - 1]
    if not line.rstrip().endswith((":", ")", "]", "}")) and line.rstrip()[-1:] in ("\\",):
        return False
    stack = []
    ops = []  # (depth, priority, token index)
    line_tokens = []
    for idx, t in enumerate(tokens):
        if t.start[0] > lineno:
            break
        if t.start[0] == lineno and t.type not in (tokenize.INDENT, tokenize.DEDENT):
            line_tokens.append((idx, t, len(stack)))
        if t.type == tokenize.OP and t.string in "([{":
            stack.append(t)
        elif t.type == tokenize.OP and t.string in ")]}":
            if stack:
                stack.pop()
    if not line_tokens:
        return False
    # a logical line that starts on an earlier line at depth 0 cannot be parenthesized here
    starts_here = line_tokens[0][1].start[1] == len(line) - len(line.lstrip())
    for pos, (idx, t, d) in enumerate(line_tokens):
        if (t.string in OPS and (t.type == tokenize.NAME or t.string in ("+", "==")) and t.start[1] <= LIMIT - 1
                and pos > 0):
            if t.string == "if" and pos == 0:
                continue
            if t.string == "for":
                continue
            ops.append((d, OPS.index(t.string), idx, t))
    if not ops:
        return False
    def inner_ok(idx):
        """Not inside a short bracket of this line, nor after a ``for`` of the same bracket (unless ``if``)."""
        depth = 0
        for j in range(idx - 1, -1, -1):
            u = tokens[j]
            if u.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
                return True
            if u.type == tokenize.OP and u.string in ")]}":
                depth += 1
            elif u.type == tokenize.OP and u.string in "([{":
                if depth == 0:
                    close = _closing(tokens, j)
                    if (u.start[0] == lineno and close is not None and tokens[close].start[0] == lineno
                            and tokens[close].start[1] - u.end[1] < 50):
                        return False
                    return True
                depth -= 1
            elif depth == 0 and u.type == tokenize.NAME and u.string == "for" and tokens[idx].string != "if":
                return False
        return True

    ops = [o for o in ops if inner_ok(o[2]) and o[3].start[1] > 40]
    if not ops:
        return False
    low = min(o[0] for o in ops)
    ops = [o for o in ops if o[0] == low]
    if not ops:
        return False
    best_prio = min(o[1] for o in ops)
    d, _, idx, t = max((o for o in ops if o[1] == best_prio), key=lambda o: o[3].start[1])
    col_op = t.start[1]
    if d > 0:
        # the innermost bracket open at the operator: align with its first token
        depth = 0
        opener = None
        for j in range(idx - 1, -1, -1):
            u = tokens[j]
            if u.type == tokenize.OP and u.string in ")]}":
                depth += 1
            elif u.type == tokenize.OP and u.string in "([{":
                if depth == 0:
                    opener = j
                    break
                depth -= 1
        if opener is None:
            return False
        o = tokens[opener]
        nxt = tokens[opener + 1]
        col = nxt.start[1] if nxt.start[0] == o.start[0] else o.start[1] + 4
        if o.start[0] != lineno and o.start[0] > lineno:
            return False
        new = line[:col_op].rstrip() + "\n" + " " * col + line[col_op:]
        lines[lineno - 1:lineno] = new.splitlines(keepends=True)
        return True
    if not starts_here:
        return False
    # depth 0: parenthesize the expression the operator belongs to
    toks = [t for _, t, _ in line_tokens]
    first = toks[0]
    start = None
    if first.string in ("if", "elif", "while", "return", "assert") and first.type == tokenize.NAME:
        start = toks[1].start[1]
    else:
        for k, u in enumerate(toks):
            if u.type == tokenize.OP and u.string in ("=", "+=", "-=", "|=") and k + 1 < len(toks):
                start = toks[k + 1].start[1]
                break
    if start is None or start >= col_op:
        return False
    end_tok = None
    for u in reversed(toks):
        if u.type in (tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT):
            continue
        end_tok = u
        break
    if end_tok is None:
        return False
    end = end_tok.start[1] if (end_tok.string == ":" and first.string in ("if", "elif", "while")) else end_tok.end[1]
    if end <= col_op:
        return False
    text = line.rstrip("\n")
    indent = start + 1
    if first.string in ("if", "elif", "while"):
        indent = (len(line) - len(line.lstrip())) + 8  # not the body's indentation
    new = (text[:start] + "(" + text[start:col_op].rstrip() + "\n" + " " * indent + text[col_op:end] + ")"
           + text[end:] + "\n")
    lines[lineno - 1:lineno] = new.splitlines(keepends=True)
    return True


def move_trailing_comment(lines, tokens, lineno):
    line = lines[lineno - 1]
    for t in tokens:
        if t.type == tokenize.COMMENT and t.start[0] == lineno and t.start[1] > 0:
            code = line[:t.start[1]].rstrip()
            if not code.strip() or len(code) > LIMIT:
                return False
            indent = len(line) - len(line.lstrip())
            comment = t.string
            out = []
            for piece in reflow(comment[1:].strip(), indent):
                out.append(" " * indent + piece + "\n")
            lines[lineno - 1:lineno] = out + [code + "\n"]
            return True
    return False


def reflow(text, indent):
    words = text.split(" ")
    out, cur = [], "#"
    for w in words:
        cand = cur + " " + w
        if indent + len(cand) > LIMIT and cur != "#":
            out.append(cur)
            cur = "# " + w
        else:
            cur = cand
    out.append(cur)
    return out


def reflow_comment_line(lines, lineno):
    line = lines[lineno - 1]
    s = line.strip()
    if not s.startswith("#") or s.startswith("#!"):
        return False
    indent = len(line) - len(line.lstrip())
    body = s[1:].strip()
    pieces = reflow(body, indent)
    if len(pieces) < 2:
        return False
    lines[lineno - 1:lineno] = [" " * indent + p + "\n" for p in pieces]
    return True


def long_lines(lines):
    return [i + 1 for i, l in enumerate(lines) if len(l.rstrip("\n")) > LIMIT]


def fix_file(path: Path) -> tuple[int, int, bool]:
    src = path.read_text()
    before = ast.dump(ast.parse(src))
    lines = src.splitlines(keepends=True)
    n0 = len(long_lines(lines))
    for _ in range(50):
        progress = False
        for n in reversed(long_lines(lines)):
            text = "".join(lines)
            try:
                toks = tokens_of(text)
            except (tokenize.TokenError, IndentationError, SyntaxError):
                break
            in_string = any(t.type == tokenize.STRING and t.start[0] < t.end[0] and t.start[0] <= n <= t.end[0]
                            for t in toks)
            if in_string:
                continue
            snapshot = list(lines)
            for step in (lambda: break_after_comma(lines, toks, n, "fits"),
                         lambda: break_before_late_string(lines, toks, n), lambda: split_string_line(lines, toks, n),
                         lambda: move_trailing_comment(lines, toks, n), lambda: break_after_comma(lines, toks, n),
                         lambda: break_before_operator(lines, toks, n), lambda: reflow_comment_line(lines, n)):
                if step():
                    try:
                        ok = ast.dump(ast.parse("".join(lines))) == before
                    except SyntaxError:
                        ok = False
                    if ok:
                        progress = True
                        break
                    lines[:] = snapshot
        if not progress:
            break
    new = "".join(lines)
    ok = ast.dump(ast.parse(new)) == before
    if ok and new != src:
        path.write_text(new)
    return n0, len(long_lines(lines)) if ok else n0, ok


if __name__ == "__main__":
    for f in sys.argv[1:]:
        n0, n1, ok = fix_file(Path(f))
        if n0:
            print(f"{f}: {n0} -> {n1}{'' if ok else ' (AST changed: left alone)'}")
