"""The floor checked where it is real, on the real engine and the stand-in base.

- a base built off its manifest (a distribution at another version, an extra distribution, a
  native distribution with a changed file) fails the build in the checks stage naming each, and
  builds with --allow-base-drift, listing them;
- an overlay that breaks `pip check` fails the build naming the packages;
- inside the built image, pins cannot move (`pip install -U`, another version, a new package
  needing another version) while an unrelated new package installs; the opt-out works;
- the pipeline with the base in the engine says the manifest is verified, and with a drifted
  base locks against the snapshot;
- bad input: an edited manifest copy, a base without pip -> exit 9 at the checks stage.

One drifted base and one pip-less base are built per module (small layers FROM the stand-in).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.fx_docker import DOCKER, VENV_BIN, run_pipeline, standin_findlinks
from tests.fx_wheels import write_wheel

pytestmark = [pytest.mark.slow, pytest.mark.docker]

OVERLAY = ["six==1.17.0", "markupsafe==3.0.2"]
DRIFTED = "standin.local/vllm/vllm-openai:v0.26.0-drifted"
NO_PIP = "standin.local/vllm/vllm-openai:v0.26.0-nopip"
PIP_ENV = [
    "-e",
    "PIP_BREAK_SYSTEM_PACKAGES=1",
    "-e",
    "PIP_ROOT_USER_ACTION=ignore",
    "-e",
    "PIP_DISABLE_PIP_VERSION_CHECK=1",
]


def docker(*args: str, check: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
    r = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, f"docker {' '.join(args)}: {r.stderr}"
    return r


@pytest.fixture(scope="module")
def guard_wheels(tmp_path_factory) -> Path:
    """Small wheels for in-image installs and for the drifted base: an unrelated new package, another
    six, a package that needs that six, an extra distribution, a consumer and the dependency it needs."""
    d = tmp_path_factory.mktemp("guard-wheels")
    write_wheel(d, "bi-unrelated", "1.0", "py3-none-any", {"bi_unrelated.py": "X = 1\n"})
    write_wheel(d, "six", "1.99.0", "py3-none-any", {"six.py": "__version__ = '1.99.0'\n"})
    write_wheel(d, "bi-needs-newer-six", "1.0", "py3-none-any", {"bi_needs_newer_six.py": ""}, requires=["six>=1.99"])
    write_wheel(d, "bi-extra", "1.0", "py3-none-any", {"bi_extra.py": ""})
    write_wheel(d, "bi-consumer", "1.0", "py3-none-any", {"bi_consumer.py": ""}, requires=["bi-dep"])
    write_wheel(d, "bi-dep", "1.0", "py3-none-any", {"bi_dep.py": ""})
    return d


@pytest.fixture(scope="module")
def findlinks(guard_wheels, tmp_path_factory) -> Path:
    """The overlay's offline folder + packaging 23.1 (the drifted base's) + the test wheels."""
    fl = tmp_path_factory.mktemp("floor-fl") / "fl"
    shutil.copytree(standin_findlinks(tuple(OVERLAY)), fl)
    r = subprocess.run(
        [
            str(VENV_BIN / "python"),
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.11",
            "packaging==23.1",
            "-d",
            str(fl),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    for w in ("bi_extra", "bi_consumer", "bi_dep"):
        shutil.copy(next(guard_wheels.glob(f"{w}-*.whl")), fl)
    return fl


@pytest.fixture(scope="module")
def drifted_base(standin_base_image, findlinks, tmp_path_factory) -> str:
    """The stand-in with packaging 23.0 -> 23.1, an extra distribution (bi-extra 1.0) and one byte
    appended to numexpr's extension module (same version, other native files)."""
    ctx = tmp_path_factory.mktemp("drifted")
    for pat in ("packaging-23.1-*.whl", "bi_extra-*.whl"):
        shutil.copy(next(findlinks.glob(pat)), ctx)
    (ctx / "Dockerfile").write_text(
        f"FROM {standin_base_image.ref}\nCOPY *.whl /tmp/\n"
        "RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-index --no-deps --root-user-action=ignore "
        "/tmp/*.whl && rm /tmp/*.whl \\\n"
        " && printf '\\0' >> \"$(python3 -c 'import numexpr.interpreter as i; print(i.__file__)')\"\n"
    )
    docker("build", "--network=none", "-q", "-t", DRIFTED, str(ctx))
    return DRIFTED


