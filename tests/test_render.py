"""Render as text: the Dockerfile, labels, tags, sha256 lists, the context's file list (fast)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from builder.errors import BadInput, IntegrityError
from builder.events import SILENT
from builder.image.naming import image_tags
from builder.image.render import (
    PatchedFile,
    RenderPlan,
    check_consistency,
    context_files,
    oci_labels,
    render_dockerfile,
    sha256_list,
    verify_context,
    write_context,
)
from builder.resolve.lockfile import LockEntry, LockFile, WheelRef
from builder.resolve.manifest import BaseManifest, DistFacts, Distribution

DIGEST = "sha256:" + "ab" * 32


def _manifest(digest=DIGEST, with_uv=True, python="3.12") -> BaseManifest:
    dists = {"vllm": Distribution("vllm", "0.26.0"), "numpy": Distribution("numpy", "1.26.4", DistFacts(binary=True))}
    if with_uv:
        dists["uv"] = Distribution("uv", "0.9.0")
    return BaseManifest(
        image_ref="vllm/vllm-openai:v0.26.0",
        image_digest=digest,
        os="Ubuntu 22.04",
        glibc="2.35",
        python_version=python,
        python_abi="cp" + python.replace(".", ""),
        site_packages=f"/usr/local/lib/python{python}/dist-packages",
        cuda="13.0",
        platform="x86_64-manylinux_2_35",
        provenance_kind="read-from-image",
        provenance_method="test",
        distributions=dists,
    )


def _wheel_bytes(name: str) -> bytes:
    return f"not really a wheel: {name}\n".encode()


def _lock(names=("ray", "six"), python="3.12", digest=DIGEST, base_dir: Path | None = None) -> LockFile:
    entries = []
    for n in names:
        data = _wheel_bytes(n)
        h = hashlib.sha256(data).hexdigest()
        fn = f"{n}-1.0-py3-none-any.whl"
        url = (base_dir / fn).as_uri() if base_dir else f"https://files.example/{fn}"
        entries.append(LockEntry(name=n, version="1.0", hashes=[h], wheel=WheelRef(url=url, sha256=h)))
    header = {
        "build-image-lock": "1",
        "tool": "t",
        "vllm": "0.26.0",
        "base-ref": "vllm/vllm-openai:v0.26.0",
        "base-digest": digest or "-",
        "base-manifest-sha256": "0" * 64,
        "python": python,
        "platform": "x86_64-manylinux_2_35",
        "inputs-sha256": "1" * 64,
    }
    return LockFile(header=header, overlay=list(names), allow_abi_change={}, entries=entries)


PATCHED = [
    PatchedFile("vllm/entrypoints/openai/api_server.py", "1" * 64, "2" * 64),
    PatchedFile("vllm/engine/arg_utils.py", "3" * 64, "4" * 64),
]


def _plan(**kw) -> RenderPlan:
    args = dict(
        vllm="0.26.0",
        base=_manifest(),
        lock=_lock(),
        patched=list(PATCHED),
        patches=["0001-a.patch", "0002-b.patch"],
        repo="127.0.0.1:5000/serving/vllm",
        source_date_epoch=1700000000,
    )
    args.update(kw)
    return RenderPlan(**args)


def _instructions(text: str) -> list[str]:
    """Dockerfile instructions (continuations joined, comments dropped)."""
    out, cur = [], ""
    for line in text.splitlines():
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        cur += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            out.append(" ".join(cur.split()))
            cur = ""
    return out


def test_from_is_pinned_by_digest_when_the_manifest_has_one():
    text = render_dockerfile(_plan())
    froms = [i for i in _instructions(text) if i.startswith("FROM ")]
    assert froms and all(f.split()[1] == f"vllm/vllm-openai:v0.26.0@{DIGEST}" for f in froms)
    unpinned = render_dockerfile(_plan(base=_manifest(digest=None), lock=_lock(digest=None)))
    assert all(i.split()[1] == "vllm/vllm-openai:v0.26.0" for i in _instructions(unpinned) if i.startswith("FROM "))


def test_layer_order_install_before_anything_patch_dependent():
    ins = _instructions(render_dockerfile(_plan()))
    main_start = max(i for i, x in enumerate(ins) if x.startswith("FROM "))
    main = ins[main_start:]
    install = next(i for i, x in enumerate(main) if "--require-hashes" in x)
    patch_layer = next(i for i, x in enumerate(main) if "source=patches" in x)
    # nothing that depends on the patches (or the checks stage, which copies original.sha256)
    # comes before the dependency layer in the final stage
    assert not any("patches" in x or "--from=checks" in x for x in main[:install])
    assert install < patch_layer
    assert main[-1].startswith("LABEL ")
    # the install never resolves and never touches the network: offline and hash-pinned
    assert all(flag in main[install] for flag in ("--no-index", "--no-deps", "--require-hashes"))
    assert "--mount=type=bind,source=wheels" in main[install]
    # the wheels never stay in a layer: no COPY of wheels anywhere
    assert not any(x.startswith(("COPY", "ADD")) and "wheels" in x for x in ins)


def test_changing_only_a_patch_leaves_the_dependency_layer_text_identical():
    a = _instructions(render_dockerfile(_plan()))
    b = _instructions(render_dockerfile(_plan(patched=[PATCHED[0]], patches=["0001-a.patch"])))

    def upto_install(ins):
        s = max(i for i, x in enumerate(ins) if x.startswith("FROM "))
        k = next(i for i, x in enumerate(ins) if "--require-hashes" in x)
        return ins[s : k + 1]

    assert upto_install(a) == upto_install(b)
    assert a != b


def test_early_checks_compare_python_vllm_and_original_sums():
    ins = _instructions(render_dockerfile(_plan()))
    checks_stage = ins[: max(i for i, x in enumerate(ins) if x.startswith("FROM "))]
    assert checks_stage[0].endswith(" AS checks")
    run = " ".join(x for x in checks_stage if x.startswith("RUN"))
    assert '[ "$py" = "3.12" ]' in run and '[ "$v" = "0.26.0" ]' in run
    assert "sha256sum --quiet --strict -c /build-image/original.sha256" in run
    assert any(x.startswith("COPY patches/original.sha256") for x in checks_stage)
    # python 3.11 base: the check follows the manifest
    t311 = render_dockerfile(_plan(base=_manifest(python="3.11"), lock=_lock(python="3.11")))
    assert '[ "$py" = "3.11" ]' in t311


def test_installer_follows_the_base():
    assert "python3 -m uv pip install --system" in render_dockerfile(_plan())
    pip = render_dockerfile(_plan(base=_manifest(with_uv=False)))
    assert "python3 -m pip install" in pip and "uv pip" not in pip


def test_no_patches_means_no_patch_steps():
    text = render_dockerfile(_plan(patched=[], patches=[]))
    assert "patches/" not in text and "original.sha256" not in text and "patched.sha256" not in text
    assert text.count("sha256sum") == 1  # only the floor checker's own sum (tests/test_floor.py)
    assert "patches/original.sha256" not in context_files(_plan(patched=[], patches=[]))


def test_labels_and_tags():
    plan = _plan()
    labels = dict(oci_labels(plan))
    h = plan.lock.lock_hash
    assert labels["org.build-image.lock-hash"] == h
    assert labels["org.build-image.vllm"] == "0.26.0"
    assert labels["org.build-image.base-digest"] == DIGEST
    assert labels["org.opencontainers.image.base.digest"] == DIGEST
    assert labels["org.build-image.patches"] == "0001-a.patch,0002-b.patch"
    assert labels["org.opencontainers.image.created"] == "2023-11-14T22:13:20Z"
    assert image_tags("127.0.0.1:5000/serving/vllm", "0.26.0", h) == [
        f"127.0.0.1:5000/serving/vllm:vllm0.26.0-{h[:12]}",
        "127.0.0.1:5000/serving/vllm:vllm0.26.0",
    ]
    text = render_dockerfile(plan)
    label_line = next(i for i in _instructions(text) if i.startswith("LABEL"))
    assert f'org.build-image.lock-hash="{h}"' in label_line
    # a different lock gives a different content tag
    assert image_tags("r/x", "0.26.0", _lock(names=("six",)).lock_hash)[0] != image_tags("r/x", "0.26.0", h)[0]
    for bad in ("repo:tag", "repo@sha256:" + "0" * 64, ""):
        with pytest.raises(
            BadInput, match=rf"--tag '{re.escape(bad)}': give an image repository without a tag or digest"
        ):
            image_tags(bad, "0.26.0", h)


def test_label_values_are_quoted_against_expansion():
    base = _manifest()
    base.image_ref = 'evil/$HOME"x:v1'
    text = render_dockerfile(_plan(base=base, lock=_lock()))
    assert '\\$HOME\\"x' in text


def test_sha256_lists_are_sha256sum_format_sorted():
    orig = sha256_list(PATCHED, "original")
    assert orig.splitlines() == [
        f"{'3' * 64}  vllm/engine/arg_utils.py",
        f"{'1' * 64}  vllm/entrypoints/openai/api_server.py",
    ]
    assert sha256_list(PATCHED, "patched").splitlines()[0].startswith("4" * 64 + "  ")


def test_consistency_errors():
    with pytest.raises(BadInput, match="Python 3.11"):
        check_consistency(_plan(lock=_lock(python="3.11")))
    with pytest.raises(BadInput, match="base-digest"):
        check_consistency(_plan(lock=_lock(digest="sha256:" + "cd" * 32)))
    lock = _lock()
    lock.entries[0].wheel = None
    with pytest.raises(BadInput, match="no '# wheel:' line"):
        check_consistency(_plan(lock=lock))


def _write(tmp_path: Path, plan: RenderPlan | None = None) -> tuple[Path, RenderPlan]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    src = tmp_path / "src"
    src.mkdir()
    lock = _lock(base_dir=src)
    wheels = {}
    for e in lock.entries:
        p = src / e.wheel.filename
        p.write_bytes(_wheel_bytes(e.name))
        wheels[e.wheel.filename] = p
    pr = tmp_path / "patched"
    patched = []
    for rel, content in (("vllm/a.py", b"A = 2\n"), ("vllm/sub/b.py", b"B = 2\n")):
        (pr / rel).parent.mkdir(parents=True, exist_ok=True)
        (pr / rel).write_bytes(content)
        patched.append(
            PatchedFile(
                rel, hashlib.sha256(content.replace(b"2", b"1")).hexdigest(), hashlib.sha256(content).hexdigest()
            )
        )
    plan = plan or _plan(lock=lock, patched=patched, patches=["0001-x.patch"])
    out = tmp_path / "ctx"
    write_context(out, plan, wheels=wheels, patched_root=pr)
    return out, plan


def test_write_context_holds_exactly_the_listed_files(tmp_path):
    out, plan = _write(tmp_path)
    on_disk = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert on_disk == context_files(plan)
    assert "wheels/ray-1.0-py3-none-any.whl" in on_disk and "app/build_image_serve_app.py" in on_disk
    assert (out / "patches" / "patched.sha256").read_text() == sha256_list(plan.patched, "patched")
    assert verify_context(out).lock_hash == plan.lock.lock_hash
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ctx.")]  # no temp dirs left


def test_write_context_is_atomic_on_a_bad_wheel(tmp_path):
    out, plan = _write(tmp_path)
    before = sorted(p.name for p in out.rglob("*"))
    bad = tmp_path / "bad.whl"
    bad.write_bytes(b"corrupt")
    wheels = {e.wheel.filename: bad for e in plan.lock.entries}
    with pytest.raises(IntegrityError, match="does not match"):
        write_context(out, plan, wheels=wheels, patched_root=tmp_path / "patched")
    assert sorted(p.name for p in out.rglob("*")) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ctx.")]


def test_verify_context_missing_wheel_and_hash_mismatch(tmp_path):
    out, plan = _write(tmp_path)
    first = out / "wheels" / plan.lock.entries[0].wheel.filename
    data = first.read_bytes()
    first.write_bytes(data + b"tampered")
    with pytest.raises(IntegrityError, match="does not match"):
        verify_context(out)
    first.unlink()
    with pytest.raises(BadInput, match="lacks 1 locked wheel"):
        verify_context(out)
    first.write_bytes(data)
    verify_context(out)
    (out / "patches" / "files" / "vllm" / "a.py").write_text("changed\n")
    with pytest.raises(IntegrityError, match="patched.sha256"):
        verify_context(out)


def test_verify_context_refuses_files_nothing_verifies(tmp_path):
    """The image copies all of patches/files/ over vllm and sha256sum -c checks only the listed files;
    the wheelhouse is exactly the lock: an extra file in either is refused, not built in unverified."""
    out, plan = _write(tmp_path)
    verify_context(out)
    evil = out / "patches" / "files" / "vllm" / "evil.py"
    evil.write_text("import os\n")
    with pytest.raises(IntegrityError, match=r"does not list: vllm/evil\.py"):
        verify_context(out)
    evil.unlink()
    (out / "wheels" / "extra-1.0-py3-none-any.whl").write_bytes(b"x")
    with pytest.raises(IntegrityError, match="extra-1.0-py3-none-any.whl"):
        verify_context(out)


def test_cli_build_reports_missing_wheel_with_exit_code(tmp_path):
    from click.testing import CliRunner

    from builder.cli import main

    out, plan = _write(tmp_path)
    wheel = out / "wheels" / plan.lock.entries[0].wheel.filename
    data = wheel.read_bytes()
    env = {"DOCKER_HOST": f"unix://{tmp_path}/dead.sock"}
    # the context is verified before the engine is asked: broken contexts fail the same everywhere
    wheel.write_bytes(data + b"x")
    r = CliRunner().invoke(main, ["build", str(out)], env=env)
    assert r.exit_code == 7, r.output
    assert "does not match requirements.lock" in r.output
    wheel.unlink()
    r = CliRunner().invoke(main, ["build", str(out)], env=env)
    assert r.exit_code == 2, r.output
    assert wheel.name in r.output
    wheel.write_bytes(data)
    r = CliRunner().invoke(main, ["build", str(out)], env=env)
    assert r.exit_code == 8, r.output
    assert "not reachable" in r.output


def test_base_refs_lists_images_not_stages():
    from builder.image.render import base_refs

    text = render_dockerfile(_plan())
    assert base_refs(text) == [f"vllm/vllm-openai:v0.26.0@{DIGEST}"]
    assert base_refs("FROM a:1 AS x\nFROM x\nFROM --platform=linux/amd64 b:2\n") == ["a:1", "b:2"]


def test_render_context_with_kuberay_manifests(tmp_path, monkeypatch):
    """render --kuberay: the manifests land in the context beside the Dockerfile, naming the image."""
    from builder.image.render import render_context
    from builder.serving.kuberay import write_manifests
    from builder.spec import Spec

    monkeypatch.setenv("BUILD_IMAGE_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "src"
    src.mkdir()
    lock = _lock(base_dir=src)
    for e in lock.entries:
        (src / e.wheel.filename).write_bytes(_wheel_bytes(e.name))
    spec = Spec().with_flags(model="/models/m", repo="127.0.0.1:5000/serving/vllm")
    seen = []

    def kuberay(tmp, tags):  # what the render command hands render_context for --kuberay
        seen.append((tmp, list(tags)))
        assert (tmp / "Dockerfile").is_file() and tmp != tmp_path / "ctx"  # written before the rename
        return write_manifests(tmp, lock=lock, spec=spec, image=tags[0], allow_tag=True, base=_manifest())

    res = render_context(
        vllm="0.26.0",
        base=_manifest(),
        lock=lock,
        out_dir=tmp_path / "ctx",
        no_patches=True,
        repo=spec.repo,
        extra=kuberay,
    )
    assert [t for _, t in seen] == [list(res.tags)]
    assert "rayservice.yaml" in res.files and "raycluster.yaml" in res.files
    text = (tmp_path / "ctx" / "rayservice.yaml").read_text()
    assert res.tags[0] in text
    on_disk = sorted(str(p.relative_to(tmp_path / "ctx")) for p in (tmp_path / "ctx").rglob("*") if p.is_file())
    assert on_disk == sorted(res.files)


def test_render_command_writes_kuberay_manifests_into_the_context(tmp_path, monkeypatch):
    """`render --kuberay`: the manifests are in the context (listed in --json files), running the
    content-addressed tag, or the --image given."""
    from click.testing import CliRunner

    from builder.cli import main

    monkeypatch.setenv("BUILD_IMAGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    lock = _lock(base_dir=src)
    for e in lock.entries:
        (src / e.wheel.filename).write_bytes(_wheel_bytes(e.name))
    (tmp_path / "requirements.lock").write_text(lock.format(), encoding="utf-8")
    _manifest().save(tmp_path / "base.json")
    args = [
        "render",
        "--vllm",
        "0.26.0",
        "--base",
        "base.json",
        "--lock",
        "requirements.lock",
        "--no-patches",
        "--tag",
        "127.0.0.1:5000/serving/vllm",
        "--json",
    ]
    kuberay = ["--model", "/models/m", "--kuberay", "--allow-tag"]
    for extra, image in (([], None), (["--image", "127.0.0.1:5000/serving/vllm@sha256:" + "c" * 64], "given")):
        r = CliRunner().invoke(main, [*args, *kuberay, "-o", "ctx", *extra])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        assert {"rayservice.yaml", "raycluster.yaml"} <= set(doc["files"])
        text = (tmp_path / "ctx" / "rayservice.yaml").read_text()
        assert (extra[1] if image else doc["tags"][0]) in text
    r = CliRunner().invoke(main, [*args, "-o", "plain"])
    assert r.exit_code == 0, r.output
    assert not (tmp_path / "plain" / "rayservice.yaml").exists()


def test_parse_ref_and_loopback_scheme():
    from builder.image.registry import RegistryClient, parse_ref

    r = parse_ref("127.0.0.1:5000/serving/vllm:vllm0.26.0-abc")
    assert (r.registry, r.repository, r.tag, r.digest) == ("127.0.0.1:5000", "serving/vllm", "vllm0.26.0-abc", None)
    r = parse_ref("vllm/vllm-openai:v0.26.0@" + DIGEST)
    assert (r.registry, r.repository, r.tag, r.digest) == ("docker.io", "vllm/vllm-openai", "v0.26.0", DIGEST)
    assert parse_ref("ubuntu").repository == "library/ubuntu"
    assert RegistryClient("127.0.0.1:5000").base == "http://127.0.0.1:5000"
    assert RegistryClient("ghcr.io").base == "https://ghcr.io"
    for bad, why in (
        ("Upper/Case:x", "repository 'Upper/Case' is not a valid name"),
        ("a b", "is not valid"),
        ("x@sha256:123", r"digest 'sha256:123' is not sha256:<64 hex>"),
    ):
        with pytest.raises(BadInput, match=why):
            parse_ref(bad)


def test_registry_unreachable_is_a_registry_error():
    import socket

    from builder.errors import RegistryError
    from builder.image.registry import RegistryClient

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(RegistryError, match="unreachable"):
        RegistryClient(f"127.0.0.1:{port}", timeout=2).manifest_digest("x/y", "latest")


def test_engine_output_is_redacted():
    from builder.engine import redact

    text = 'Authorization: Basic dXNlcjpzM2NyM3Q= and "password": "hunter2", token=abc123 ok'
    out = redact(text)
    assert "dXNlcjpzM2NyM3Q=" not in out and "hunter2" not in out and "abc123" not in out and out.endswith("ok")


def test_render_refuses_to_replace_a_directory_it_did_not_write(tmp_path):
    precious = tmp_path / "ctx"
    precious.mkdir()
    (precious / "notes.txt").write_text("mine\n")
    plan = _plan()
    with pytest.raises(BadInput, match="not a build context rendered by build-image"):
        write_context(precious, plan, wheels={}, patched_root=None)
    assert (precious / "notes.txt").read_text() == "mine\n"
    # a context it rendered is replaced
    out, plan = _write(tmp_path / "again")
    before = (out / "Dockerfile").read_text()
    wheels = {e.wheel.filename: tmp_path / "again" / "src" / e.wheel.filename for e in plan.lock.entries}
    write_context(out, plan, wheels=wheels, patched_root=tmp_path / "again" / "patched")
    assert (out / "Dockerfile").read_text() == before


def test_stale_bytecode_of_patched_modules_only_is_removed(tmp_path):
    """The patch layer drops the patched modules' own .pyc (every interpreter tag), and no other
    module's: a `find __pycache__ -delete` wiped the whole models/ bytecode of the base."""
    import subprocess

    ins = _instructions(render_dockerfile(_plan()))
    run = next(x for x in ins if "source=patches" in x)
    rm = run[run.index("rm -f ") :]
    cache = tmp_path / "vllm/entrypoints/openai/__pycache__"
    cache.mkdir(parents=True)
    other = tmp_path / "vllm/engine/__pycache__"
    other.mkdir(parents=True)
    for name in (
        "api_server.cpython-312.pyc",
        "api_server.cpython-312.opt-1.pyc",
        "api_server_x.cpython-312.pyc",
        "serving_chat.cpython-312.pyc",
    ):
        (cache / name).write_bytes(b"")
    (other / "arg_utils.cpython-312.pyc").write_bytes(b"")
    (other / "llm_engine.cpython-312.pyc").write_bytes(b"")
    subprocess.run(["sh", "-c", "set -eu; " + rm], cwd=tmp_path, check=True)
    assert sorted(p.name for p in cache.iterdir()) == ["api_server_x.cpython-312.pyc", "serving_chat.cpython-312.pyc"]
    assert sorted(p.name for p in other.iterdir()) == ["llm_engine.cpython-312.pyc"]
    # a second run (nothing left to delete) still succeeds
    subprocess.run(["sh", "-c", "set -eu; " + rm], cwd=tmp_path, check=True)


