"""`base recipe --sdist PATH` / `--source DIR`: a nightly's or a fork's build files, refused when the
archive is not a vLLM sdist or tries to reach outside itself; nothing is extracted anywhere."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builder.cli import main
from builder.errors import BadInput
from builder.resolve import sdist
from tests.fx_sdist import DOCKERFILE, PIPELINE, REQUIREMENTS, write_sdist

FILES = {
    "docker/Dockerfile": DOCKERFILE,
    ".buildkite/release-pipeline.yaml": PIPELINE,
    **REQUIREMENTS,
    "PKG-INFO": "Metadata-Version: 2.1\nName: vllm\nVersion: 0.99.0\n",
}


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _recipe(*args: str):
    return CliRunner().invoke(main, ["base", "recipe", *args])


def test_a_local_sdist_gives_the_recipe_with_its_own_sha256(tmp_path):
    p = write_sdist(tmp_path, "0.99.0", FILES)
    r = _recipe("--sdist", str(p), "--json")
    assert r.exit_code == 0, r.output
    import hashlib
    import json

    doc = json.loads(r.stdout)
    assert doc["vllm"] == "0.99.0" and doc["sdist"]["sha256"] == hashlib.sha256(p.read_bytes()).hexdigest()
    assert _recipe("--sdist", str(p), "--vllm", "0.98.0").exit_code == 2  # it says another version


@pytest.mark.parametrize(
    "case", ["not-a-tar", "foreign", "no-dockerfile", "dotdot", "absolute", "symlink", "huge", "two-tops"]
)
def test_a_corrupt_or_foreign_sdist_is_exit_2_naming_it(tmp_path, case):
    p = tmp_path / "vllm-0.99.0.tar.gz"
    good = [_file(f"vllm-0.99.0/{k}", v.encode()) for k, v in FILES.items()]
    if case == "not-a-tar":
        p.write_bytes(b"\x1f\x8b garbage" * 100)
    elif case == "foreign":
        _tar(
            p,
            [
                _file("other-1.0/PKG-INFO", b"Name: other\nVersion: 1.0\n"),
                _file("other-1.0/docker/Dockerfile", b"FROM x\n"),
            ],
        )
    elif case == "no-dockerfile":
        _tar(p, [m for m in good if not m[0].name.endswith("docker/Dockerfile")])
    elif case == "dotdot":
        _tar(p, [*good, _file("vllm-0.99.0/../../escape.txt", b"x")])
    elif case == "absolute":
        _tar(p, [*good, _file("/etc/escape", b"x")])
    elif case == "symlink":
        link = tarfile.TarInfo("vllm-0.99.0/requirements/evil.txt")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        _tar(p, [*good, (link, None)])
    elif case == "huge":  # a member whose header says 10 GB: refused from its header, never read
        info = tarfile.TarInfo("vllm-0.99.0/requirements/huge.txt")
        info.size = 10 * 1024**3
        with tarfile.open(p, "w:gz") as tf:
            for i, d in good:
                tf.addfile(i, io.BytesIO(d))
            tf.fileobj.write(info.tobuf(tarfile.GNU_FORMAT))
    elif case == "two-tops":
        _tar(p, [*good, _file("another/PKG-INFO", b"Name: vllm\n")])
    before = sorted(x.name for x in tmp_path.iterdir())
    r = _recipe("--sdist", str(p))
    assert r.exit_code == 2, (case, r.output)
    assert str(p) in r.output and "Traceback" not in r.output
    assert sorted(x.name for x in tmp_path.iterdir()) == before  # nothing extracted beside it
    assert not Path("/etc/escape").exists()


def test_sdist_and_source_together_or_neither_is_bad_input(tmp_path):
    assert _recipe("--sdist", "a.tar.gz", "--source", str(tmp_path)).exit_code == 2
    assert "--sdist PATH or --source DIR" in _recipe().output


def test_a_git_checkout_gives_the_recipe_with_its_commit(tmp_path):
    repo = tmp_path / "vllm"
    for rel, text in FILES.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git = ["git", "-C", str(repo), "-c", "user.email=t@e", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    subprocess.run([*git, "tag", "v0.99.0"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    r = _recipe("--source", str(repo))
    assert r.exit_code == 0, r.output
    assert f"vllm@{commit}" in r.output and "0.99.0" in r.output
    (repo / "docker" / "Dockerfile").write_text(DOCKERFILE + "\n# a local change\n")
    r = _recipe("--source", str(repo))  # the commit's files are read; the work tree's change is said
    assert r.exit_code == 0 and f"vllm@{commit}" in r.output
    assert "differs from the commit in docker/Dockerfile" in r.output


def test_load_local_sdist_reads_without_extracting(tmp_path, monkeypatch):
    p = write_sdist(tmp_path, "0.99.0", FILES)
    monkeypatch.setattr(tarfile.TarFile, "extractall", lambda *a, **k: pytest.fail("extracted"))
    monkeypatch.setattr(tarfile.TarFile, "extract", lambda *a, **k: pytest.fail("extracted"))
    files = sdist.load_local_sdist(p)
    assert files.vllm == "0.99.0" and "docker/Dockerfile" in files.files


def test_a_script_of_a_local_sdist_is_read_on_demand_and_confined(tmp_path):
    from builder.resolve.recipe.interpret import OVERSIZE

    link = tarfile.TarInfo("vllm-0.99.0/tools/evil.py")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    big = tarfile.TarInfo("vllm-0.99.0/tools/big.py")
    big.size = sdist.MAX_BUILD_FILE + 1
    big_sh = tarfile.TarInfo("vllm-0.99.0/tools/big.sh")
    big_sh.size = sdist.MAX_BUILD_FILE + 1
    p = _tar(
        tmp_path / "vllm-0.99.0.tar.gz",
        [
            *(_file(f"vllm-0.99.0/{k}", v.encode()) for k, v in FILES.items()),
            _file("vllm-0.99.0/tools/install.py", b"print(1)\n"),
            _file("vllm-0.99.0/tools/run.sh", b"uv pip install --system x\n"),
            (link, None),
            (big, b"x" * big.size),
            (big_sh, b"x" * big_sh.size),
        ],
    )
    files = sdist.load_local_sdist(p)
    assert files.files["tools/run.sh"] == "uv pip install --system x\n"  # every shell script, up front
    assert files.files["tools/big.sh"] == f"{OVERSIZE}{big_sh.size}"  # refused where a RUN line runs it
    assert "tools/install.py" not in files.files  # not read until something names it
    assert files.text("tools/install.py", "a script") == "print(1)\n"
    assert files.text("./tools/install.py", "a script") == "print(1)\n"
    for rel, why in (
        ("tools/evil.py", "is a link"),
        ("tools/big.py", "more than a build file holds"),
        ("../escape.sh", "leaves the build context"),
        ("/etc/passwd", "leaves the build context"),
    ):
        with pytest.raises(BadInput, match=why) as exc:
            files.text(rel, "a script")
        assert str(p) in str(exc.value)
    with pytest.raises(BadInput, match="has no tools/none.sh"):
        files.text("tools/none.sh", "a script")


def test_the_index_sdist_is_read_under_the_same_rules(tmp_path):
    from builder.resolve.recipe import SdistRef

    ref = SdistRef("vllm-0.99.0.tar.gz", "0" * 64)
    good = [_file(f"vllm-0.99.0/{k}", v.encode()) for k, v in FILES.items()]
    p = _tar(tmp_path / "ok.tar.gz", [*good, _file("vllm-0.99.0/tools/a.py", b"echo\n")])
    files = sdist.read_build_files(p, "0.99.0", ref)
    assert files.text("tools/a.py", "a script") == "echo\n"
    link = tarfile.TarInfo("vllm-0.99.0/requirements/evil.txt")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    for name, extra in (("dotdot", _file("vllm-0.99.0/../x", b"x")), ("link", (link, None))):
        bad = _tar(tmp_path / f"{name}.tar.gz", [*good, extra])
        with pytest.raises(BadInput, match="vllm-0.99.0.tar.gz"):
            sdist.read_build_files(bad, "0.99.0", ref)


_PARTS = st.sampled_from(["..", ".", "", "vllm-0.99.0", "docker", "Dockerfile", "requirements", "a.txt", "tools"])
_KINDS = st.sampled_from([tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.DIRTYPE, tarfile.FIFOTYPE])


@given(
    members=st.lists(
        st.tuples(st.lists(_PARTS, min_size=1, max_size=5), _KINDS, st.sampled_from(["/etc/passwd", "../x", "a"])),
        max_size=6,
    ),
    reads=st.lists(st.lists(_PARTS, min_size=1, max_size=4), max_size=3),
)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzz_a_hostile_sdist_is_read_or_refused_never_crashes(tmp_path, members, reads):
    """Any member names and kinds beside a good sdist's files: the sdist is read or refused (exit-2
    BadInput), and every file read on demand is one of the archive's regular files or refused."""
    good = [_file(f"vllm-0.99.0/{k}", v.encode()) for k, v in FILES.items()]
    extra = []
    for parts, kind, target in members:
        info = tarfile.TarInfo("/".join(parts))
        info.type, info.linkname = kind, target if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
        extra.append((info, b"" if kind == tarfile.REGTYPE else None))
    p = _tar(tmp_path / "fuzz.tar.gz", [*good, *extra])
    try:
        files = sdist.load_local_sdist(p)
    except BadInput as exc:
        assert str(p) in str(exc)
        return
    for parts in reads:
        try:
            text = files.text("/".join(parts), "a file")
        except BadInput:
            continue
        assert text in ("", *FILES.values())  # a regular file of the archive, never a link's target