@pytest.fixture(scope="module")
def nopip_base(standin_base_image, tmp_path_factory) -> str:
    ctx = tmp_path_factory.mktemp("nopip")
    (ctx / "Dockerfile").write_text(
        f"FROM {standin_base_image.ref}\n"
        "RUN rm -rf /usr/lib/python3/dist-packages/pip /usr/lib/python3/dist-packages/pip-*.dist-info\n"
    )
    docker("build", "--network=none", "-q", "-t", NO_PIP, str(ctx))
    return NO_PIP


@pytest.fixture(scope="module")
def image(built_overlay_image):
    return built_overlay_image(OVERLAY)


def _context_from(src: Path, dst: Path, base: str, manifest_ref: str) -> Path:
    """A copy of a rendered context that builds FROM another image (the manifest stays the original's)."""
    shutil.copytree(src, dst)
    df = dst / "Dockerfile"
    df.write_text(df.read_text().replace(f"FROM {manifest_ref}", f"FROM {base}"))
    return dst


def _ref(manifest: Path) -> str:
    doc = json.loads(manifest.read_text())["image"]
    return f"{doc['ref'].split('@')[0]}@{doc['digest']}" if doc["digest"] else doc["ref"]


# ---------------------------------------------------------------- drift
def test_a_base_built_off_its_manifest_fails_the_build_naming_each_difference(image, drifted_base, tmp_path):
    ctx = _context_from(image.context, tmp_path / "ctx", drifted_base, _ref(image.manifest))
    t0 = time.monotonic()
    r = run_pipeline(["build", str(ctx), "--tag", "build-image-test/drifted"])
    assert r.returncode == 9, r.stdout + r.stderr
    assert time.monotonic() - t0 < 60
    err = r.stderr
    assert "the base image differs from the base manifest the lock was made against (3 difference(s))" in err
    assert "packaging: the manifest has 23.0, the image has 23.1" in err
    assert "bi-extra 1.0: installed in the image, not in the manifest" in err
    assert "numexpr 2.8.4: its native files differ from the manifest's" in err
    assert "build-image base snapshot --image REF -o FILE" in err
    assert docker("images", "-q", "build-image-test/drifted").stdout == ""


def test_allow_base_drift_builds_listing_the_differences(image, drifted_base, tmp_path):
    out = tmp_path / "ctx-allowed"
    r = run_pipeline(
        [
            "render",
            "--vllm",
            "0.26.0",
            "--base",
            str(image.manifest),
            "--lock",
            str(image.lock),
            "-o",
            str(out),
            "--no-patches",
            "--allow-base-drift",
        ]
    )
    assert r.returncode == 0, r.stderr
    ctx = _context_from(out, tmp_path / "ctx", drifted_base, _ref(image.manifest))
    r = run_pipeline(["build", str(ctx), "--tag", "build-image-test/drift-allowed", "--json"])
    assert r.returncode == 0, r.stderr
    warnings = json.loads(r.stdout)["warnings"]
    assert warnings[0].startswith("the base image differs from the base manifest") and len(warnings) == 5
    assert "  - packaging: the manifest has 23.0, the image has 23.1" in warnings
    assert "warning: the base image differs" in r.stderr and "(allowed: --allow-base-drift)" in r.stderr
    again = run_pipeline(["build", str(ctx), "--tag", "build-image-test/drift-allowed", "--json"])
    assert again.returncode == 0 and json.loads(again.stdout)["cached_steps"] > 0, again.stderr
    assert json.loads(again.stdout)["warnings"] == warnings  # a cached checks stage: listed from the image
    tag = json.loads(r.stdout)["tags"][0]
    labels = json.loads(docker("image", "inspect", tag).stdout)[0]["Config"]["Labels"]
    assert labels["org.build-image.allow-base-drift"] == "true"
    drift = json.loads(
        docker(
            "run", "--rm", "--pull=never", "--network=none", tag, "cat", "/usr/share/build-image/base-drift.json"
        ).stdout
    )
    assert drift["allowed"] is True and len(drift["drift"]) == 3
    prov = json.loads((ctx / "provenance.intoto.json").read_text())
    assert prov["predicate"]["buildDefinition"]["externalParameters"]["allowBaseDrift"] is True


