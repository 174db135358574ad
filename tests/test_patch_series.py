"""The shipped series for every release: structure (fast), exact application on each release's
own target files (fast, committed fixtures), probes through the real code of 0.26.0 and the
newest release (slow, real wheels, cached)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from packaging.version import Version

from builder.patching import port as PO
from builder.patching import probe as PR
from builder.patching import series as P
from tests.fx_cache import real_vllm_wheel

ROOT = Path(__file__).resolve().parent.parent
SERIES_ROOT = ROOT / "patches" / "vllm"
VERSIONS = sorted((d.name for d in SERIES_ROOT.iterdir() if (d / "series").is_file()), key=Version)
NEWEST = VERSIONS[-1]
REAL = ["0.26.0", NEWEST]  # probed against the real wheels in CI (slow)
FIXTURES = ROOT / "tests" / "data" / "vllm-targets"


def test_every_shipped_release_has_a_series():
    from builder.spec import supported_vllm_versions

    want = supported_vllm_versions()
    assert len(want) >= 10
    assert [v for v in want if v not in VERSIONS] == []


@pytest.mark.parametrize("version", VERSIONS)
def test_series_structure(version):
    d = SERIES_ROOT / version
    s = P.load_series(d, version)  # Applies-To == the folder's version for every patch
    assert PR.env_requirements(d)  # its probes' interpreter
    assert s.wheel_filename and s.wheel_filename.startswith(f"vllm-{version}-")
    assert sorted(s.originals) == sorted(s.targets)
    for p in s.patches:
        assert PR.probe_path(d, p).is_file()
        if version != "0.26.0":  # says what changed from the previous release
            assert p.headers.get(PO.PORTED_FIELD, "").startswith("vllm=="), p.name
    assert not list(d.glob("*.conflict")), "an unfinished conflict is shipped"
    manifest = ROOT / "lockfiles" / "base" / f"vllm-openai-v{version}.json"
    if manifest.is_file():  # the probes run with the transformers the release's base image holds
        from builder.resolve.manifest import load_manifest

        pins = {r.split("==")[0]: r.split("==")[1] for r in PR.env_requirements(d) if "==" in r}
        assert pins["transformers"] == load_manifest(manifest).get("transformers").version


@pytest.mark.parametrize("version", [v for v in VERSIONS if v not in REAL])
def test_series_applies_exactly_to_the_releases_own_files(version, tmp_path):
    """The committed fixture is the wheel's files (sha256 = sha256sums.orig); the series applies
    with no fuzz and no offset, and every patched file still parses."""
    s = P.load_series(SERIES_ROOT / version, version)
    with tarfile.open(FIXTURES / f"{version}.tar.xz") as tar:
        tar.extractall(tmp_path, filter="data")
    for rel, want in s.originals.items():
        assert hashlib.sha256((tmp_path / rel).read_bytes()).hexdigest() == want, rel
    assert [r.status for r in P.check(s, tmp_path)] == ["applied"] * len(s.patches)
    out = tmp_path / "patched"
    done = P.apply_to_dir(s, tmp_path, out)
    for f in done:
        assert PO.scopes((out / f.relpath).read_text()) is not None, f.relpath


# ------------------------------------------------------------------ real wheels (slow)
@pytest.fixture(scope="session")
def real_wheels() -> list[Path]:
    """The real wheels the CLI runs below read from the download cache, fetched first under a
    lock (another xdist worker or run fetching one at the same time is waited for)."""
    return [real_vllm_wheel(v) for v in REAL]


@pytest.mark.slow
@pytest.mark.xdist_group("vllm-wheels")  # one worker: the CLI runs share the real wheels
@pytest.mark.usefixtures("real_wheels")
@pytest.mark.parametrize("version", REAL)
def test_patch_check_probe_on_the_real_wheel(version):
    """`build-image patch check --vllm V --probe`: every patch applies, is needed, and works,
    through that release's own code on CPU."""
    r = subprocess.run(
        [str(Path(sys.executable).with_name("build-image")), "patch", "check", "--vllm", version, "--probe", "--json"],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=ROOT,
    )
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["ok"], (r.stderr[-3000:], json.dumps(doc, indent=1)[:6000])
    for p in doc["patches"]:
        assert p["status"] == "applied" and p["probe"]["needed"] is True and p["probe"]["works"] is True, p


@pytest.mark.slow
@pytest.mark.xdist_group("vllm-wheels")
@pytest.mark.usefixtures("real_wheels")
def test_real_port_from_0_26_to_the_newest(tmp_path):
    """The 0.26.0 series against the newest wheel: nothing passes by accident. The layer-type
    patch's seam is gone (0.32.0+), so it is never `applies`; every status names its evidence."""
    r = subprocess.run(
        [
            str(Path(sys.executable).with_name("build-image")),
            "patch",
            "port",
            "--from",
            "0.26.0",
            "--to",
            NEWEST,
            "--json",
            "-o",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=ROOT,
    )
    assert r.returncode in (0, 1), r.stderr[-3000:]
    doc = json.loads(r.stdout)
    by = {p["patch"]: p for p in doc["patches"]}
    assert by["0001-layer-type-rewrites.patch"]["status"] not in ("applies", "upstream")
    for p in doc["patches"]:
        assert p["status"] in PO.STATUSES and p["detail"]
        assert p["probe_unpatched"]["status"] == "fail"  # still needed on the newest release
    assert r.returncode == (1 if any(p["status"] in ("merged", "conflict") for p in doc["patches"]) else 0)


@pytest.mark.slow
@pytest.mark.xdist_group("vllm-wheels")
@pytest.mark.usefixtures("real_wheels")
def test_upgrade_from_0_26_to_the_newest_markdown():
    """The platform team's command end to end on the real releases: base moves from the shipped
    manifests, the series ported through the real wheels, the overlay re-locked on the newest base."""
    r = subprocess.run(
        [
            str(Path(sys.executable).with_name("build-image")),
            "upgrade",
            "--from",
            "0.26.0",
            "--to",
            NEWEST,
            "--format",
            "markdown",
        ],
        capture_output=True,
        text=True,
        timeout=2400,
        cwd=ROOT,
    )
    assert r.returncode in (0, 1), r.stderr[-3000:]
    md = r.stdout
    assert "| **torch** | 2.11.0 | 2.14.0 |" in md, md[:3000]
    for name in ("0001-layer-type-rewrites.patch", "0002-ple-empty-shard-names.patch"):
        assert any(f"| `{name}` | **{s}** |" in md for s in PO.STATUSES), name
    assert "### Overlay lock" in md and "ray" in md
