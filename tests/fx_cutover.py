"""Helpers for the cutover tests: tiny images pushed with skopeo, smoke verdicts attached, the CLI run.

An image here is an OCI layout written in Python (one small tar layer, a config with env, entrypoint, cmd and
labels) and copied into the registry by ``skopeo copy`` (no engine, no pull); skopeo also reads the tags back,
independently of build-image's registry client.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import uuid
from pathlib import Path

from tests.fx_docker import missing

BUILD_IMAGE = str(Path(sys.executable).parent / "build-image")
ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "lockfiles" / "vllm-0.26.0" / "requirements.lock"
CHECKPOINT_SHA = "c" * 64
GPU = "NVIDIA H200"


def need_skopeo() -> None:
    if shutil.which("skopeo") is None:
        missing("skopeo is not installed (scripts/services.sh install)")


def unique_repo(prefix: str = "cutover") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}/app"


def _blob(root: Path, data: bytes) -> dict:
    h = hashlib.sha256(data).hexdigest()
    (root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / "sha256" / h).write_bytes(data)
    return {"digest": f"sha256:{h}", "size": len(data)}


def oci_layout(root: Path, *, env: list[str], cmd: list[str], labels: dict[str, str], payload: str) -> Path:
    """A one-layer OCI image layout at ``root`` (a FROM-scratch image holding one file)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = payload.encode()
        info = tarfile.TarInfo("app/version.txt")
        info.size, info.mtime = len(data), 0
        tar.addfile(info, io.BytesIO(data))
    layer = buf.getvalue()
    lay = _blob(root, layer)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": env, "Entrypoint": ["/app/serve"], "Cmd": cmd, "Labels": labels},
        "rootfs": {"type": "layers", "diff_ids": [lay["digest"]]},
    }
    cfg = _blob(root, json.dumps(config).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **cfg},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **lay}],
    }
    man = _blob(root, json.dumps(manifest).encode())
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (root / "index.json").write_text(
        json.dumps(
            {"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", **man}]}
        )
    )
    return root


def skopeo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["skopeo", *args], capture_output=True, text=True, timeout=120)


def push_image(tmp: Path, ref: str, name: str) -> str:
    """Push a tiny image ``name`` (its env, cmd and label say which) to ``ref``; its registry digest."""
    layout = oci_layout(
        tmp / f"layout-{name}-{uuid.uuid4().hex[:6]}",
        env=[f"APP={name}", "PATH=/bin"],
        cmd=["--name", name],
        labels={"org.example.image": name},
        payload=name,
    )
    r = skopeo("copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}", f"docker://{ref}")
    assert r.returncode == 0, r.stderr
    return tag_digest(ref)


def tag_digest(ref: str) -> str | None:
    """The digest ``ref`` points at, read by skopeo (None when the tag does not exist)."""
    r = skopeo("inspect", "--tls-verify=false", "--raw", f"docker://{ref}")
    if r.returncode != 0:
        assert "manifest unknown" in r.stderr or "not found" in r.stderr.lower(), r.stderr
        return None
    return "sha256:" + hashlib.sha256(r.stdout.encode()).hexdigest()


def smoke_report(**kw) -> dict:
    return smoke_report_obj(**kw).to_dict()


def smoke_report_obj(
    *, verdict: str = "PASS", concurrency: int = 16, rounds: int = 3, max_model_len: int | None = 4096, tp: int = 1
):
    """A SmokeReport as ``run_smoke`` returns it (the real dataclass), without a GPU."""
    from builder.serving.smoke import RoundResult, SmokeReport

    done = [
        RoundResult(
            round=i + 1,
            requests=concurrency,
            ok=concurrency,
            failed=0,
            wall_s=2.0,
            latency_p50_s=1.0,
            latency_p95_s=1.5,
            ttft_p50_s=0.1,
            output_tokens=64 * concurrency,
            output_tokens_per_s=500.0,
            errors=[],
        )
        for i in range(rounds)
    ]
    settings = {
        "tp": tp,
        "pp": 1,
        "max_model_len": max_model_len,
        "concurrency": concurrency,
        "rounds": rounds,
        "prompt_tokens": 128,
        "max_tokens": 64,
        "gpu_memory_utilization": 0.9,
        "max_num_seqs": None,
        "kv_cache_dtype": None,
        "extra_args": [],
        "serve": False,
    }
    rep = SmokeReport(
        verdict=verdict,
        failures=[] if verdict == "PASS" else ["round 2: 3 of 16 requests failed"],
        mode="docker",
        model="/data/models/qwen",
        image=None,
        command=[],
        settings=settings,
        boot={"health_s": 40.0, "first_token_s": 41.0},
        kv_cache={},
        rounds=done,
        throughput={"output_tokens_per_s": 500.0},
        gpu={"gpus": 1, "memory_used_mib_peak": 120000},
        plan=None,
        server_exit_code=None,
        log_file=None,
        log_tail=[],
        layer_rewrites=[],
        engine={"vllm": "0.26.0"},
    )
    return rep


