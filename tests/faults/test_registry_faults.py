"""The registry dies during `build-image push`: a registry error (exit 10) naming the registry, not
"engine unavailable"; nothing reported as pushed; a re-push after the restart verifies the digest."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request

import pytest

from builder.engine import engine_unreachable, registry_fault

from .conftest import BUILD_IMAGE, tiny_context

DIAL = 'Get "http://127.0.0.1:5077/v2/": dial tcp 127.0.0.1:5077: connect: connection refused'


def test_a_registry_dial_error_is_not_an_engine_fault():
    assert registry_fault(DIAL, "127.0.0.1:5077")
    assert not engine_unreachable(DIAL)
    assert not registry_fault(DIAL, "127.0.0.1:5000")
    daemon = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
    assert engine_unreachable(daemon) and not registry_fault(daemon, "127.0.0.1:5077")
    assert registry_fault("dial tcp 127.0.0.1:5077: connect: connection refused", "127.0.0.1:5077")


def _manifest_digest(addr: str, repo: str, tag: str) -> str | None:
    req = urllib.request.Request(
        f"http://{addr}/v2/{repo}/manifests/{tag}",
        method="HEAD",
        headers={
            "Accept": "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"
        },
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.headers.get("Docker-Content-Digest")
    except urllib.error.HTTPError:
        return None


@pytest.mark.slow
@pytest.mark.docker
def test_registry_killed_during_push_is_a_registry_error(tmp_path, docker_engine, own_registry):
    from builder.image.render import tags_for_context

    ctx, _plan = tiny_context(tmp_path)
    repo = f"{own_registry.addr}/faults/vllm"
    _v, tags, _lock = tags_for_context(ctx, repo)
    img = tmp_path / "img"
    img.mkdir()
    (img / "blob").write_bytes(os.urandom(4 << 20))
    (img / "Dockerfile").write_text("FROM scratch\nCOPY blob /blob\n")
    args = ["build", "--pull=false", "-q"] + [a for t in tags for a in ("-t", t)] + [str(img)]
    r = subprocess.run(["/usr/bin/docker", *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    try:
        proc = subprocess.Popen(
            [BUILD_IMAGE, "push", str(ctx), "--tag", repo], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        err_lines = []
        for line in proc.stderr:
            err_lines.append(line)
            if line.startswith("push: "):  # the conflict check passed; the engine push starts now
                own_registry.kill()
                break
        out, rest = proc.communicate(timeout=300)
        err = "".join(err_lines) + rest
        assert proc.returncode == 10, err
        assert f"registry {own_registry.addr}" in err and "not reachable" in err, err
        assert "Docker engine" not in err and "start dockerd" not in err, err
        assert "pushed" not in out, out
        # restart it (same storage, same port): the re-push goes through and the digest is verified
        own_registry.start()
        r = subprocess.run(
            [BUILD_IMAGE, "push", str(ctx), "--tag", repo, "--json"], capture_output=True, text=True, timeout=300
        )
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        for p in doc["pushed"]:
            tag = p["ref"].rsplit(":", 1)[1]
            assert _manifest_digest(own_registry.addr, "faults/vllm", tag) == p["digest"]
    finally:
        subprocess.run(["/usr/bin/docker", "image", "rm", "-f", *tags], capture_output=True, timeout=120)
