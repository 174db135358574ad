"""One platform's files never replace or stand in for the other's (issue 44, classes 5, 6, 7, 8 and 12).

* a lock's platform (its header's ``platform`` line, the twin's ``[tool.build-image.header] platform`` and
  ``environments``) is checked by every reader and writer: ``lock``, ``build-image`` and ``render`` refuse another
  platform's lock with exit 2 naming both, and change nothing;
* a re-render over a multi-platform context never deletes what it did not write, writes through a symlinked -o
  and leaves no ``.NAME.old-PID`` behind;
* a recipes file holds one platform's tables; ``promote`` reads the image's platform from its config;
* ``base snapshot --platform`` takes only what :mod:`builder.platforms` parses;
* ``platforms.json`` has one reader: a tampered one is the same exit 2 in a re-render as in ``build``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from builder import platforms as P
from builder.errors import BadInput
from builder.image.multiplatform import PLATFORMS_FILE, read_multi_context, read_platforms_file
from builder.image.platforms_render import RenderedPlatform, write_platforms_context
from builder.image.render import RENDERED_MARK, check_replaceable
from builder.resolve.lockfile import (
    header_platform,
    load_lock,
    lock_platform,
    parse_lock,
    parse_pylock_lock,
    read_lock_file,
)
from builder.resolve.recipe.table import read_recipes_file, write_recipe_table
from tests.conftest import run
from tests.test_fuzz import examples  # CI's example counts, scaled by the nightly profile
from tests.test_platforms_build import multi_context

ROOT = Path(__file__).resolve().parents[2]
AMD64_LOCK = ROOT / "lockfiles" / "vllm-0.34.0" / "requirements.lock"
ARM64_LOCK = ROOT / "lockfiles" / "vllm-0.34.0" / "linux-arm64" / "requirements.lock"
REPO = "127.0.0.1:5000/platforms/vllm"


def _digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def amd64_lock_dir(tmp_path) -> Path:
    """A copy of the shipped linux/amd64 lock of 0.34.0 and its pylock twin."""
    d = tmp_path / "locks"
    d.mkdir()
    shutil.copy(AMD64_LOCK, d / "requirements.lock")
    shutil.copy(AMD64_LOCK.with_name("pylock.toml"), d / "pylock.toml")
    return d


# --------------------------------------------------------------------------------------------- class 5: locks
def test_the_shipped_locks_name_their_platform_in_their_headers():
    for lock in sorted((ROOT / "lockfiles").glob("vllm-*/**/requirements.lock")):
        want = P.ARM64 if "linux-arm64" in lock.parts else P.AMD64
        assert lock_platform(load_lock(lock)) is want, lock
        assert lock_platform(load_lock(lock.with_name("pylock.toml"))) is want, lock


@pytest.mark.parametrize(
    "extra",
    [[], ["--force"], ["--upgrade", "--force"], ["--check"]],
    ids=["plain", "force", "upgrade-force", "check"],
)
def test_lock_for_arm64_over_the_amd64_lock_is_exit_2_naming_both_and_changes_nothing(amd64_lock_dir, extra):
    before = _digests(amd64_lock_dir)
    code, out = run(
        "lock", "--vllm", "0.34.0", "--platform", "linux/arm64", "-o", str(amd64_lock_dir / "requirements.lock"), *extra
    )
    assert code == 2, out
    assert "linux/amd64" in out and "linux/arm64" in out
    assert _digests(amd64_lock_dir) == before and sorted(os.listdir(amd64_lock_dir)) == [
        "pylock.toml",
        "requirements.lock",
    ]


def test_an_amd64_twin_beside_a_new_arm64_lock_path_is_refused(amd64_lock_dir):
    (amd64_lock_dir / "requirements.lock").unlink()  # only the twin is there: it is still the amd64 one
    before = _digests(amd64_lock_dir)
    code, out = run(
        "lock", "--vllm", "0.34.0", "--platform", "linux/arm64", "-o", str(amd64_lock_dir / "requirements.lock")
    )
    assert code == 2 and "pylock.toml is a linux/amd64 lock" in out, out
    assert _digests(amd64_lock_dir) == before


def test_the_pipeline_for_arm64_with_the_amd64_lock_is_exit_2_and_writes_nothing(amd64_lock_dir, tmp_path):
    before = _digests(amd64_lock_dir)
    out_dir = tmp_path / "ctx"
    lock = str(amd64_lock_dir / "requirements.lock")
    code, out = run("--vllm", "0.34.0", "--platform", "linux/arm64", "--lock", lock, "-o", str(out_dir))
    assert code == 2 and "linux/amd64 lock" in out and "linux/arm64" in out, out
    assert _digests(amd64_lock_dir) == before and not out_dir.exists()


@pytest.mark.parametrize("lock", [AMD64_LOCK, AMD64_LOCK.with_name("pylock.toml")], ids=["lock", "pylock"])
def test_render_for_arm64_with_the_amd64_lock_is_exit_2_as_its_help_promises(lock, tmp_path):
    out_dir = tmp_path / "ctx"
    code, out = run("render", "--vllm", "0.34.0", "--platform", "linux/arm64", "--lock", str(lock), "-o", str(out_dir))
    assert code == 2 and "linux/amd64 lock" in out and "linux/arm64" in out, out
    assert not out_dir.exists()


def test_every_lock_reader_refuses_the_other_platform_s_lock():
    with pytest.raises(BadInput, match="is a linux/arm64 lock") as exc:
        read_lock_file(ARM64_LOCK, P.AMD64, doing="rendering on base B")
    assert exc.value.exit_code == 2
    lock, _ = read_lock_file(ARM64_LOCK, P.ARM64, doing="rendering on base B")
    assert lock_platform(lock) is P.ARM64


def test_a_twin_whose_environments_say_the_other_machine_is_hand_edited():
    text = AMD64_LOCK.with_name("pylock.toml").read_text()
    forged = text.replace('platform_machine == \\"x86_64\\"', 'platform_machine == \\"aarch64\\"')
    assert forged != text
    with pytest.raises(BadInput, match="'environments'"):
        parse_pylock_lock(forged, "pylock.toml")
    relabelled = text.replace('platform = "x86_64-manylinux_2_39"', 'platform = "aarch64-manylinux_2_39"')
    assert relabelled != text
    with pytest.raises(BadInput, match="'environments'"):
        parse_pylock_lock(relabelled, "pylock.toml")


_HEADER_TEXT = st.one_of(
    st.text(max_size=40),
    st.builds(
        "{}-{}_{}_{}".format,
        st.sampled_from(["x86_64", "aarch64", "armv7l", "ppc64le", "X86_64", ""]),
        st.sampled_from(["manylinux", "musllinux", "linux"]),
        st.integers(-1, 10_000),
        st.integers(-1, 10_000),
    ),
)


@examples(150)
@given(value=_HEADER_TEXT)
def test_a_lock_header_s_platform_is_a_known_one_or_the_lock_is_refused(value):
    """Any text on the header's platform line: the strict reader gives a lock of a known platform whose line
    is uv's <machine>-manylinux_<major>_<minor>, or BadInput (exit 2) naming the line — never another error."""
    text = AMD64_LOCK.read_text()
    forged = re.sub(r"(?m)^# platform: .*$", lambda _m: "# platform: " + value.replace("\n", " "), text, count=1)
    try:
        lock = parse_lock(forged, "requirements.lock")
    except BadInput as exc:
        assert exc.exit_code == 2 and "requirements.lock" in exc.message
        return
    got = lock_platform(lock)
    machine, _, rest = lock.header["platform"].partition("-")
    assert got.machine == machine and re.fullmatch(r"manylinux_\d+_\d+", rest)
    assert header_platform(lock.header, "x") is got