def statement(name: str, digest: str, *, checkpoint_sha: str = CHECKPOINT_SHA, gpu: str = GPU, **report) -> dict:
    from builder.serving.attestation import smoke_statement

    ck = {"path": "/data/models/qwen", "size_bytes": 1234, "verify": "READY", "index_sha256": checkpoint_sha}
    return smoke_statement(
        smoke_report(**report), name=name, digest=digest, checkpoint=ck, gpu_names=[gpu], created="2026-12-03T16:00:00Z"
    )


def make_key(folder: Path, kind: str = "ec", *, password: bytes | None = None) -> tuple[Path, Path]:
    """(private key file, mode 0600; public key file) of a fresh ECDSA P-256 or Ed25519 key in ``folder``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    key = ec.generate_private_key(ec.SECP256R1()) if kind == "ec" else ed25519.Ed25519PrivateKey.generate()
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{kind}-{uuid.uuid4().hex[:8]}"
    enc = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    priv, pub = folder / f"{name}.key", folder / f"{name}.pub"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc))
    priv.chmod(0o600)
    pub.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return priv, pub


@functools.lru_cache(maxsize=1)
def signing_key() -> tuple[Path, Path]:
    """The key the cutover tests sign verdicts with (one per test process); its public key is the specs'
    ``[serving] trusted_keys``."""
    folder = Path(tempfile.mkdtemp(prefix="bi-test-keys-"))
    atexit.register(shutil.rmtree, folder, True)  # gone with the test process
    return make_key(folder)


def attest(registry: str, repo: str, digest: str, *, sign_key: Path | None | bool = True, **kw):
    """Attach a verdict signed by :func:`signing_key` (``sign_key``: another key file, or False: unsigned)."""
    from builder.serving.attestation import attach_statement
    from builder.signing import load_signer

    key = signing_key()[0] if sign_key is True else sign_key
    signer = load_signer(key) if key else None
    return attach_statement(f"{registry}/{repo}@{digest}", statement(f"{registry}/{repo}", digest, **kw), signer)


def write_spec(path: Path, *, concurrency: int = 16, max_model_len: int = 4096, tp: int = 1) -> Path:
    path.write_text(f'''vllm = "0.26.0"
lock = "{LOCK}"

[serving]
model = "/models/qwen"
gpus = 1
tp = {tp}
max_model_len = {max_model_len}
concurrency = {concurrency}
gpu_model = "{GPU}"
checkpoint_sha256 = "{CHECKPOINT_SHA}"
trusted_keys = ["{signing_key()[1]}"]
''')
    return path


def cli(*args: str, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [BUILD_IMAGE, *args], capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **(env or {}))
    )


def make_world(tmp_path: Path, local_registry: str):
    """A fresh repository on the local registry with the deploy tag on image "old" and a second image "new"
    pushed by digest; a spec for the target; the history file's path."""
    need_skopeo()
    repo = unique_repo()
    base = f"{local_registry}/{repo}"
    old = push_image(tmp_path, f"{base}:prod", "old")
    new = push_image(tmp_path, f"{base}:candidate", "new")
    return type(
        "World",
        (),
        {
            "registry": local_registry,
            "repo": repo,
            "base": base,
            "old": old,
            "new": new,
            "tag": f"{base}:prod",
            "spec": write_spec(tmp_path / "build-image.toml"),
            "history": tmp_path / "history.json",
            "tmp": tmp_path,
        },
    )