# ------------------------------------------------------------------ push logic (fake engine + registry)
class _FakeEngine:
    def __init__(self, image_id, pushed_digest):
        self.image_id, self.pushed_digest, self.pushes = image_id, pushed_digest, []

    def ping(self):
        return "fake"

    def inspect(self, ref):
        from builder.engine import ImageInfo

        return ImageInfo(id=self.image_id, size=1)

    def push(self, ref, reporter=SILENT):
        from builder.engine import PushedRef

        self.pushes.append(ref)
        return PushedRef(ref=ref, digest=self.pushed_digest)


class _FakeRegistry:
    def __init__(self, before, after):
        self.before, self.after, self.calls = before, after, 0

    def ping(self):
        pass

    def manifest(self, repository, reference):
        self.calls += 1
        return self.before if self.calls == 1 else self.after


CA_TAG = "127.0.0.1:5000/s/v:vllm0.26.0-0123456789ab"
MOVING_TAG = "127.0.0.1:5000/s/v:vllm0.26.0"


def _push_with(monkeypatch, engine, registry, tags=(CA_TAG,), **kw):
    import builder.image.registry as R
    from builder.image.push import push_image

    monkeypatch.setattr(R, "client_for", lambda t: (registry, R.parse_ref(t)))
    return push_image(list(tags), engine=engine, **kw).to_dict()


