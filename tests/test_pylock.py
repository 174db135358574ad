"""pylock.toml (PEP 751) beside requirements.lock: same pins, read back by packaging.pylock,
installed alike by uv (``uv pip install --dry-run`` of each lists the same packages)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.pylock import Pylock

from builder.errors import BadInput
from builder.resolve import lockfile as T
from builder.resolve.lock import target_tags
from builder.resolve.lockfile import LockFile, WheelRef, format_pylock, load_lock, parse_lock, to_pylock
from builder.resolve.lockfile import pylock as P
from builder.resolve.manifest import DistFacts, target_environment
from builder.resolve.uv import find_uv
from builder.util import project_root
from tests.conftest import run
from tests.test_lockfile import HA, WRITTEN

PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
UV = find_uv()


PRIVATE_CACHE = "bi-cache"  # the download cache of this module's tests (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def test_the_default_locks_twin_pins_what_requirements_lock_pins_one_wheel_each():
    for req in sorted((project_root() / "lockfiles").glob("vllm-*/requirements.lock")):
        lock = load_lock(req)
        twin = req.with_name("pylock.toml")
        assert twin.is_file(), f"{twin} is missing"
        text = twin.read_text()
        doc = P.read(text, str(twin))  # packaging.pylock validates it
        assert isinstance(doc, Pylock) and all(len(p.wheels) == 1 for p in doc.packages)
        back = parse_lock(text, str(twin))
        assert T.same_pins(lock, back) == [] and back.lock_hash == lock.lock_hash
        assert [e.hashes for e in back.entries] == [e.hashes for e in sorted(lock.entries, key=lambda e: e.key)]
        # the wheel packaging.pylock selects for the base is the one the lock installs
        h = lock.header
        tags = target_tags(h["python"], "cp" + h["python"].replace(".", ""), h["platform"])
        env = target_environment(h["python"], h["platform"])
        picked = {str(pkg.name): dist.filename for pkg, dist in doc.select(environment=env, tags=tags)}
        assert picked == {e.key: e.wheel.filename for e in lock.entries}
        assert T.twin_problem(req, lock) is None


def test_twin_round_trip_keeps_header_facts_via_and_other_hashes():
    lock = load_lock(project_root() / "lockfiles" / "vllm-0.26.0" / "requirements.lock")
    back = parse_lock(format_pylock(lock), "x/pylock.toml")
    assert back.header == lock.header and back.overlay == lock.overlay
    for a, b in zip(sorted(lock.entries, key=lambda e: e.key), back.entries):
        assert (a.name, a.version, a.hashes, a.via, a.wheel, a.facts, a.base_version) == (
            b.name,
            b.version,
            b.hashes,
            b.via,
            b.wheel,
            b.facts,
            b.base_version,
        )
    assert parse_lock(format_pylock(back), "x/pylock.toml").entries == back.entries


def test_foreign_or_invalid_pylock_is_bad_input_naming_the_file(tmp_path):
    foreign = (
        'lock-version = "1.0"\ncreated-by = "uv"\n[[packages]]\nname = "six"\nversion = "1.0"\n'
        '[[packages.wheels]]\nurl = "https://h/six-1.0-py3-none-any.whl"\nhashes = { sha256 = "aa" }\n'
    )
    with pytest.raises(
        BadInput,
        match=r"^a/pylock.toml is a PEP 751 lock but not one build-image wrote \(no "
        r"\[tool\.build-image\.header\] table\); build-image reads the pylock\.toml "
        r"that `build-image lock` writes beside requirements\.lock\.$",
    ):
        parse_lock(foreign, "a/pylock.toml")
    with pytest.raises(BadInput, match=r"b/pylock.toml is not a valid PEP 751 lock"):
        parse_lock('lock-version = "1.0"\n', "b/pylock.toml")
    with pytest.raises(BadInput, match=r"lock-version"):
        parse_lock('lock-version = "2.0"\ncreated-by = "x"\npackages = []\n', "c/pylock.toml")
    with pytest.raises(BadInput, match="not valid TOML"):
        parse_lock("[[packages", "d/pylock.toml")


def _twin_of_written() -> LockFile:
    """WRITTEN (test_lockfile) with what a default lock lacks: a non-canonical name, a wheel URL with
    a fragment, sparse facts (no numpy 1.x count, no python ABI) and no ``via``."""
    lock = parse_lock(WRITTEN, "w.lock")
    click, numpy = lock.entries
    click.name, click.via = "Click", []
    click.wheel = WheelRef(url="https://files.example/click-8.1.7-py3-none-any.whl#frag", sha256=HA)
    click.facts = DistFacts(numpy_abi={"2": 1}, python_abi=None)
    numpy.facts.numpy_abi = {"1": 3}
    return lock


def test_the_twin_writes_every_field_and_reads_it_back():
    import tomllib

    lock = _twin_of_written()
    doc = tomllib.loads(format_pylock(lock))
    click, numpy = doc["packages"]
    assert click["wheels"] == [
        {
            "name": "click-8.1.7-py3-none-any.whl",
            "hashes": {"sha256": HA},
            "url": "https://files.example/click-8.1.7-py3-none-any.whl",
        }
    ]  # no fragment
    assert click["tool"]["build-image"] == {
        "name": "Click",
        "facts": {"binary": False, "extensions": 0, "numpy-abi": [0, 1], "glibc": "", "python-abi": "none"},
    }
    assert numpy["tool"]["build-image"]["facts"]["numpy-abi"] == [3, 0]
    assert doc["requires-python"] == "==3.12.*" and doc["environments"] == [
        "python_version == \"3.12\" and sys_platform == \"linux\" and platform_machine == \"x86_64\""
    ]
    back = parse_lock(format_pylock(lock), "x/pylock.toml")
    assert [(e.name, e.via, e.line) for e in back.entries] == [("Click", [], 1), ("numpy", ["-r overlay", "ray"], 2)]
    assert back.entries[0].facts == DistFacts(numpy_abi={"1": 0, "2": 1})
    assert back.entries[1].facts == DistFacts(
        binary=True, extensions=12, numpy_abi={"1": 3, "2": 0}, glibc="2.17", python_abi="cp312"
    )
    assert back.entries[0].wheel.url == "https://files.example/click-8.1.7-py3-none-any.whl"


def test_a_twin_with_a_wheel_folder_names_each_wheel_beside_the_file(tmp_path):
    text = format_pylock(_twin_of_written(), "wheels")
    assert 'path = "wheels/click-8.1.7-py3-none-any.whl"' in text and "url = " not in text
    back = parse_lock(text, str(tmp_path / "pylock.toml"))
    assert [e.wheel.url for e in back.entries] == [
        (tmp_path / "wheels" / e.wheel.filename).resolve().as_uri() for e in back.entries
    ]


def test_a_lock_without_python_or_platform_has_a_twin_without_those_markers():
    lock = _twin_of_written()
    del lock.header["platform"]
    doc = to_pylock(lock)
    assert [str(m) for m in doc.environments] == ['python_version == "3.12" and sys_platform == "linux"']
    del lock.header["python"]
    doc = to_pylock(lock)
    assert doc.requires_python is None and doc.environments is None
    lock.entries[0].wheel = None
    with pytest.raises(
        BadInput,
        match=r"^lock: Click==8\.1\.7 has no '# wheel:' line; pylock\.toml needs its "
        r"wheel\.$",
    ):
        to_pylock(lock)


def _edited(edit) -> str:
    """The twin of WRITTEN as TOML, its document changed by ``edit`` (a hand edit)."""
    import tomli_w

    d = to_pylock(parse_lock(WRITTEN, "w.lock")).to_dict()
    edit(d)
    return tomli_w.dumps(d)


def test_a_facts_table_reads_its_defaults_and_a_malformed_one_is_named():
    def sparse(d):
        d["packages"][0]["tool"]["build-image"]["facts"] = {"glibc": "2.28"}

    assert parse_lock(_edited(sparse), "x/pylock.toml").entries[0].facts == DistFacts(glibc="2.28")

    def malformed(d):
        d["packages"][1]["tool"]["build-image"]["facts"]["extensions"] = "many"

    with pytest.raises(
        BadInput,
        match=r"^x/pylock\.toml, packages\[1\] \(numpy\): malformed "
        r"\[tool\.build-image\.facts\] table \{.*'extensions': 'many'",
    ):
        parse_lock(_edited(malformed), "x/pylock.toml")


def _two_header_keys_gone(d):
    del d["tool"]["build-image"]["header"]["vllm"], d["tool"]["build-image"]["header"]["python"]


def _a_second_wheel(d):
    w = d["packages"][1]["wheels"]
    w.append(dict(w[0], name=w[0]["name"].replace("x86_64", "aarch64"), url=w[0]["url"].replace("x86_64", "aarch64")))


@pytest.mark.parametrize(
    "edit, why",
    [
        (
            _two_header_keys_gone,
            r"^x/pylock\.toml: \[tool\.build-image\.header\] lacks vllm, python; the file is hand-edited\.$",
        ),
        (
            lambda d: d["packages"].append(d["packages"][0]),
            r"^x/pylock\.toml: duplicate package 'click' \(packages\[2\], first at packages\[0\]\)",
        ),
        (
            _a_second_wheel,
            r"^x/pylock\.toml, packages\[1\] \(numpy\): a build-image pylock has exactly one wheel and a version per "
            r"package\.$",
        ),
        (
            lambda d: d["packages"][0]["wheels"][0].update(hashes={"sha512": "ab"}),
            r"^x/pylock\.toml, packages\[0\] \(click\): the wheel has no sha256 or no url/path\.$",
        ),
    ],
)
def test_a_hand_edited_twin_is_bad_input_naming_the_place(edit, why):
    with pytest.raises(BadInput, match=why):
        parse_lock(_edited(edit), "x/pylock.toml")


def test_a_twin_without_overlay_or_escape_hatch_tables_has_none():
    def gone(d):
        del d["tool"]["build-image"]["overlay"], d["tool"]["build-image"]["allow-abi-change"]

    lk = parse_lock(_edited(gone), "x/pylock.toml")
    assert (lk.overlay, lk.allow_abi_change, [e.name for e in lk.entries]) == ([], {}, ["click", "numpy"])


# ------------------------------------------------------------------ the real lock command, offline


@pytest.fixture(scope="session")
def here_base(tmp_path_factory, make_site_packages) -> Path:
    """A base manifest for *this* interpreter's Python (so uv can dry-run installs into a venv)."""
    d = tmp_path_factory.mktemp("herebase")
    sp = make_site_packages(d / "site-packages", ["numpy==1.26.4", "purepkg==1.0.0"], python_version=PY)
    out = d / "base.json"
    code, text = run("base", "snapshot", "--site-packages", str(sp), "--python", PY, "--glibc", "2.35", "-o", str(out))
    assert code == 0, text
    return out


