"""The floor checks without an engine: the checker script's pure parts (native digest, drift
comparison, pip-check parsing, constraint lines), the manifest's optional fields, the Dockerfile
text, and the checker run as a script on the host (an edited manifest copy).  The same checks in
real containers: tests/test_floor_e2e.py."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from builder.data import path as data_path
from builder.errors import BadInput
from builder.image.render import (
    CONSTRAINTS_PATH,
    RenderPlan,
    context_files,
    oci_labels,
    render_dockerfile,
    write_context,
)
from builder.resolve.floor import checker, compare, consistency_tool, native_digest
from builder.resolve.manifest import BaseManifest, DistFacts, Distribution, load_manifest, parse_manifest
from builder.resolve.scanner import TEXT_SUFFIXES as _TEXT_SUFFIXES
from builder.resolve.scanner import scan_site_packages
from tests.fx_wheels import wheelhouse  # noqa: F401 - fixture
from tests.test_render import _instructions, _lock, _manifest


def _dist_info(sp: Path, name: str) -> Path:
    return next(sp.glob(f"{name}-*.dist-info"))


@pytest.fixture()
def site(tmp_path, wheelhouse):  # noqa: F811
    from tests.fx_wheels import install_into

    return install_into(tmp_path / "sp", ["stableabi==1.0.0", "purepkg==1.0.0", "numpy==1.26.4"], wheelhouse)


# ---------------------------------------------------------------- native digest
def test_native_digest_follows_the_elf_files_content_only(site):
    di = _dist_info(site, "stableabi")
    first = native_digest(di)
    assert first and len(first) == 64
    (site / "stableabi" / "__init__.py").write_text("# a python file is not native\n")
    assert native_digest(di) == first
    so = site / "stableabi" / "_stable.abi3.so"
    so.write_bytes(so.read_bytes() + b"\0")
    assert native_digest(di) not in (None, first)
    assert native_digest(_dist_info(site, "purepkg")) is None  # no ELF file


def test_native_digest_skips_symlinks_and_paths_outside_site_packages(site, tmp_path):
    di = _dist_info(site, "stableabi")
    before = native_digest(di)
    so = site / "stableabi" / "_stable.abi3.so"
    outside = tmp_path / "bin"
    outside.mkdir()
    (outside / "tool").write_bytes(so.read_bytes())
    os.symlink(so, site / "stableabi" / "_link.so")
    with open(di / "RECORD", "a") as fh:  # a script in ../bin and a symlink: neither is compared
        fh.write(f"{os.path.relpath(outside / 'tool', site)},,\nstableabi/_link.so,,\n")
    assert native_digest(di) == before


def test_the_scan_records_the_native_digest_of_binary_distributions_only(site):
    dists = scan_site_packages(site)
    assert dists["stableabi"].facts.native_sha256 == native_digest(_dist_info(site, "stableabi"))
    assert dists["purepkg"].facts.native_sha256 is None


def test_the_checker_skips_the_same_suffixes_as_the_scanner():
    assert checker().TEXT_SUFFIXES == _TEXT_SUFFIXES


# ---------------------------------------------------------------- comparison
def _m(**versions) -> BaseManifest:
    m = _manifest()
    m.distributions = {k: Distribution(k, v) for k, v in versions.items()}
    return m


def test_compare_names_each_kind_of_difference():
    want = _m(numpy="1.26.4", vllm="0.26.0", six="1.17.0")
    want.distributions["numpy"].facts = DistFacts(binary=True, native_sha256="a" * 64)
    have = _m(numpy="1.26.4", vllm="0.26.1", extra="1.0")
    have.distributions["numpy"].facts = DistFacts(binary=True, native_sha256="b" * 64)
    have.python_version = "3.11"
    assert compare(want, have) == [
        "Python: the manifest has 3.12, the image has 3.11",
        "extra 1.0: installed in the image, not in the manifest",
        "numpy 1.26.4: its native files differ from the manifest's (ELF digest bbbbbbbbbbbb, the manifest records "
        "aaaaaaaaaaaa)",
        "six 1.17.0: in the manifest, not installed in the image",
        "vllm: the manifest has 0.26.0, the image has 0.26.1",
    ]
    assert compare(want, want) == []


def test_a_manifest_without_native_digests_compares_names_and_versions_only():
    want, have = _m(numpy="1.26.4"), _m(numpy="1.26.4")
    have.distributions["numpy"].facts = DistFacts(binary=True, native_sha256="b" * 64)
    assert compare(want, have) == []


def test_pip_and_uv_check_output_parsed_into_problems_and_packages():
    c = checker()
    pip_out = (
        "six 1.17.0 has requirement foo>=2, but you have foo 1.0.\nbar 2.0 requires baz, which is not installed.\n"
    )
    assert c.problems(pip_out) == [
        "bar 2.0 requires baz, which is not installed.",
        "six 1.17.0 has requirement foo>=2, but you have foo 1.0.",
    ]
    assert c.problems("No broken requirements found.\n") == []
    uv_out = (
        "Checked 9 packages in 2ms\nFound 1 incompatibility\nThe package `bar` requires `baz`, but it's not installed\n"
    )
    (problem,) = c.problems(uv_out)
    assert c.named(problem) == "bar" and c.named("bar 2.0 requires baz, which is not installed.") == "bar"
    assert c.new_problems(["a", "b"], ["a"]) == ["b"]


@pytest.mark.parametrize(
    ("version", "line"),
    [
        ("1.24.2", "numpy==1.24.2"),
        ("2.9.0+cu128", "numpy==2.9.0+cu128"),
        ("1.0rc1.post2.dev3", "numpy==1.0rc1.post2.dev3"),
        ("2023.1-ubuntu", "numpy===2023.1-ubuntu"),
    ],
)
def test_constraint_lines_use_arbitrary_equality_for_non_pep440_versions(version, line):
    assert checker().constraint_line("numpy", version) == line


def test_the_consistency_tool_is_pip_unless_only_uv_is_there():
    assert consistency_tool({"pip": 1, "uv": 1}) == "pip"
    assert consistency_tool({"uv": 1}) == "uv"
    assert consistency_tool({}) == "pip"


# ---------------------------------------------------------------- manifest fields
def test_the_optional_fields_round_trip_and_old_manifests_stay_byte_identical():
    m = _manifest()
    m.distributions["numpy"].facts.native_sha256 = "c" * 64
    m.consistency = {"tool": "pip", "problems": ["x 1 requires y, which is not installed."]}
    back = parse_manifest(m.to_json())
    assert back.distributions["numpy"].facts.native_sha256 == "c" * 64 and back.consistency == m.consistency
    assert back.to_json() == m.to_json()
    plain = json.loads(_manifest().to_json())
    assert "consistency" not in plain and "native_sha256" not in plain["distributions"]["numpy"]
    for p in sorted(data_path("lockfiles/base").glob("*.json")):
        assert load_manifest(p).to_json() == p.read_text(), p


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d["distributions"]["numpy"].update(native_sha256="xyz"), "distributions.numpy.native_sha256"),
        (lambda d: d.update(consistency={"tool": "conda", "problems": []}), "consistency.tool"),
        (lambda d: d.update(consistency={"tool": "pip", "problems": [1]}), "consistency.problems"),
        (lambda d: d.update(consistency={"tool": "pip"}), "consistency.problems"),
    ],
)
def test_bad_optional_fields_are_refused_naming_them(edit, field):
    doc = json.loads(_manifest().to_json())
    edit(doc)
    with pytest.raises(BadInput, match=field.replace(".", r"\.")):
        parse_manifest(json.dumps(doc), "m.json")


# ---------------------------------------------------------------- the Dockerfile and the context
def _plan(**kw) -> RenderPlan:
    args = dict(
        vllm="0.26.0",
        base=_manifest(with_uv=False),
        lock=_lock(),
        repo="127.0.0.1:5000/serving/vllm",
        base_data=b'{"a manifest": "as the lock hashed it"}\n',
    )
    args.update(kw)
    return RenderPlan(**args)


def test_the_dockerfile_runs_the_drift_check_the_consistency_check_and_sets_the_guard():
    plan = _plan()
    sha = hashlib.sha256(plan.base_data).hexdigest()
    ins = _instructions(render_dockerfile(plan))
    final = max(i for i, x in enumerate(ins) if x.startswith("FROM "))
    checks, main = ins[:final], ins[final:]
    drift = next(x for x in checks if "base_check.py drift" in x)
    assert f"--sha256 {sha}" in drift and "--tool pip" in drift and "--allow-drift" not in drift
    assert "COPY checks/ /build-image/checks/" in checks
    install = next(i for i, x in enumerate(main) if "--require-hashes" in x)
    consistency = next(i for i, x in enumerate(main) if "base_check.py consistency" in x)
    env = main.index(f"ENV PIP_CONSTRAINT={CONSTRAINTS_PATH} UV_CONSTRAINT={CONSTRAINTS_PATH}")
    assert install < consistency < env
    assert f"constraints --out {CONSTRAINTS_PATH}" in main[consistency] and f"--sha256 {sha}" in main[consistency]
    assert "from=checks" in main[consistency]  # the base's own problems measured in the checks stage
    labels = dict(oci_labels(plan))
    assert labels["org.build-image.allow-base-drift"] == "false"
    assert labels["org.build-image.base-manifest-sha256"] == sha
    assert labels["org.build-image.constraints"] == CONSTRAINTS_PATH


def test_allow_base_drift_reaches_the_check_the_label_and_the_provenance(tmp_path):
    from builder.image import provenance

    plan = _plan(allow_base_drift=True)
    drift = next(x for x in _instructions(render_dockerfile(plan)) if "base_check.py drift" in x)
    assert drift.endswith(
        "--allow-drift; mkdir -p /build-image && echo \"base ok: python $py, vllm $v\" > /build-image/checked"
    )
    assert dict(oci_labels(plan))["org.build-image.allow-base-drift"] == "true"
    doc = provenance.for_render(plan, lock_text="x", outputs={}, template_text="t")
    assert doc["predicate"]["buildDefinition"]["externalParameters"]["allowBaseDrift"] is True


def test_the_consistency_check_uses_uv_on_a_base_with_uv_only():
    ins = _instructions(render_dockerfile(_plan(base=_manifest(with_uv=True))))
    assert any("base_check.py consistency" in x and "--tool uv" in x for x in ins)


def test_the_context_ships_the_checker_and_the_manifest_copy(tmp_path):
    lock = _lock(base_dir=tmp_path)
    wheels = {}
    for e in lock.entries:
        (tmp_path / e.wheel.filename).write_bytes(f"not really a wheel: {e.name}\n".encode())
        wheels[e.wheel.filename] = tmp_path / e.wheel.filename
    plan = _plan(lock=lock, serve_app=False)
    assert {"checks/base_check.py", "checks/base-manifest.json"} <= set(context_files(plan))
    write_context(tmp_path / "ctx", plan, wheels=wheels)
    assert (tmp_path / "ctx" / "checks" / "base-manifest.json").read_bytes() == plan.base_data
    assert (tmp_path / "ctx" / "checks" / "base_check.py").read_bytes() == data_path(
        "templates/checks/base_check.py"
    ).read_bytes()
    no_data = _plan(lock=lock, serve_app=False, base_data=None)
    assert no_data.manifest_bytes == no_data.base.to_json().encode()


def test_the_checker_refuses_an_edited_manifest_copy(tmp_path):
    """Run as the image runs it: an edited copy fails first, naming both digests and the way out."""
    m = tmp_path / "base-manifest.json"
    m.write_text(_manifest().to_json())
    good = hashlib.sha256(m.read_bytes()).hexdigest()
    m.write_text(m.read_text().replace("1.26.4", "1.26.5"))
    r = subprocess.run(
        [
            sys.executable,
            str(data_path("templates/checks/base_check.py")),
            "drift",
            "--manifest",
            str(m),
            "--sha256",
            good,
            "--tool",
            "pip",
            "--out",
            str(tmp_path / "d.json"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1
    assert f"expects {good}: it was edited after render" in r.stderr and r.stderr.startswith("build-image check: ")
    assert not (tmp_path / "d.json").exists()


def test_the_checker_itself_is_pinned_by_sha256_in_the_dockerfile():
    sha = hashlib.sha256(data_path("templates/checks/base_check.py").read_bytes()).hexdigest()
    drift = next(x for x in _instructions(render_dockerfile(_plan())) if "base_check.py drift" in x)
    assert f'echo "{sha} /build-image/checks/base_check.py" | sha256sum --quiet --strict -c -' in drift  # spaces joined
    assert drift.index("sha256sum --quiet --strict -c -") < drift.index("base_check.py drift")


def test_build_refuses_a_context_without_its_checks(tmp_path):
    from builder.image.render import verify_context

    lock = _lock(base_dir=tmp_path)
    wheels = {}
    for e in lock.entries:
        (tmp_path / e.wheel.filename).write_bytes(f"not really a wheel: {e.name}\n".encode())
        wheels[e.wheel.filename] = tmp_path / e.wheel.filename
    write_context(tmp_path / "ctx", _plan(lock=lock, serve_app=False), wheels=wheels)
    verify_context(tmp_path / "ctx")
    (tmp_path / "ctx" / "checks" / "base-manifest.json").unlink()
    with pytest.raises(BadInput, match=r"has no checks/base-manifest\.json, which its Dockerfile's checks run"):
        verify_context(tmp_path / "ctx")


def test_build_lists_the_checks_warnings_from_the_plain_log_once_each():
    from builder.image.build import build_warnings

    log = (
        "#8 [checks 3/3] RUN set -eu; ...\n"
        "#8 0.35 build-image warning: the base image differs from the base manifest (1 difference(s)):\n"
        "#8 0.35 build-image warning:   - six: the manifest has 1.16.0, the image has 1.17.0\n"
        "#8 0.35 build-image warning:   (allowed: --allow-base-drift)\n"
        "#8 0.35 build-image warning:   (allowed: --allow-base-drift)\n"
        "#8 DONE 0.4s\n"
    )
    assert build_warnings(log) == (
        "the base image differs from the base manifest (1 difference(s)):",
        "  - six: the manifest has 1.16.0, the image has 1.17.0",
        "  (allowed: --allow-base-drift)",
    )
    assert build_warnings("#8 CACHED\n") == ()