# ---------------------------------------------------------------- consistency
def test_an_overlay_that_breaks_pip_check_fails_naming_the_packages(standin_manifest, findlinks, tmp_path):
    """A lock that lacks a dependency (bi-consumer needs bi-dep; the lock was edited to drop it):
    the installed environment fails `pip check` after the install, naming bi-consumer."""
    from builder.resolve.lockfile import parse_lock

    lock = tmp_path / "l.lock"
    args = [
        "lock",
        "--vllm",
        "0.26.0",
        "--base",
        str(standin_manifest),
        "-o",
        str(lock),
        "--no-default-overlay",
        "--no-index",
        "--find-links",
        str(findlinks),
        "--with",
        "six==1.17.0",
        "--with",
        "bi-consumer==1.0",
    ]
    r = run_pipeline(args)
    assert r.returncode == 0, r.stderr
    parsed = parse_lock(lock.read_text())
    assert {e.name for e in parsed.entries} >= {"bi-consumer", "bi-dep"}
    parsed.entries = [e for e in parsed.entries if e.name != "bi-dep"]
    edited = tmp_path / "edited.lock"
    edited.write_text(parsed.format())
    out = tmp_path / "ctx"
    r = run_pipeline(
        [
            "render",
            "--vllm",
            "0.26.0",
            "--base",
            str(standin_manifest),
            "--lock",
            str(edited),
            "-o",
            str(out),
            "--no-patches",
        ]
    )
    assert r.returncode == 0, r.stderr
    r = run_pipeline(["build", str(out), "--tag", "build-image-test/pipcheck"])
    assert r.returncode == 9, r.stdout + r.stderr
    assert "`pip check` finds 1 new problem(s) in bi-consumer" in r.stderr
    assert "bi-consumer 1.0 requires bi-dep, which is not installed." in r.stderr