# ------------------------------------------------------------------------------- class 6 and 12: re-render
def _render_one(platform: P.Platform, folder: Path) -> RenderedPlatform:
    """What a platform's render leaves in its folder, reduced to what the replace rule looks at."""
    folder.mkdir(parents=True)
    (folder / "Dockerfile").write_text(f"{RENDERED_MARK} (test)\nFROM base-{platform.slug}\n")
    (folder / "requirements.lock").write_text(f"# {platform.name}\n")
    return RenderedPlatform(
        platform=platform,
        context=platform.slug,
        base_ref=f"base-{platform.slug}",
        base_digest=None,
        lock_sha256=hashlib.sha256((folder / "requirements.lock").read_bytes()).hexdigest(),
        lock_hash="0" * 64,
        tags=(),
    )


def _render(out: Path):
    return write_platforms_context(out, "0.34.0", REPO, (P.AMD64, P.ARM64), _render_one, check_replaceable)


def test_a_re_render_refuses_a_user_s_folder_inside_the_context_and_changes_nothing(tmp_path):
    out = tmp_path / "ctx"
    _render(out)
    shutil.copytree(out / "linux-amd64", out / "keep-amd64")  # a user's copy: itself a rendered context
    (out / "NOTES.md").write_text("mine")
    before = _digests(out)
    with pytest.raises(BadInput, match=r"NOTES\.md, keep-amd64") as exc:
        _render(out)
    assert exc.value.exit_code == 2 and _digests(out) == before