IMG = "sha256:" + "1" * 64
MAN = "sha256:" + "2" * 64


def test_push_tag_on_a_manifest_list_is_a_conflict(monkeypatch):
    """An index has no single config: it is not "nothing there", so it is not silently overwritten."""
    from builder.errors import TagConflict

    index = (MAN, {"mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []})
    eng = _FakeEngine(IMG, MAN)
    with pytest.raises(TagConflict, match="index"):
        _push_with(monkeypatch, eng, _FakeRegistry(index, None))
    assert eng.pushes == []


def test_push_verifies_the_registry_serves_the_local_image(monkeypatch):
    """The registry's manifest digest equals what the engine reported, but its config is another image."""
    from builder.errors import RegistryError

    other = (MAN, {"config": {"digest": "sha256:" + "3" * 64}})
    with pytest.raises(RegistryError, match="local image"):
        _push_with(monkeypatch, _FakeEngine(IMG, MAN), _FakeRegistry(None, other))
    same = (MAN, {"config": {"digest": IMG}})
    doc = _push_with(monkeypatch, _FakeEngine(IMG, MAN), _FakeRegistry(None, same))
    assert doc["digest"] == MAN and doc["pinned"] == f"127.0.0.1:5000/s/v@{MAN}"


def test_moving_tag_moves_without_force_the_content_addressed_one_does_not(monkeypatch):
    """A new lock: REPO:vllm0.26.0 points at the previous image -> it moves (routine, listed in moved_tags);
    REPO:vllm0.26.0-<hash> pointing elsewhere means a different build of the same lock -> exit 11."""
    from builder.errors import TagConflict

    old = (MAN, {"config": {"digest": "sha256:" + "9" * 64}})

    class Reg(_FakeRegistry):
        def __init__(self, before):
            self.before, self.seen = before, set()

        def manifest(self, repository, reference):
            tag = f"127.0.0.1:5000/{repository}:{reference}"
            if tag in self.seen:  # after its push
                return (MAN, {"config": {"digest": IMG}})
            self.seen.add(tag)
            return self.before.get(tag)

    doc = _push_with(monkeypatch, _FakeEngine(IMG, MAN), Reg({MOVING_TAG: old}), tags=(CA_TAG, MOVING_TAG))
    assert doc["moved_tags"] == [MOVING_TAG] and [p["ref"] for p in doc["pushed"]] == [CA_TAG, MOVING_TAG]
    eng = _FakeEngine(IMG, MAN)
    with pytest.raises(TagConflict, match="vllm0.26.0-0123456789ab"):
        _push_with(monkeypatch, eng, Reg({CA_TAG: old, MOVING_TAG: old}), tags=(CA_TAG, MOVING_TAG))
    assert eng.pushes == []


def test_registry_credentials_from_a_credential_helper(tmp_path, monkeypatch):
    """`docker login` with credsStore/credHelpers leaves `auths` empty: the helper is asked, per registry."""
    import base64

    from builder.image.registry import _docker_config_auth

    bindir = tmp_path / "bin"
    bindir.mkdir()
    helper = bindir / "docker-credential-fake"
    helper.write_text(
        '#!/bin/sh\n[ "$1" = get ] || exit 1\nread server\n'
        'case "$server" in 127.0.0.1:5000) echo \'{"ServerURL":"x","Username":"u","Secret":"s3cret"}\';; '
        '*) echo "credentials not found in native keychain"; exit 1;; esac\n'
    )
    helper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"auths": {"127.0.0.1:5000": {}}, "credsStore": "fake"}))
    assert base64.b64decode(_docker_config_auth("127.0.0.1:5000")).decode() == "u:s3cret"
    assert _docker_config_auth("127.0.0.1:5001") is None  # the helper has nothing: no auth, no error
    (tmp_path / "config.json").write_text(json.dumps({"credHelpers": {"127.0.0.1:5000": "fake"}}))
    assert base64.b64decode(_docker_config_auth("127.0.0.1:5000")).decode() == "u:s3cret"
    (tmp_path / "config.json").write_text(json.dumps({"credHelpers": {"127.0.0.1:5000": "../../bin/sh"}}))
    assert _docker_config_auth("127.0.0.1:5000") is None  # a helper name is a name, never a path


