"""PR comments fit GitHub's 65,536-character limit: `diff --max-chars`, and the example workflow."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from builder.cli import main
from builder.comment_fit import GITHUB_COMMENT_LIMIT, fit, size
from builder.util import project_root

ROOT = project_root()
DIFF = ROOT / "tests" / "data" / "diff"


def _balanced(text: str) -> bool:
    fences = sum(1 for ln in text.splitlines() if ln.strip().startswith("```"))
    return fences % 2 == 0 and text.count("<details>") == text.count("</details>")


def test_a_report_that_fits_is_unchanged():
    md = "### ok\n\n| a | b |\n|---|---|\n| x | y |\n"
    assert fit(md, 1024) == md


def test_a_long_report_is_cut_closed_and_points_to_the_full_one():
    rows = "".join(f"| pkg{i} | 1.0 → 2.0 | 🔶 rebuilt |\n" for i in range(6000))
    md = (
        "### 🛑 lockfiles/vllm-0.26.0/requirements.lock\n\n**FAIL**: 1 change the gate would reject\n\n"
        "<details>\n<summary>big</summary>\n\n| package | change | note |\n|---|---|---|\n"
        + rows
        + "</details>\n\n```\n"
        + "log line\n" * 5000
        + "```\n"
    )
    assert size(md) > GITHUB_COMMENT_LIMIT
    out = fit(md, 65000, "https://ci.example/run/1")
    assert size(out) <= 65000 and size("<!-- build-image-lock-diff -->\n" + out) <= GITHUB_COMMENT_LIMIT
    assert out.startswith("### 🛑 lockfiles/vllm-0.26.0/requirements.lock\n\n**FAIL**")  # the verdict stays
    assert _balanced(out) and out.rstrip().endswith("The full report: https://ci.example/run/1")
    assert "| pkg0 |" in out and "| pkg5999 |" not in out
    # cut inside the code fence: it is closed before the note
    cut = fit(md[: md.index("```") + 2000] + "more\n" * 20000, 40000)
    assert _balanced(cut) and size(cut) <= 40000
    # emoji count twice (UTF-16), as GitHub counts them
    assert size("🛑") == 2 and size(fit("🛑" * 40000, 4096)) <= 4096


def test_diff_max_chars_cuts_the_markdown_and_keeps_the_verdict_and_exit_code():
    args = [
        "diff",
        "--format",
        "markdown",
        "--base-manifest",
        str(DIFF / "base.json"),
        str(DIFF / "mixed" / "old.lock"),
        str(DIFF / "mixed" / "new.lock"),
    ]
    full = CliRunner().invoke(main, args)
    cut = CliRunner().invoke(main, args + ["--max-chars", "1024", "--full-report", "the job summary"])
    assert full.exit_code == cut.exit_code == 1  # the dangerous change still fails the job
    assert size(full.stdout) > 1024 >= size(cut.stdout)
    assert cut.stdout.splitlines()[0] == full.stdout.splitlines()[0] and "ABI gate would reject" in cut.stdout
    assert _balanced(cut.stdout) and "The full report: the job summary" in cut.stdout
    small = CliRunner().invoke(main, args + ["--max-chars", "65000"])
    assert small.stdout == full.stdout  # within the limit: unchanged
    bad = CliRunner().invoke(main, args[:2] + ["text"] + args[3:] + ["--max-chars", "2000"])
    assert bad.exit_code == 2 and "--max-chars applies to --format markdown" in bad.output


def test_example_workflow_writes_the_summary_and_cuts_the_comment():
    yaml = pytest.importorskip("yaml")
    wf = yaml.safe_load((ROOT / "examples" / "github-actions-lock-diff.yml").read_text())
    steps = wf["jobs"]["lock-diff"]["steps"]
    diff = next(s for s in steps if s.get("id") == "diff")
    assert '>> "$GITHUB_STEP_SUMMARY"' in diff["run"]
    assert "--max-chars 65000 --full-report" in diff["run"]
    upload = next(s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    assert upload["with"]["path"] == "lock-diff-full.md"
    post = next(s for s in steps if str(s.get("uses", "")).startswith("actions/github-script"))
    assert "lock-diff.md" in post["with"]["script"] and "65536" in post["with"]["script"]
    help_text = CliRunner().invoke(main, ["diff", "--help"]).output
    assert "--max-chars" in help_text and "--full-report" in help_text