def test_a_re_render_over_a_symlinked_output_writes_through_it_and_leaves_no_old_folder(tmp_path):
    real = tmp_path / "real" / "ctx"
    _render(real)
    link = tmp_path / "links" / "ctx"
    link.parent.mkdir()
    link.symlink_to(real, target_is_directory=True)
    (real / "linux-amd64" / "requirements.lock").write_text("stale\n")
    _render(link)
    assert link.is_symlink() and Path(os.readlink(link)) == real
    assert (real / "linux-amd64" / "requirements.lock").read_text() == "# linux/amd64\n"
    left = [p.name for d in (real.parent, link.parent) for p in d.iterdir() if p.name.startswith(".")]
    assert left == [], left


def _mutations(doc: dict):
    """A strategy of tampered platforms.json documents, from the valid ``doc``."""
    junk = st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=12),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
        max_leaves=6,
    )
    field = st.sampled_from(["platform", "context", "base_ref", "base_digest", "lock_sha256"])
    value = junk | st.sampled_from(["linux/arm/v7", "linux/arm64", "../linux-arm64", "/etc", "linux-amd64", "x" * 64])

    def entry_edit(args):
        i, key, v, drop = args
        d = copy.deepcopy(doc)
        e = d["platforms"][i % len(d["platforms"])]
        if drop:
            e.pop(key, None)
        else:
            e[key] = v
        return d

    def top_edit(args):
        key, v, drop = args
        d = copy.deepcopy(doc)
        if drop:
            d.pop(key, None)
        else:
            d[key] = v
        return d

    return st.one_of(
        st.tuples(st.integers(0, 3), field, value, st.booleans()).map(entry_edit),
        st.tuples(st.sampled_from(["schema", "vllm", "platforms"]), junk, st.booleans()).map(top_edit),
        junk,
    )


@pytest.fixture(scope="module")
def rendered_multi(tmp_path_factory) -> Path:
    return multi_context(tmp_path_factory.mktemp("multi"))


@examples(60)
@given(data=st.data())
def test_a_tampered_platforms_json_is_the_same_exit_2_in_a_re_render_as_in_build(rendered_multi, tmp_path, data):
    """One reader (read_platforms_file): whatever platforms.json holds, a re-render and build both refuse it with
    the same BadInput, or both accept it; a re-render never crashes and never changes the context it refuses."""
    path = rendered_multi / PLATFORMS_FILE
    good = path.read_text()
    doc = data.draw(_mutations(json.loads(good)))
    path.write_text(json.dumps(doc))
    try:
        try:
            read_platforms_file(rendered_multi)
            expected = None
        except BadInput as exc:
            expected = exc.message
        if expected is None:
            return  # a valid document (an edit that changed nothing checked): the sub-contexts are build's concern
        with pytest.raises(BadInput) as in_build:
            read_multi_context(rendered_multi, REPO)
        before = _digests(rendered_multi)
        with pytest.raises(BadInput) as in_render:
            _render(rendered_multi)
        assert in_build.value.message == in_render.value.message == expected
        assert in_render.value.exit_code == 2 and _digests(rendered_multi) == before
    finally:
        path.write_text(good)


# ------------------------------------------------------------------------------- class 7: recipes, promote
def test_an_arm64_recipe_table_never_lands_in_the_amd64_recipes_file(tmp_path):
    amd = tmp_path / "recipes.toml"
    shutil.copy(ROOT / "lockfiles" / "base" / "recipes.toml", amd)
    before = amd.read_bytes()
    table = {"sdist_sha256": "0" * 64, "platform": "aarch64-manylinux_2_39"}
    with pytest.raises(BadInput, match="linux/amd64 recipe"):
        write_recipe_table(amd, "0.99.0", table, platform=P.ARM64)  # the file's tables are amd64's
    with pytest.raises(BadInput, match="linux/arm64 recipe"):
        write_recipe_table(amd, "0.99.0", table, platform=P.AMD64)  # the table is arm64's
    assert amd.read_bytes() == before
    with pytest.raises(BadInput, match="linux/amd64 recipe"):
        read_recipes_file(amd, P.ARM64)
    code, out = run("base", "recipe", "--vllm", "0.34.0", "--platform", "linux/arm64", "--write", "--recipes", str(amd))
    assert code == 2 and "linux/amd64 recipe" in out, out
    assert amd.read_bytes() == before


