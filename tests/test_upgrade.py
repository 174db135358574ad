"""`build-image upgrade` end to end on synthetic releases (fast, offline).

Two bases made by `base snapshot --site-packages` of fixture wheels: A with numpy 1.26.4,
B with numpy 2.1.0.  The patch series is the toy one of tests/test_port.py (package
`toy`, A and B as package trees); the overlay is locked by the real uv from the fixture
wheelhouse (--no-index).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from builder import upgrade as U
from builder.cli import main
from builder.resolve.manifest import load_manifest
from tests.test_port import A_MOD, HEADER, PATCHED_A, PROBE, diff, tree

PRIVATE_CACHE = "bi-cache"  # the download cache of this module's tests (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def _snapshot(d: Path, make_site_packages, dists: list[str]) -> Path:
    sp = make_site_packages(d / "site-packages", dists)
    out = d / "base.json"
    r = CliRunner().invoke(
        main,
        [
            "base",
            "snapshot",
            "--site-packages",
            str(sp),
            "--python",
            "3.12",
            "--glibc",
            "2.35",
            "--cuda",
            "13.0",
            "-o",
            str(out),
        ],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def bases(tmp_path_factory, make_site_packages) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("upgrade-bases")
    return (
        _snapshot(d / "a", make_site_packages, ["numpy==1.26.4", "purepkg==1.0.0"]),
        _snapshot(d / "b", make_site_packages, ["numpy==2.1.0", "purepkg==1.0.0"]),
    )


@pytest.fixture
def release(tmp_path):
    a = tree(tmp_path / "a-tree", A_MOD)
    d = tmp_path / "series-1.0"
    d.mkdir()
    (d / "0001-f.patch").write_text(HEADER.format(v="1.0") + diff("toy/mod.py", A_MOD, PATCHED_A))
    (d / "0001-f.probe.py").write_text(PROBE)
    (d / "series").write_text("0001-f.patch\n")
    return d, a


def _args(bases, release, b_tree, *extra):
    d, a = release
    return [
        "upgrade",
        "--from",
        "1.0",
        "--to",
        "2.0",
        "--series",
        str(d),
        "--from-wheel",
        str(a),
        "--to-wheel",
        str(b_tree),
        "--base-from",
        str(bases[0]),
        "--base-to",
        str(bases[1]),
        "--no-default-overlay",
        "--no-index",
        *extra,
    ]


def test_clean_upgrade_exits_0_and_writes_nothing_without_o(bases, release, tmp_path, wheelhouse):
    b_tree = tree(tmp_path / "b-tree", A_MOD.replace('"""toy module."""\n', '"""toy module."""\n\nV = 2\n'))
    before = sorted(p.name for p in tmp_path.iterdir())
    r = CliRunner().invoke(
        main,
        _args(
            bases, release, b_tree, "--find-links", str(wheelhouse), "--with", "numpy2user==1.0.0", "--format", "json"
        ),
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    moves = {m["what"]: (m["old"], m["new"]) for m in doc["base"]["moves"]}
    assert moves["numpy"] == ("1.26.4", "2.1.0")
    assert [p["status"] for p in doc["patches"]["patches"]] == ["applies"]
    assert doc["lock"]["status"] == "written" and doc["lock"]["path"] is None
    assert {c["what"]: c["new"] for c in doc["lock"]["changes"]} == {"numpy2user": "1.0.0"}
    assert doc["written"] == [] and sorted(p.name for p in tmp_path.iterdir()) == before


def test_gate_rejection_and_merged_patch_need_review_exit_1(bases, release, tmp_path, wheelhouse):
    b_tree = tree(tmp_path / "b-tree", A_MOD.replace("    a = x + 1\n", "    a = x + 1  # B\n", 1))
    out = tmp_path / "pr"
    r = CliRunner().invoke(
        main,
        _args(
            bases,
            release,
            b_tree,
            "--find-links",
            str(wheelhouse),
            "--with",
            "fakearrow==14.0.2",
            "--format",
            "markdown",
            "-o",
            str(out),
        ),
    )
    assert r.exit_code == 1, r.output
    md = r.stdout
    assert "needs review: patch 0001-f.patch: merged; lock: abi-rejected" in md
    assert "| **numpy** | 1.26.4 | 2.1.0 |" in md
    assert "| `0001-f.patch` | **merged** |" in md
    assert (out / "patches" / "toy" / "2.0" / "0001-f.patch").is_file()  # the candidate, for review
    assert not (out / "lockfiles" / "vllm-2.0" / "requirements.lock").exists()  # rejected: no lock written
    assert (out / "upgrade-1.0-2.0.md").read_text() == md


def test_bad_input_is_exit_2(bases, release, tmp_path):
    r = CliRunner().invoke(main, _args(bases, release, tmp_path / "missing-tree"))
    assert r.exit_code == 2
    r = CliRunner().invoke(main, ["upgrade", "--from", "0.26.0", "--to", "0.26.0"])
    assert r.exit_code == 2 and "nothing to upgrade" in r.output


def test_base_moves_and_window_are_pure(bases):
    a, b = load_manifest(bases[0]), load_manifest(bases[1])
    moves = {m.what: m for m in U.base_moves(a, b)}
    assert moves["numpy"].changed and not moves["python"].changed and "torch" not in moves
    import dataclasses

    b2 = dataclasses.replace(
        b,
        os="Ubuntu 24.04 (nvidia/cuda:13.0.2-base-ubuntu24.04)",
        uv_overrides=["nccl==2"],
        lacks={"unversioned": {"deep-ep": "source-build: DeepEP"}},
    )
    moves = {m.what: m for m in U.base_moves(a, b2)}
    assert moves["OS"].new == "Ubuntu 24.04" and moves["image uv overrides"] == U.Move(
        "image uv overrides", None, "nccl==2"
    )
    assert moves["unversioned in the image"].new == "deep-ep"
    assert U.lock_changes({"x": "1", "y": "2"}, {"y": "3", "z": "1"}) == [
        U.Move("x", "1", None),
        U.Move("y", "2", "3"),
        U.Move("z", None, "1"),
    ]


def test_upgrade_output_is_unchanged(bases, release, tmp_path, wheelhouse):
    """The whole command's reports (text, markdown, JSON) of a clean and a needs-review upgrade, byte for byte
    against tests/data/golden/upgrade (paths and timings replaced by placeholders)."""
    import re

    from tests.test_golden_output import check

    clean = tree(tmp_path / "b-clean", A_MOD.replace('"""toy module."""\n', '"""toy module."""\n\nV = 2\n'))
    merged = tree(tmp_path / "b-merged", A_MOD.replace("    a = x + 1\n", "    a = x + 1  # B\n", 1))
    for name, b_tree, pin in (("cli-clean", clean, "numpy2user==1.0.0"), ("cli-review", merged, "fakearrow==14.0.2")):
        for fmt in ("text", "markdown", "json"):
            out = tmp_path / f"{name}-{fmt}"
            args = _args(bases, release, b_tree, "--find-links", str(wheelhouse), "--with", pin, "--format", fmt)
            r = CliRunner().invoke(main, [*args, "-o", str(out)])
            text = f"exit {r.exit_code}\n{r.stdout}"
            for path, mark in ((str(tmp_path), "<TMP>"), (str(bases[0]), "<BASE-A>"), (str(bases[1]), "<BASE-B>")):
                text = text.replace(path, mark)
            text = re.sub(r'("[a-z_]+": )\d+\.\d+', r"\1<S>", text)
            text = re.sub(r"\d+\.\d+ ?s\b", "<S>", text)
            written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
            check(f"upgrade/{name}.{fmt}", text + "\nfiles:\n" + "\n".join(written) + "\n")