# ---------------------------------------------------------------- the in-image guard
def test_inside_the_image_pins_cannot_move_and_new_packages_install(image, guard_wheels, standin_manifest):
    def pip(*args: str, env: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        return docker(
            "run",
            "--rm",
            "--pull=never",
            "--network=none",
            *PIP_ENV,
            *env,
            "-v",
            f"{guard_wheels}:/w:ro",
            image.tags[0],
            *args,
            check=False,
        )

    tag = image.tags[0]
    env = json.loads(docker("image", "inspect", tag).stdout)[0]["Config"]["Env"]
    assert "PIP_CONSTRAINT=/etc/build-image/constraints.txt" in env
    assert "UV_CONSTRAINT=/etc/build-image/constraints.txt" in env
    cons = docker(
        "run", "--rm", "--pull=never", "--network=none", tag, "cat", "/etc/build-image/constraints.txt"
    ).stdout
    pins = {line.split("==")[0].lower(): line.split("==")[1] for line in cons.splitlines() if not line.startswith("#")}
    base = json.loads(standin_manifest.read_text())["distributions"]
    assert {k: v["version"] for k, v in base.items()} | {"six": "1.17.0", "markupsafe": "3.0.2"} == pins

    up = pip("sh", "-c", "pip install --no-index -f /w -U six && python3 -c 'import six; print(six.__version__)'")
    assert up.returncode == 0 and up.stdout.strip().endswith("1.17.0"), up.stdout + up.stderr  # the pin held
    other = pip("pip", "install", "--no-index", "-f", "/w", "six==1.99.0")
    assert other.returncode == 1 and "ResolutionImpossible" in other.stderr
    assert "The user requested (constraint) six==1.17.0" in other.stdout + other.stderr
    dragged = pip("pip", "install", "--no-index", "-f", "/w", "bi-needs-newer-six")
    assert dragged.returncode == 1 and "bi-needs-newer-six 1.0 depends on six>=1.99" in dragged.stdout
    new = pip("pip", "install", "--no-index", "-f", "/w", "bi-unrelated")
    assert new.returncode == 0 and "Successfully installed bi-unrelated-1.0" in new.stdout, new.stderr
    opt_out = pip("env", "-u", "PIP_CONSTRAINT", "pip", "install", "--no-index", "-f", "/w", "six==1.99.0")
    assert opt_out.returncode == 0 and "Successfully installed six-1.99.0" in opt_out.stdout, opt_out.stderr
    ok = docker("run", "--rm", "--pull=never", "--network=none", tag, "cat", "/usr/share/build-image/consistency.txt")
    assert ok.stdout == "no dependency problems\n"


# ---------------------------------------------------------------- the pipeline snapshots a held base
def test_the_pipeline_verifies_a_held_base_and_reuses_the_snapshot(image, standin_manifest, tmp_path):
    assert image.summary["base_check"]["status"] == "verified"
    lock = tmp_path / "requirements.lock"
    shutil.copyfile(image.lock, lock)
    args = [
        "--vllm",
        "0.26.0",
        "--base",
        str(standin_manifest),
        "--lock",
        str(lock),
        "--no-default-overlay",
        "--no-index",
        "--find-links",
        str(standin_findlinks(tuple(OVERLAY))),
        "-o",
        str(tmp_path / "ctx"),
        "--no-patches",
        "--json",
    ]
    for req in OVERLAY:
        args += ["--with", req]
    r = run_pipeline(args)
    assert r.returncode == 0, r.stderr
    image_id = json.loads(docker("image", "inspect", "standin.local/vllm/vllm-openai:v0.26.0").stdout)[0]["Id"]
    assert f"base manifest verified against image {image_id}" in r.stderr
    check = json.loads(r.stdout)["base_check"]
    assert check["snapshot_reused"] is True and check["differences"] == []


def test_the_pipeline_locks_against_the_snapshot_of_a_drifted_base(drifted_base, findlinks, standin_manifest, tmp_path):
    doc = json.loads(standin_manifest.read_text())
    doc["image"] = {"ref": drifted_base, "digest": None}  # the manifest names the (drifted) image
    manifest = tmp_path / "names-drifted.json"
    manifest.write_text(json.dumps(doc, indent=2) + "\n")
    lock = tmp_path / "drift.lock"
    args = [
        "--vllm",
        "0.26.0",
        "--base",
        str(manifest),
        "--lock",
        str(lock),
        "--no-default-overlay",
        "--no-index",
        "--find-links",
        str(findlinks),
        "-o",
        str(tmp_path / "ctx"),
        "--no-patches",
        "--tag",
        "build-image-test/drift-snapshot",
        "--json",
    ]
    for req in OVERLAY:
        args += ["--with", req]
    r = run_pipeline(args)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    check = summary["base_check"]
    assert check["status"] == "drift" and len(check["differences"]) == 3
    assert "packaging: the manifest has 23.0, the image has 23.1" in r.stderr
    assert "locking against the snapshot of the real image" in r.stderr
    shipped = tmp_path / "ctx" / "checks" / "base-manifest.json"
    assert check["manifest"] == str(shipped)
    snap = json.loads(shipped.read_text())
    assert snap["distributions"]["packaging"]["version"] == "23.1" and "bi-extra" in snap["distributions"]
    assert snap["provenance"]["kind"] == "read-from-image"
    assert f"# base-manifest-sha256: {hashlib.sha256(shipped.read_bytes()).hexdigest()}" in lock.read_text()
    assert summary["status"] == "built"  # the checks stage agrees: the context's manifest is the image's


# ---------------------------------------------------------------- bad input
def test_an_edited_manifest_copy_fails_at_the_checks_stage(image, tmp_path):
    ctx = tmp_path / "ctx"
    shutil.copytree(image.context, ctx)
    m = ctx / "checks" / "base-manifest.json"
    m.write_text(m.read_text().replace('"version": "23.0"', '"version": "23.1"'))
    r = run_pipeline(["build", str(ctx), "--tag", "build-image-test/edited-manifest"])
    assert r.returncode == 9, r.stdout + r.stderr
    assert "build-image check: the base manifest copy in the context (checks/base-manifest.json)" in r.stderr
    assert "it was edited after render" in r.stderr
    assert docker("images", "-q", "build-image-test/edited-manifest").stdout == ""  # nothing to push
    shutil.copyfile(image.context / "checks" / "base-manifest.json", m)
    checker = ctx / "checks" / "base_check.py"
    checker.write_text(checker.read_text().replace("def compare(", "def compare_(", 1))
    r = run_pipeline(["build", str(ctx), "--tag", "build-image-test/edited-manifest"])
    assert r.returncode == 9, r.stdout + r.stderr
    assert "build-image check: checks/base_check.py in the context is not the one render wrote" in r.stderr


def test_a_base_without_pip_fails_at_the_checks_stage_naming_it(image, nopip_base, tmp_path):
    ctx = _context_from(image.context, tmp_path / "ctx", nopip_base, _ref(image.manifest))
    r = run_pipeline(["build", str(ctx), "--tag", "build-image-test/nopip"])
    assert r.returncode == 9, r.stdout + r.stderr
    assert "build-image check: the base image has no pip (python3 -m pip is not importable)" in r.stderr