class _ConfigRegistry:
    """A registry client serving one image config blob (enough for retag.config_platform)."""

    registry = "127.0.0.1:1"

    def __init__(self, config: dict):
        self.body = json.dumps(config).encode()
        self.digest = "sha256:" + hashlib.sha256(self.body).hexdigest()

    def request(self, method, path, headers=None, limit=None):
        assert method == "GET" and path.endswith(self.digest) and limit == len(self.body)
        return 200, {}, self.body

    def manifest(self):
        from builder.image.retag import Manifest

        body = json.dumps({"schemaVersion": 2, "config": {"digest": self.digest, "size": len(self.body)}}).encode()
        return Manifest(
            digest="sha256:" + hashlib.sha256(body).hexdigest(),
            media_type="application/vnd.oci.image.manifest.v1+json",
            body=body,
        )


@pytest.mark.parametrize(
    "config, want",
    [
        ({"os": "linux", "architecture": "amd64"}, P.AMD64),
        ({"os": "linux", "architecture": "arm64", "variant": "v8"}, P.ARM64),
        ({"os": "linux", "architecture": "arm", "variant": "v7"}, None),
        ({"os": "windows", "architecture": "amd64"}, None),
        ({"architecture": ["amd64"]}, None),
        ({}, None),
    ],
)
def test_promote_reads_the_image_s_platform_from_its_config(config, want):
    from builder.image.retag import config_platform

    client = _ConfigRegistry({**config, "config": {}})
    if want is None:
        with pytest.raises(BadInput, match="not one of linux/amd64, linux/arm64"):
            config_platform(client, "app", client.manifest())
    else:
        assert config_platform(client, "app", client.manifest()) is want


def test_promote_never_puts_an_amd64_image_on_arm64_nodes():
    from builder.serving.cutover import _check_image_platform
    from builder.spec import parse_spec
    from builder.values import parse_ref

    client = _ConfigRegistry({"os": "linux", "architecture": "amd64", "config": {}})
    src = parse_ref("127.0.0.1:1/app@sha256:" + "a" * 64)
    arm_spec = parse_spec('[serving]\nplatform = "linux/arm64"\n', "build-image.toml")
    plain = parse_spec("", "build-image.toml")
    with pytest.raises(BadInput, match="linux/arm64 nodes"):
        _check_image_platform(client, src, client.manifest(), spec=arm_spec, lock=load_lock(AMD64_LOCK))
    with pytest.raises(BadInput, match="is a linux/arm64 lock"):  # the manifests come from the lock: arm64's
        _check_image_platform(client, src, client.manifest(), spec=plain, lock=load_lock(ARM64_LOCK))
    _check_image_platform(client, src, client.manifest(), spec=plain, lock=load_lock(AMD64_LOCK))


# ------------------------------------------------------------------------------- class 8: base snapshot
@pytest.mark.parametrize(
    "value", ["garbage", "linux/riscv64", "x86_64-musllinux_1_2", "riscv64-manylinux_2_39", "", "linux/"]
)
def test_base_snapshot_platform_takes_only_what_the_platform_grammar_parses(value, tmp_path):
    site = tmp_path / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    out = tmp_path / "m.json"
    code, text = run(
        "base", "snapshot", "--site-packages", str(site), "--glibc", "2.39", "--platform", value, "-o", str(out)
    )
    assert code == 2 and "--platform" in text, text
    assert not out.exists()


@pytest.mark.parametrize(
    "value, want",
    [
        ("linux/arm64", (P.ARM64, "aarch64-manylinux_2_39")),
        ("aarch64-manylinux_2_39", (P.ARM64, "aarch64-manylinux_2_39")),
        ("x86_64-manylinux_2_35", (P.AMD64, "x86_64-manylinux_2_35")),
    ],
)
def test_base_snapshot_platform_as_an_image_platform_or_uv_s(value, want):
    assert P.snapshot_platform(value, "2.39", where="--platform") == want
