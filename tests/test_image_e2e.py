"""End to end on a real Docker engine and a real registry (127.0.0.1:5000), on the stand-in base.

snapshot the base from the image -> lock an overlay -> render (with the test patch series) ->
build -> run the image (--pull=never --network=none) -> push -> pull back by digest; plus the
refusals and faults: numpy 2 overlay refused before any build, engine down, registry down,
tag conflict, credentials never leaking.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.fx_docker import DOCKER, REGISTRY, missing, run_pipeline, standin_findlinks

pytestmark = [pytest.mark.slow, pytest.mark.docker]

OVERLAY = ["six==1.17.0", "markupsafe==3.0.2"]  # one pure, one binary (cp311 manylinux) package


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=600)
    if check:
        assert r.returncode == 0, f"docker {' '.join(args)}: {r.stderr}"
    return r


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="module")
def e2e(built_overlay_image, standin_base_image, standin_pinned_manifest, local_registry):
    return built_overlay_image(
        OVERLAY,
        series=standin_base_image.series_dir,
        repo=f"{local_registry}/e2e/vllm",
        manifest=standin_pinned_manifest,
    )


def test_built_image_runs_the_overlay(e2e):
    # the context holds exactly: Dockerfile, lock, the 2 wheels, patches + sums, the serve app
    files = sorted(str(p.relative_to(e2e.context)) for p in e2e.context.rglob("*") if p.is_file())
    wheels = [f for f in files if f.startswith("wheels/")]
    assert len(wheels) == 2 and any("MarkupSafe" in w or "markupsafe" in w for w in wheels)
    patch_files = {
        "patches/original.sha256",
        "patches/patched.sha256",
        "patches/files/vllm/engine/arg_utils.py",
        "patches/files/vllm/entrypoints/openai/api_server.py",
    }
    assert (
        set(files) - set(wheels)
        == {
            "Dockerfile",
            "requirements.lock",
            "pylock.toml",
            "sbom.cdx.json",
            "provenance.intoto.json",
            "app/build_image_serve_app.py",
            "checks/base_check.py",
            "checks/base-manifest.json",
        }
        | patch_files
    )
    dockerfile = (e2e.context / "Dockerfile").read_text()
    assert "--no-index --no-deps" in dockerfile and "--require-hashes" in dockerfile
    base = json.loads(e2e.manifest.read_text())["image"]
    froms = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("FROM ")]
    assert froms and set(froms) == {f"{base['ref']}@{base['digest']}"}  # pinned by digest

    code = (
        "import six, markupsafe, vllm, build_image_serve_app\n"
        "from markupsafe import _speedups  # the binary extension\n"
        "import numpy; assert numpy.__version__ == '1.24.2'\n"
        "print('OK', six.__version__, vllm.__version__)\n"
    )
    r = docker("run", "--rm", "--pull=never", "--network=none", e2e.tags[0], "python3", "-c", code, check=False)
    assert r.returncode == 0 and "OK 1.17.0 0.26.0" in r.stdout, r.stderr
    # no wheel stayed in the image (bind-mounted, not copied)
    names = " -o ".join(f"-name '{Path(w).name}'" for w in wheels)
    r = docker(
        "run",
        "--rm",
        "--pull=never",
        "--network=none",
        e2e.tags[0],
        "sh",
        "-c",
        f"find / -xdev \\( {names} \\) 2>/dev/null || true",
    )
    assert r.stdout.strip() == ""


def test_the_image_carries_its_sbom_whose_sha256_is_the_label(e2e):
    from builder.image.sbom import IMAGE_SBOM_PATH, validate

    labels = json.loads(docker("image", "inspect", e2e.tags[0]).stdout)[0]["Config"]["Labels"]
    assert labels["org.build-image.sbom"] == IMAGE_SBOM_PATH
    r = docker("run", "--rm", "--pull=never", "--network=none", e2e.tags[0], "cat", IMAGE_SBOM_PATH)
    assert hashlib.sha256(r.stdout.encode()).hexdigest() == labels["org.build-image.sbom-sha256"]
    assert r.stdout == (e2e.context / "sbom.cdx.json").read_text() and validate(r.stdout) == []
    doc = json.loads(r.stdout)
    names = {c["name"].lower() for c in doc["components"]}
    assert {"six", "markupsafe", "vllm", "numpy"} <= names


def test_the_contexts_pylock_installs_the_same_set_as_its_requirements_lock(e2e, tmp_path):
    """The image installs requirements.lock; the context's pylock.toml (wheels by path) is the same set."""
    from builder.resolve.uv import find_uv

    uv, env = find_uv(), {"UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never", "PATH": "/usr/bin:/bin"}
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(tmp_path / "v")], check=True, env=env)

    def dry(*args):
        r = subprocess.run(
            [uv, "pip", "install", "--dry-run", "--offline", "--python", str(tmp_path / "v" / "bin" / "python"), *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=e2e.context,
        )
        assert r.returncode == 0, r.stderr
        return sorted(re.findall(r"^ \+ (\S+==\S+)$", r.stderr, re.M))

    from_req = dry("--no-deps", "--require-hashes", "--no-index", "--find-links", "wheels", "-r", "requirements.lock")
    assert from_req == dry("-r", "pylock.toml") and len(from_req) == 2


def test_built_image_carries_the_patched_vllm(e2e):
    code = (
        "import vllm.engine.arg_utils as a, vllm.entrypoints.openai.api_server as s\n"
        "assert a.DEFAULT_MAX_MODEL_LEN == 4096, a.DEFAULT_MAX_MODEL_LEN\n"
        "assert a.default_max_model_len(1048576) == 4096\n"
        "assert s.banner().endswith('(patched by build-image)'), s.banner()\n"
        "print('PATCHED')\n"
    )
    r = docker("run", "--rm", "--pull=never", "--network=none", e2e.tags[0], "python3", "-c", code, check=False)
    assert r.returncode == 0 and "PATCHED" in r.stdout, r.stderr
    # the patched files in the image verify against the sums the image carries
    r = docker(
        "run",
        "--rm",
        "--pull=never",
        "--network=none",
        e2e.tags[0],
        "sh",
        "-c",
        "cd /usr/local/lib/python3.11/dist-packages && sha256sum -c /usr/share/build-image/patched.sha256",
    )
    assert r.stdout.count(": OK") == 2
    labels = json.loads(docker("image", "inspect", e2e.tags[0]).stdout)[0]["Config"]["Labels"]
    assert labels["org.build-image.patches"] == "0001-default-max-model-len.patch,0002-api-server-banner.patch"


def test_labels_tags_and_digest_round_trip(e2e, local_registry):
    info = json.loads(docker("image", "inspect", e2e.tags[0]).stdout)[0]
    labels = info["Config"]["Labels"]
    lock_text = e2e.lock.read_text()
    from builder.resolve.lockfile import parse_lock

    lock = parse_lock(lock_text)
    assert labels["org.build-image.lock-hash"] == lock.lock_hash
    assert labels["org.build-image.vllm"] == "0.26.0"
    assert labels["org.build-image.base-digest"] == json.loads(e2e.manifest.read_text())["image"]["digest"]
    assert e2e.tags == [
        f"{local_registry}/e2e/vllm:vllm0.26.0-{lock.lock_hash[:12]}",
        f"{local_registry}/e2e/vllm:vllm0.26.0",
    ]

    r = run_pipeline(["push", str(e2e.context), "--tag", f"{local_registry}/e2e/vllm", "--json", "--force"])
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    digest = doc["digest"]
    assert digest.startswith("sha256:") and {p["digest"] for p in doc["pushed"]} == {digest}
    # the registry serves that digest for both tags (independently of our client: skopeo)
    for tag in e2e.tags:
        raw = subprocess.run(
            ["skopeo", "inspect", "--tls-verify=false", "--format", "{{.Digest}}", f"docker://{tag}"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if raw.returncode == 0:
            assert raw.stdout.strip() == digest
    # pull back by digest into a clean store entry and compare the image
    pinned = f"{local_registry}/e2e/vllm@{digest}"
    for t in e2e.tags:
        docker("image", "rm", t)
    docker("pull", "-q", pinned)
    pulled = json.loads(docker("image", "inspect", pinned).stdout)[0]
    assert pulled["Id"] == e2e.image_id
    assert pulled["Config"]["Labels"] == labels
    for t in e2e.tags:  # restore the tags for the tests below
        docker("tag", pinned, t)
    # pushing again is a no-op with the same digest (no conflict with itself)
    r = run_pipeline(["push", str(e2e.context), "--tag", f"{local_registry}/e2e/vllm", "--json"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["digest"] == digest


def test_push_attaches_sbom_and_provenance_as_referrers_of_the_image(e2e, local_registry):
    """The Debian registry (distribution 2.8) stores OCI artifacts with a subject but has no referrers
    API: push indexes them under the sha256-<hex> tag (OCI referrers tag schema); skopeo reads them back."""
    from builder.image.provenance import validate as validate_provenance
    from builder.image.referrers import INTOTO_TYPE, SBOM_TYPE

    r = run_pipeline(["push", str(e2e.context), "--tag", f"{local_registry}/e2e/vllm", "--json", "--force"])
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    att, digest = doc["attestations"], doc["digest"]
    assert att["pushed"] is True and att["referrers"] == "tag-schema", att
    assert att["index"] == f"{local_registry}/e2e/vllm:{digest.replace(':', '-')}"

    def raw(ref: str) -> dict:
        p = subprocess.run(
            ["skopeo", "inspect", "--tls-verify=false", "--raw", f"docker://{ref}"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    index = raw(att["index"])
    by_type = {m["artifactType"]: m["digest"] for m in index["manifests"]}
    assert by_type[SBOM_TYPE] == att["sbom"]["digest"] and by_type[INTOTO_TYPE] == att["provenance"]["digest"]
    for key, atype, name in (
        ("sbom", SBOM_TYPE, "sbom.cdx.json"),
        ("provenance", INTOTO_TYPE, "provenance.intoto.json"),
    ):
        m = raw(att[key]["ref"])
        assert m["artifactType"] == atype and m["subject"]["digest"] == digest
        (layer,) = m["layers"]
        assert layer["digest"] == "sha256:" + hashlib.sha256((e2e.context / name).read_bytes()).hexdigest()
    # the provenance now names what the registry serves
    prov = json.loads((e2e.context / "provenance.intoto.json").read_text())
    assert prov["subject"] == [{"name": f"{local_registry}/e2e/vllm", "digest": {"sha256": digest.split(":")[1]}}]
    assert validate_provenance(prov) == []
    again = run_pipeline(["push", str(e2e.context), "--tag", f"{local_registry}/e2e/vllm", "--force"])
    assert again.returncode == 0 and "attached to" in again.stderr
    # a re-push replaces build-image's referrers instead of piling them up
    kinds = [m.get("annotations", {}).get("org.build-image.attestation") for m in raw(att["index"])["manifests"]]
    kinds = [k for k in kinds if k]  # (the shared test registry may hold referrers of older runs)
    assert sorted(kinds) == ["provenance", "sbom"]


def test_tag_conflict_then_force(e2e, local_registry, tmp_path):
    """Same lock (same tags), different image content: the registry's tag points elsewhere -> exit 11."""
    run_pipeline(["push", str(e2e.context), "--tag", f"{local_registry}/e2e/vllm", "--force"])
    ctx = tmp_path / "ctx"
    subprocess.run(["cp", "-a", str(e2e.context), str(ctx)], check=True)
    app = ctx / "app" / "build_image_serve_app.py"
    app.write_text(app.read_text() + "\n# a different image with the same lock\n")
    r = run_pipeline(["build", str(ctx), "--tag", f"{local_registry}/e2e/vllm", "--json"])
    assert r.returncode == 0, r.stderr
    other = json.loads(r.stdout)["image_id"]
    assert other != e2e.image_id
    before = subprocess.run(
        ["skopeo", "inspect", "--tls-verify=false", "--format", "{{.Digest}}", f"docker://{e2e.tags[0]}"],
        capture_output=True,
        text=True,
    ).stdout
    r = run_pipeline(["push", str(ctx), "--tag", f"{local_registry}/e2e/vllm"])
    assert r.returncode == 11, r.stdout + r.stderr
    assert "already point at a different image" in r.stderr and "Nothing was pushed" in r.stderr
    after = subprocess.run(
        ["skopeo", "inspect", "--tls-verify=false", "--format", "{{.Digest}}", f"docker://{e2e.tags[0]}"],
        capture_output=True,
        text=True,
    ).stdout
    assert before == after  # nothing was pushed
    r = run_pipeline(["push", str(ctx), "--tag", f"{local_registry}/e2e/vllm", "--force", "--json"])
    assert r.returncode == 0, r.stderr
    # put the original image back on the tags for other tests
    for t in e2e.tags:
        docker("tag", e2e.image_id, t)
    assert run_pipeline(["push", str(e2e.context), "--tag", f"{local_registry}/e2e/vllm", "--force"]).returncode == 0


def test_registry_unreachable_is_exit_10_and_nothing_reported_pushed(e2e):
    repo = f"127.0.0.1:{_closed_port()}/e2e/vllm"
    for src, t in zip(e2e.tags, [f"{repo}:{t.rsplit(':', 1)[1]}" for t in e2e.tags]):
        docker("tag", src, t)
    r = run_pipeline(["push", str(e2e.context), "--tag", repo, "--json"])
    assert r.returncode == 10, r.stdout + r.stderr
    assert "unreachable" in r.stderr and r.stdout.strip() == ""
    for t in e2e.tags:
        docker("image", "rm", f"{repo}:{t.rsplit(':', 1)[1]}", check=False)


def test_engine_down(e2e, tmp_path):
    dead = {"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    r = run_pipeline(["build", str(e2e.context)], env=dead)
    assert r.returncode == 8 and "not reachable" in r.stderr
    r = run_pipeline(["push", str(e2e.context), "--tag", f"{REGISTRY}/e2e/vllm"], env=dead)
    assert r.returncode == 8


def test_pipeline_without_engine_stops_after_render(standin_manifest, standin_base_image, tmp_path):
    fl = standin_findlinks(tuple(OVERLAY))
    args = [
        "--vllm",
        "0.26.0",
        "--base",
        str(standin_manifest),
        "--lock",
        str(tmp_path / "l.lock"),
        "--no-default-overlay",
        "--no-index",
        "--find-links",
        str(fl),
        "-o",
        str(tmp_path / "ctx"),
        "--json",
        "--no-patches",
    ]
    for req in OVERLAY:
        args += ["--with", req]
    dead = {"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    r = run_pipeline(args, env=dead)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "rendered" and "docker build --network=none" in doc["build_command"]
    assert (tmp_path / "ctx" / "Dockerfile").is_file() and "no container engine reachable" in r.stderr
    # --push cannot be honoured without an engine: exit 8, the context is still there
    r = run_pipeline(args + ["--tag", f"{REGISTRY}/e2e/x", "--push"], env=dead)
    assert r.returncode == 8 and (tmp_path / "ctx" / "Dockerfile").is_file()


def test_pipeline_kuberay_is_not_dropped_when_it_stops_after_render(tmp_path):
    """The committed lock (ray from the overlay), engine down: --kuberay still writes both manifests
    (by tag, said so); without serving.model it is exit 2 before any context is written."""
    args = ["--vllm", "0.26.0", "--no-patches", "-o", str(tmp_path / "ctx"), "--kuberay", "--json"]
    dead = {"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    r = run_pipeline(args, env=dead)
    assert r.returncode == 2 and "serving.model" in r.stderr and not (tmp_path / "ctx").exists()
    r = run_pipeline(args + ["--model", "/models/m"], env=dead)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "rendered"
    assert sorted(Path(p).name for p in doc["kuberay"]) == ["raycluster.yaml", "rayservice.yaml"]
    assert f'image: "{doc["tags"][0]}"' in (tmp_path / "ctx" / "raycluster.yaml").read_text()
    assert "by tag" in " ".join(r.stderr.split()) and "[2/3]" in r.stderr


def test_numpy2_overlay_is_refused_before_any_build(standin_manifest, tmp_path):
    fl = standin_findlinks(tuple(OVERLAY))
    import shutil

    numpy2 = tmp_path / "fl"
    shutil.copytree(fl, numpy2)
    r = subprocess.run(
        [
            os.path.join(os.path.dirname(__import__("sys").executable), "python"),
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.11",
            "--implementation",
            "cp",
            "--abi",
            "cp311",
            "--platform",
            "manylinux_2_17_x86_64",
            "numpy==2.2.6",
            "-d",
            str(numpy2),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    repo = "build-image-test/numpy2"
    for ref in docker("images", "--format", "{{.Repository}}:{{.Tag}}", repo).stdout.split():
        docker("image", "rm", ref)  # leftovers of an earlier run
    args = [
        "--vllm",
        "0.26.0",
        "--base",
        str(standin_manifest),
        "--lock",
        str(tmp_path / "n.lock"),
        "--no-default-overlay",
        "--no-index",
        "--find-links",
        str(numpy2),
        "-o",
        str(tmp_path / "ctx"),
        "--tag",
        repo,
        "--no-patches",
    ]
    for req in ("six==1.17.0", "numpy>=2"):
        args += ["--with", req]
    r = run_pipeline(args)
    assert r.returncode in (3, 4), r.stdout + r.stderr
    assert "numpy" in r.stderr
    assert not (tmp_path / "ctx").exists() and not (tmp_path / "n.lock").exists()
    assert docker("images", "-q", repo).stdout == ""  # no image was built


@pytest.fixture()
def auth_registry(tmp_path):
    """A second local registry (docker-registry, 127.0.0.1:<free port>) that demands a login
    (htpasswd, bcrypt).  Yields (address, user, password); stopped by PID afterwards."""
    import shutil
    import time
    import urllib.error
    import urllib.request

    import bcrypt  # the registry's htpasswd takes bcrypt hashes only

    exe = shutil.which("docker-registry")
    if exe is None:
        missing("docker-registry is not installed")
    password = "s3cr3t-Build-Image-Token-9f1c"
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode()
    (tmp_path / "htpasswd").write_text(f"ci-user:{hashed}\n")
    port = _closed_port()
    (tmp_path / "registry.yml").write_text(
        "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {tmp_path}/data\nhttp:\n  addr: 127.0.0.1:{port}\n"
        f"auth:\n  htpasswd:\n    realm: build-image-test\n    path: {tmp_path}/htpasswd\n"
    )
    log = open(tmp_path / "registry.log", "wb")
    proc = subprocess.Popen([exe, "serve", str(tmp_path / "registry.yml")], stdout=log, stderr=log)
    try:
        for _ in range(50):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1)
            except urllib.error.HTTPError as exc:
                if exc.code == 401:
                    break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail("the auth registry did not start: " + (tmp_path / "registry.log").read_text()[-1000:])
        yield f"127.0.0.1:{port}", "ci-user", password
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


def test_credentials_come_from_the_engine_store_and_never_leak(e2e, auth_registry, tmp_path):
    """A registry that demands a login: without one the push is refused (exit 10); after
    `docker login` (the engine's credential store, DOCKER_CONFIG) it succeeds and the digest is
    verified through the same stored login.  The password appears nowhere: not in the context,
    the image (files, labels, history) or the logs."""
    addr, user, secret = auth_registry
    cfg = tmp_path / "docker-config"
    cfg.mkdir()
    env = {"DOCKER_CONFIG": str(cfg), "REGISTRY_PASSWORD": secret}
    import base64

    auth = base64.b64encode(f"{user}:{secret}".encode()).decode()
    repo = f"{addr}/e2e/secret"
    out = tmp_path / "ctx"
    logs = ""
    for args in (
        [
            "render",
            "--vllm",
            "0.26.0",
            "--base",
            str(e2e.manifest),
            "--lock",
            str(e2e.lock),
            "-o",
            str(out),
            "--tag",
            repo,
            "--no-patches",
        ],
        ["build", str(out), "--tag", repo],
    ):
        r = run_pipeline(args, env=env)
        assert r.returncode == 0, r.stderr
        logs += r.stdout + r.stderr
    r = run_pipeline(["push", str(out), "--tag", repo], env=env)
    assert r.returncode == 10, r.stdout + r.stderr  # no login yet: refused
    assert "docker login" in r.stderr
    logs += r.stdout + r.stderr
    login = subprocess.run(
        [DOCKER, "login", "-u", user, "--password-stdin", addr],
        input=secret,
        text=True,
        capture_output=True,
        env=dict(os.environ, **env),
        timeout=60,
    )
    assert login.returncode == 0, login.stderr
    r = run_pipeline(["push", str(out), "--tag", repo, "--json"], env=env)
    assert r.returncode == 0, r.stderr
    logs += r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["digest"].startswith("sha256:") and doc["pinned"].startswith(f"{repo}@")
    assert secret not in logs and auth not in logs
    for p in out.rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            assert secret.encode() not in data and auth.encode() not in data, p
    tag = doc["pushed"][0]["ref"]
    inspect = docker("image", "inspect", tag).stdout + docker("history", "--no-trunc", tag).stdout
    assert secret not in inspect and auth not in inspect
    # the layers this tool added (everything above the base) hold no trace of it either
    base_layers = len(
        json.loads(docker("image", "inspect", "standin.local/vllm/vllm-openai:v0.26.0").stdout)[0]["RootFS"]["Layers"]
    )
    saved = subprocess.run([DOCKER, "save", tag], capture_output=True, timeout=600).stdout
    with tarfile.open(fileobj=io.BytesIO(saved)) as tf:
        manifest = json.load(tf.extractfile("manifest.json"))
        assert len(manifest[0]["Layers"]) > base_layers
        for layer in manifest[0]["Layers"][base_layers:]:
            blob = tf.extractfile(layer).read()
            assert secret.encode() not in blob and auth.encode() not in blob
    for t in doc["pushed"]:
        docker("image", "rm", t["ref"], check=False)


def test_early_check_fails_the_build_in_seconds(e2e, tmp_path):
    """A base that is not the one the manifest describes (here: Python 3.12 claimed, 3.11 present)
    fails in the checks stage, before/while the wheelhouse installs: exit 9 with the reason."""
    import time

    doc = json.loads(e2e.manifest.read_text())
    doc["python"]["version"], doc["python"]["abi"] = "3.12", "cp312"
    manifest = tmp_path / "wrong-python.json"
    manifest.write_text(json.dumps(doc))
    lock = tmp_path / "wrong-python.lock"
    lock.write_text(e2e.lock.read_text().replace("# python: 3.11", "# python: 3.12"))
    out = tmp_path / "ctx"
    r = run_pipeline(
        ["render", "--vllm", "0.26.0", "--base", str(manifest), "--lock", str(lock), "-o", str(out), "--no-patches"]
    )
    assert r.returncode == 0, r.stderr
    t0 = time.monotonic()
    r = run_pipeline(["build", str(out), "--tag", "build-image-test/wrong-python"])
    assert r.returncode == 9, r.stdout + r.stderr
    assert "build-image check: " in r.stderr and "Python 3.11" in r.stderr
    assert time.monotonic() - t0 < 60


def test_missing_base_is_not_pulled_implicitly(e2e, tmp_path):
    ctx = tmp_path / "ctx"
    subprocess.run(["cp", "-a", str(e2e.context), str(ctx)], check=True)
    df = ctx / "Dockerfile"
    base = json.loads(e2e.manifest.read_text())["image"]
    df.write_text(df.read_text().replace(f"{base['ref']}@{base['digest']}", "standin.local/absent/base:v0"))
    r = run_pipeline(["build", str(ctx), "--tag", "build-image-test/absent"])
    assert r.returncode == 9 and "not in the engine's image store" in r.stderr, r.stderr


def test_registry_refusing_the_push_is_exit_10(e2e):
    """A registry that answers /v2/ but refuses every upload (403): exit 10, nothing reported pushed."""
    import http.server
    import threading

    class Refuse(http.server.BaseHTTPRequestHandler):
        def _answer(self, code, body=b"{}"):
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Docker-Distribution-API-Version", "registry/2.0")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self):
            self._answer(
                200 if self.path == "/v2/" else 404,
                b"{}" if self.path == "/v2/" else b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}',
            )

        do_HEAD = do_GET

        def do_POST(self):
            self._answer(403, b'{"errors":[{"code":"DENIED","message":"pushes are refused here"}]}')

        do_PUT = do_PATCH = do_POST

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    repo = f"127.0.0.1:{srv.server_address[1]}/e2e/vllm"
    try:
        for src in e2e.tags:
            docker("tag", src, f"{repo}:{src.rsplit(':', 1)[1]}")
        r = run_pipeline(["push", str(e2e.context), "--tag", repo, "--json"])
        assert r.returncode == 10, r.stdout + r.stderr
        assert "registry error" in r.stderr and r.stdout.strip() == ""
    finally:
        srv.shutdown()
        for src in e2e.tags:
            docker("image", "rm", f"{repo}:{src.rsplit(':', 1)[1]}", check=False)


def test_base_whose_vllm_files_differ_from_the_wheel_fails_the_early_check(e2e, standin_base_image, tmp_path):
    """The series is checked against a vllm wheel whose arg_utils.py differs from the file in the
    base image: the checks stage's `sha256sum -c original.sha256` fails the build (exit 9)."""
    import zipfile

    src = standin_base_image.vllm_wheel
    other = tmp_path / src.name
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(other, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename == "vllm/engine/arg_utils.py":
                data += b"\n# a different build of vllm 0.26.0\n"
            zout.writestr(info, data)
    out = tmp_path / "ctx"
    r = run_pipeline(
        [
            "render",
            "--vllm",
            "0.26.0",
            "--base",
            str(e2e.manifest),
            "--lock",
            str(e2e.lock),
            "-o",
            str(out),
            "--series",
            str(standin_base_image.series_dir),
            "--wheel",
            str(other),
        ]
    )
    assert r.returncode == 0, r.stderr
    r = run_pipeline(["build", str(out), "--tag", "build-image-test/wrong-originals"])
    assert r.returncode == 9, r.stdout + r.stderr
    assert "differ from the vllm 0.26.0 wheel's originals" in r.stderr
    assert "vllm/engine/arg_utils.py: FAILED" in r.stderr


def test_uv_installer_path_on_a_base_that_has_uv(standin_base_image, tmp_path):
    """The official image carries uv; the Dockerfile then installs with `uv pip install --system`.
    A stand-in variant with uv installed goes the whole way: snapshot (uv in the manifest) ->
    lock -> render (uv chosen) -> build -> run, with the base's ENV UV_OVERRIDE in place."""
    import shutil

    fl = tmp_path / "fl"
    shutil.copytree(standin_findlinks(tuple(OVERLAY)), fl)
    py = os.path.join(os.path.dirname(__import__("sys").executable), "python")
    r = subprocess.run(
        [
            py,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.11",
            "--platform",
            "manylinux_2_17_x86_64",
            "--platform",
            "manylinux2014_x86_64",
            "uv==0.13.9",
            "-d",
            str(fl),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    uv_wheel = next(fl.glob("uv-0.13.9-*.whl"))
    ctx = tmp_path / "uvbase"
    ctx.mkdir()
    shutil.copyfile(uv_wheel, ctx / uv_wheel.name)
    (ctx / "Dockerfile").write_text(
        f"FROM {standin_base_image.ref}\nCOPY {uv_wheel.name} /tmp/\n"
        f"RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-index --no-deps --root-user-action=ignore "
        f"/tmp/{uv_wheel.name} && rm /tmp/{uv_wheel.name}\n"
        # as vllm/vllm-openai 0.34.0 pins NCCL: an override file in the image's environment, which a
        # --require-hashes install would take as an unhashed requirement unless the overlay's install clears it
        "RUN echo 'vllm==0.26.0' > /etc/uv-overrides.txt\nENV UV_OVERRIDE=/etc/uv-overrides.txt\n"
    )
    ref = "standin.local/vllm/vllm-openai:v0.26.0-uv"
    docker("build", "--network=none", "-q", "-t", ref, str(ctx))
    manifest = tmp_path / "uv-base.json"
    r = run_pipeline(["base", "snapshot", "--image", ref, "-o", str(manifest)])
    assert r.returncode == 0, r.stderr
    snap = json.loads(manifest.read_text())
    assert "uv" in snap["distributions"]
    assert snap["uv_overrides"] == ["vllm==0.26.0"]  # read from the image's UV_OVERRIDE file
    args = [
        "--vllm",
        "0.26.0",
        "--base",
        str(manifest),
        "--lock",
        str(tmp_path / "uv.lock"),
        "--no-default-overlay",
        "--no-index",
        "--find-links",
        str(fl),
        "-o",
        str(tmp_path / "ctx"),
        "--tag",
        "build-image-test/uvpath",
        "--no-patches",
        "--json",
    ]
    for req in OVERLAY:
        args += ["--with", req]
    r = run_pipeline(args)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert "python3 -m uv pip install --system" in (tmp_path / "ctx" / "Dockerfile").read_text()
    r = docker(
        "run",
        "--rm",
        "--pull=never",
        "--network=none",
        doc["tags"][0],
        "python3",
        "-c",
        "import six, markupsafe._speedups, importlib.metadata as m; "
        "print('UV-OK', m.distribution('six').read_text('INSTALLER').strip())",
    )
    assert "UV-OK uv" in r.stdout  # installed by uv, not pip
    # the guard holds for uv too: UV_CONSTRAINT keeps the pins, a new unrelated package installs
    from tests.fx_wheels import write_wheel

    w = tmp_path / "guard"
    w.mkdir()
    write_wheel(w, "six", "1.99.0", "py3-none-any", {"six.py": "__version__ = '1.99.0'\n"})
    write_wheel(w, "bi-unrelated", "1.0", "py3-none-any", {"bi_unrelated.py": ""})

    def uv(*args):
        return docker(
            "run",
            "--rm",
            "--pull=never",
            "--network=none",
            "-v",
            f"{w}:/w:ro",
            doc["tags"][0],
            "python3",
            "-m",
            "uv",
            "pip",
            "install",
            "--system",
            "--break-system-packages",
            "--no-index",
            "-f",
            "/w",
            *args,
            check=False,
        )

    moved = uv("six==1.99.0")
    assert moved.returncode != 0 and "six==1.17.0" in moved.stderr, moved.stderr  # the constraint, named
    kept = uv("-U", "six")
    assert kept.returncode == 0 and "six==1.99.0" not in kept.stderr, kept.stderr  # the pin held
    new = uv("bi-unrelated")
    assert new.returncode == 0 and "bi-unrelated==1.0" in new.stderr, new.stderr