def test_tags_refused_at_render_when_docker_would_refuse_them():
    """An uppercase repository or a vllm local version ('+') would only fail in `docker build`, after render."""
    with pytest.raises(BadInput, match="not a valid name"):
        image_tags("127.0.0.1:5000/Serving/vllm", "0.26.0", "a" * 64)
    with pytest.raises(BadInput, match="not valid image tags"):
        image_tags("127.0.0.1:5000/serving/vllm", "0.26.0+cu130", "a" * 64)
    assert (
        image_tags("127.0.0.1:5000/serving/vllm", "0.26.0", "a" * 64)[0]
        == "127.0.0.1:5000/serving/vllm:vllm0.26.0-aaaaaaaaaaaa"
    )


@pytest.mark.parametrize(
    "header, expect", [("ray-serve-llm", "ray-serve-llm"), ("vllm-server", "vllm-server"), (None, "auto")]
)
def test_the_locks_serve_backend_becomes_the_images_default(header, expect):
    """The lock's `serve-backend` line is what the image's Serve application uses by default:
    an ENV the module reads, and a label a reviewer (or smoke) can inspect."""
    lock = _lock()
    if header:
        lock.header["serve-backend"] = header
    plan = _plan(lock=lock)
    assert plan.serve_backend == expect
    instr = _instructions(render_dockerfile(plan))
    assert f"ENV BUILD_IMAGE_SERVE_BACKEND={expect}" in instr
    # set after the application module is copied, before the labels
    env_at = instr.index(f"ENV BUILD_IMAGE_SERVE_BACKEND={expect}")
    assert env_at > next(i for i, s in enumerate(instr) if "build_image_serve_app.py" in s)
    assert dict(oci_labels(plan))["org.build-image.serve-backend"] == expect
    # without the application there is nothing to configure
    no_app = _plan(lock=lock, serve_app=False)
    assert not any(s.startswith("ENV BUILD_IMAGE_SERVE_BACKEND") for s in _instructions(render_dockerfile(no_app)))
    assert dict(oci_labels(no_app))["org.build-image.serve-backend"] == "-"


def test_a_lock_with_an_unknown_serve_backend_is_refused():
    lock = _lock()
    lock.header["serve-backend"] = "ray-serve-llm; rm -rf /"
    with pytest.raises(BadInput, match="header 'serve-backend' is .*must be one of auto, ray-serve-llm, vllm-server"):
        render_dockerfile(_plan(lock=lock))


def test_the_committed_default_locks_serve_backend_reaches_the_dockerfile():
    """Every committed default lock's serve-backend is rendered as the image's default backend."""
    from builder.resolve.lockfile import load_lock
    from builder.util import project_root

    locks = sorted((project_root() / "lockfiles").glob("vllm-*/requirements.lock"))
    assert len(locks) >= 9
    seen = set()
    for path in locks:
        lock = load_lock(path)
        plan = _plan(vllm=lock.header["vllm"], lock=lock, base=_manifest(digest=None), patched=[], patches=[])
        backend = lock.header["serve-backend"]
        seen.add(backend)
        assert f"ENV BUILD_IMAGE_SERVE_BACKEND={backend}" in _instructions(render_dockerfile(plan)), path
    assert seen <= {"ray-serve-llm", "vllm-server", "auto"}