def _dry_run(venv: Path, *args: str) -> list[str]:
    r = subprocess.run(
        [UV, "pip", "install", "--dry-run", "--python", str(venv / "bin" / "python"), *args],
        capture_output=True,
        text=True,
        env={"UV_NO_CONFIG": "1", "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    return sorted(re.findall(r"^ \+ (\S+==\S+)$", r.stderr + r.stdout, re.M))


def test_lock_writes_the_twin_check_reads_both_and_uv_installs_the_same_set(here_base, wheelhouse, tmp_path):
    out = tmp_path / "locks" / "requirements.lock"
    base_args = [
        "lock",
        "--base",
        str(here_base),
        "--no-default-overlay",
        "--no-index",
        "--find-links",
        str(wheelhouse),
        "--with",
        "numpy2user",
        "--with",
        "numpy>=2",
        "--allow-abi-change",
        "numpy",
        "--reason",
        "test",
    ]
    code, text = run(*base_args, "-o", str(out))
    assert code == 0, text
    twin = out.with_name("pylock.toml")
    lock, back = load_lock(out), load_lock(twin)
    assert sorted(T.pins(lock)) == ["numpy", "numpy2user"] and T.same_pins(lock, back) == []

    venv = tmp_path / "venv"
    subprocess.run(
        [UV, "venv", "-q", "--python", sys.executable, str(venv)],
        check=True,
        env={"UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never", "PATH": "/usr/bin:/bin"},
    )
    from_req = _dry_run(
        venv, "--no-deps", "--require-hashes", "--no-index", "--find-links", str(wheelhouse), "-r", str(out)
    )
    from_pylock = _dry_run(venv, "-r", str(twin))
    assert from_req == from_pylock == ["numpy2user==1.0.0", "numpy==2.1.0"]

    # --check reads either file; a missing or disagreeing twin is a stale lock (exit 5)
    assert run(*base_args, "-o", str(out), "--check")[0] == 0
    assert run(*base_args, "-o", str(twin), "--check")[0] == 0
    sha = lock.by_name()["numpy"].wheel.sha256
    twin.write_text(twin.read_text().replace(f'sha256 = "{sha}"', f'sha256 = "{"0" * 64}"', 1))
    code, text = run(*base_args, "-o", str(out), "--check")
    assert code == 5 and (
        f"pylock.toml pins other packages than requirements.lock: numpy: 2.1.0 ({sha[:12]}) vs 2.1.0 ({'0' * 12})"
    ) in " ".join(text.split())
    twin.write_text(twin.read_text().replace('version = "2.1.0"', 'version = "2.2.0"', 1))
    code, text = run(*base_args, "-o", str(out), "--check")  # packaging.pylock: the wheel is not 2.2.0
    assert code == 5 and "is not a valid PEP 751 lock" in text
    twin.unlink()
    code, text = run(*base_args, "-o", str(out), "--check")
    assert code == 5 and "does not exist" in text
    # without --check the twin is rewritten from the (fresh) lock, no resolution
    code, text = run(*base_args, "-o", str(out))
    assert code == 0 and twin.is_file() and T.twin_problem(out, load_lock(out)) is None
    # writing to a pylock path is refused: the lock is requirements.lock, the twin is derived
    code, text = run(*base_args, "-o", str(tmp_path / "pylock.toml"))
    assert code == 2 and "name the requirements.lock" in text


def test_diff_reads_pylock_on_either_side(tmp_path):
    req = project_root() / "lockfiles" / "vllm-0.26.0" / "requirements.lock"
    twin = req.with_name("pylock.toml")
    code, text = run("diff", str(req), str(twin))
    assert code == 0 and "colorful" not in text  # the same pins: nothing but the file format differs
    lock = load_lock(req)
    e = lock.by_name()["colorful"]
    e.version, e.hashes = "0.5.9", ["f" * 64]
    e.wheel = type(e.wheel)(url=e.wheel.url.replace("0.5.8", "0.5.9"), sha256="f" * 64)
    moved = tmp_path / "pylock.toml"
    T.write_pylock(moved, lock)
    code, text = run("diff", str(req), str(moved))
    assert code == 0 and re.search(r"colorful\s+0\.5\.8\s*(→|->)\s*0\.5\.9", text), text
    code, text = run("diff", "--format", "json", str(moved), str(req))
    assert '"0.5.9"' in text and '"0.5.8"' in text


def test_render_from_pylock_writes_the_same_context_as_from_requirements_lock(here_base, wheelhouse, tmp_path):
    import json

    doc = json.loads(here_base.read_text())
    doc["image"]["ref"] = "vllm/vllm-openai:v0.26.0"  # render builds FROM it
    base = tmp_path / "base.json"
    base.write_text(json.dumps(doc))
    out = tmp_path / "requirements.lock"
    code, text = run(
        "lock",
        "--base",
        str(base),
        "--no-default-overlay",
        "--no-index",
        "--find-links",
        str(wheelhouse),
        "--with",
        "purepkg",
        "--with",
        "numpy2user",
        "--with",
        "numpy>=2",
        "--allow-abi-change",
        "numpy",
        "--reason",
        "test",
        "-o",
        str(out),
    )
    assert code == 0, text
    vllm = load_lock(out).header["vllm"]
    ctx = {}
    for name in ("requirements.lock", "pylock.toml"):
        ctx[name] = tmp_path / f"ctx-{name}"
        code, text = run(
            "render",
            "--vllm",
            vllm,
            "--base",
            str(base),
            "--lock",
            str(out.with_name(name)),
            "--no-patches",
            "-o",
            str(ctx[name]),
        )
        assert code == 0, text
    a, b = ctx["requirements.lock"], ctx["pylock.toml"]
    files = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file())
    for f in ("Dockerfile", "pylock.toml", "sbom.cdx.json", "requirements.lock"):
        assert (a / f).read_text() == (b / f).read_text(), f


def test_two_locks_in_one_folder_get_their_own_twins(tmp_path):
    assert T.twin_path(tmp_path / "requirements.lock") == tmp_path / "pylock.toml"
    a, b = T.twin_path(tmp_path / "serving.lock"), T.twin_path(tmp_path / "r.v2.lock")
    assert (a.name, b.name) == ("pylock.serving.toml", "pylock.r-v2.toml")
    assert P.is_pylock_path(a) and P.is_pylock_path(b)  # PEP 751's pylock.<name>.toml


def test_one_lock_run_checks_and_rewrites_the_twin_once(tmp_path, monkeypatch):
    """An up-to-date lock whose twin is missing: the lock stage looks at the twin once and
    rewrites it once (no resolution); an -o naming the twin is refused before anything runs."""
    from builder.events import Recorder
    from builder.resolve import lockfile as twin_mod
    from builder.resolve.lockstage import run_lock
    from builder.spec import Spec

    shipped = project_root() / "lockfiles" / "vllm-0.26.0"
    (tmp_path / "requirements.lock").write_bytes((shipped / "requirements.lock").read_bytes())
    calls = {"twin_problem": 0, "write_pylock": 0}
    for name in calls:
        real = getattr(twin_mod, name)

        def counted(*a, _real=real, _name=name, **kw):
            calls[_name] += 1
            return _real(*a, **kw)

        monkeypatch.setattr(twin_mod, name, counted)
    said: list[str] = []
    locked = run_lock(
        Spec().with_flags(vllm="0.26.0", lock=str(tmp_path / "requirements.lock")), reporter=Recorder(said)
    )
    assert locked.status == "up-to-date" and locked.pylock == str(tmp_path / "pylock.toml")
    assert calls == {"twin_problem": 1, "write_pylock": 1}
    assert [m for m in said if m.startswith("rewrote")] == [
        f"rewrote {tmp_path / 'pylock.toml'} from {tmp_path / 'requirements.lock'} "
        f"({tmp_path / 'pylock.toml'} (its PEP 751 twin) does not exist)"
    ]
    assert (tmp_path / "pylock.toml").read_bytes() == (shipped / "pylock.toml").read_bytes()
    with pytest.raises(BadInput, match=r"name the requirements\.lock"):
        run_lock(Spec().with_flags(vllm="0.26.0", lock=str(tmp_path / "pylock.toml")))
    assert calls == {"twin_problem": 1, "write_pylock": 1}
