"""Fit a markdown report under a size limit (GitHub: 65,536 characters per PR comment).

Pure text functions.  A report within the limit is returned as it is.  A longer one is cut
at a line boundary (the report lists the most dangerous group first, so the head is what a
reviewer needs), every construct left open at the cut (a ``` fence, a ``<details>`` block)
is closed, and a pointer to the full report ends it.  The size is counted in UTF-16 code
units, as GitHub's API and JavaScript's ``String.length`` count it (an emoji is 2), so the
result also fits after the workflow prepends its marker line.
"""

from __future__ import annotations

GITHUB_COMMENT_LIMIT = 65536


def size(text: str) -> int:
    """Length in UTF-16 code units (what GitHub's comment limit counts)."""
    return len(text.encode("utf-16-le")) // 2


def _closers(lines: list[str]) -> list[str]:
    """What closes the constructs still open after ``lines`` (innermost first)."""
    stack: list[str] = []
    for line in lines:
        s = line.strip()
        if stack and stack[-1].startswith("```"):
            if s.startswith("```"):
                stack.pop()
            continue
        if s.startswith("```"):
            stack.append("```")
        elif s.lower().startswith("<details"):
            stack.append("</details>")
        elif s.lower().startswith("</details>") and "</details>" in stack:
            while stack and stack.pop() != "</details>":
                pass
    return list(reversed(stack))


def fit(markdown: str, limit: int = GITHUB_COMMENT_LIMIT, pointer: str | None = None) -> str:
    """``markdown`` unchanged when it fits in ``limit``; else its head, closed, plus a
    truncation note naming ``pointer`` (where the full report is)."""
    if size(markdown) <= limit:
        return markdown
    total = size(markdown)
    where = pointer or "the job summary / the `lock-diff` artifact of this run"

    def note(shown: int) -> str:
        return (
            f"\n> ✂️ **Truncated**: {shown:,} of {total:,} characters shown (the comment limit is {limit:,}). "
            f"The full report: {where}\n"
        )

    lines = markdown.splitlines(keepends=True)
    budget = limit - size(note(total)) - 64  # room for the closers below
    if budget <= 0:
        raise ValueError(f"a limit of {limit} leaves no room for the report")
    kept, used = [], 0
    for line in lines:
        n = size(line)
        if used + n > budget:
            break
        kept.append(line)
        used += n
    while True:
        closing = "".join(c + "\n" for c in _closers(kept))
        head = "".join(kept)
        if head and not head.endswith("\n"):
            head += "\n"
        out = head + closing + note(size(head))
        if size(out) <= limit or not kept:
            return out
        kept.pop()
