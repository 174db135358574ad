"""The default ray per vLLM release: ray[llm]'s vllm pin read from wheel metadata, offline.

Fake ray wheels in a find-links folder carry the Requires-Dist of the real ones
(``vllm[audio]==X; extra == "llm"``); the index adapter's HTTP range reader is
driven by an in-process opener over a real wheel file (no network)."""

from __future__ import annotations

import io
import json
import os
import urllib.parse
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner
from packaging.utils import InvalidWheelFilename

from builder.cli import main
from builder.resolve import index as ix
from builder.resolve.lock import target_tags
from builder.resolve.lockfile import load_lock
from builder.resolve.raychoice import BACKEND_FALLBACK, BACKEND_RAY_LLM, RayRelease, choose, llm_vllm_pin, ray_releases
from tests.fx_wheels import install_into, write_wheel

TAGS = target_tags("3.12", "cp312", "x86_64-manylinux_2_35")
RAY_PINS = {"2.57.1": "0.25.1", "2.58.0": "0.26.0", "2.58.1": "0.26.0", "2.59.0": "0.27.0", "2.60.0": "0.29.0"}


PRIVATE_CACHE = "bi-cache-ray"  # the download cache of this module's tests (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


def _ray_requires(pin: str | None) -> list[str]:
    out = ["click>=7.0", 'purepkg; extra == "serve"']
    if pin:
        out += [f'vllm[audio]=={pin}; extra == "llm"', 'jsonref>=1.1.0; extra == "llm"']
    return out


@pytest.fixture(scope="module")
def rayhouse(tmp_path_factory) -> Path:
    """Fake ray releases (pure wheels; upload time = mtime, one day apart), a fake vllm 0.26.0 and 0.28.0."""
    d = tmp_path_factory.mktemp("rayhouse")
    for i, (ver, pin) in enumerate(sorted(RAY_PINS.items())):
        p = write_wheel(
            d, "ray", ver, "py3-none-any", {"ray/__init__.py": f"__version__ = '{ver}'\n"}, requires=_ray_requires(pin)
        )
        t = datetime(2026, 10, 1 + i, tzinfo=timezone.utc).timestamp()
        os.utime(p, (t, t))
    write_wheel(d, "ray", "2.61.0rc1", "py3-none-any", {"ray/__init__.py": ""}, requires=_ray_requires("0.26.0"))
    write_wheel(d, "click", "8.1.0", "py3-none-any", {"click/__init__.py": ""})
    write_wheel(d, "purepkg", "1.0.0", "py3-none-any", {"purepkg/__init__.py": ""})
    for v in ("0.26.0", "0.28.0"):
        write_wheel(d, "vllm", v, "py3-none-any", {"vllm/__init__.py": f"__version__ = '{v}'\n"})
    return d


def test_llm_vllm_pin_reads_only_the_llm_extras_exact_pin():
    assert llm_vllm_pin(_ray_requires("0.26.0")) == "0.26.0"
    assert llm_vllm_pin(_ray_requires(None)) is None
    assert llm_vllm_pin(['vllm>=0.26; extra == "llm"']) is None  # a range is no pin
    assert llm_vllm_pin(["vllm==0.26.0"]) is None  # unconditional: not the llm extra
    assert llm_vllm_pin(['vllm==0.26.0; extra == "serve"']) is None
    assert (
        llm_vllm_pin(["not a requirement !!", 'vllm==0.27.0; python_version >= "3.9" and extra == "llm"']) == "0.27.0"
    )
    assert llm_vllm_pin(['VLLM==0.28.0; extra == "llm"']) == "0.28.0"  # any spelling of the name
    assert llm_vllm_pin(['vllm-router==1.0; extra == "llm"']) is None  # another project named vllm-*


def test_a_listings_file_urls_as_urljoin_makes_them():
    """Absolute URLs (PyPI's) are kept as they are, the rest joined to the listing's URL, as urljoin does."""
    base = "https://index.invalid/simple/ray/"
    urls = [
        "https://files.example/packages/ab/cd/ray-2.58.1-cp312-cp312-manylinux2014_x86_64.whl",
        "http://mirror.invalid:8080/p/ray-2.58.1-py3-none-any.whl",
        "../../packages/ray-2.58.1-py3-none-any.whl",
        "/packages/ray-2.58.1-py3-none-any.whl",
        "ray-2.58.1-py3-none-any.whl",
        "https://h.invalid/a/../r.whl",
        "HTTPS://h.invalid/r.whl",
        "https://u@h.invalid/r.whl",
        "https://h.invalid/r.whl?x=1",
        "https://h.invalid/r.whl#sha256=00",
        "https://h.invalid/a;p/r.whl",
        "https:///r.whl",
    ]
    doc = {
        "files": [{"filename": "ray-2.58.1-py3-none-any.whl", "url": u, "hashes": {"sha256": "0" * 64}} for u in urls]
    }
    assert [f.url for f in ix.parse_listing(doc, base)] == [urllib.parse.urljoin(base + "/", u) for u in urls]


def test_an_index_files_version_and_tags_from_its_name():
    f = ix.IndexFile(filename="ray-2.58.1-cp312-cp312-manylinux2014_x86_64.whl", url="u", sha256="0", upload_time=None)
    assert str(f.version) == "2.58.1" and f.version == f.version
    assert {str(t) for t in f.tags} == {"cp312-cp312-manylinux2014_x86_64"}
    sdist = ix.IndexFile(filename="ray-2.58.1.tar.gz", url="u", sha256="0", upload_time=None)
    assert sdist.version is None
    with pytest.raises(InvalidWheelFilename):
        sdist.tags


def test_choose_newest_ray_pinning_the_vllm_else_fallback():
    rels = [RayRelease(v, p) for v, p in RAY_PINS.items()]
    c = choose("0.26.0", reversed(rels))
    assert (c.version, c.requirement, c.backend) == ("2.58.1", "ray[serve]==2.58.1", BACKEND_RAY_LLM)
    assert "ray[llm] 2.58.1 pins vllm==0.26.0" in c.reason
    assert choose("0.29.0", rels).version == "2.60.0"
    for v in ("0.28.0", "0.33.0"):
        c = choose(v, rels)
        assert c.requirement is None and c.backend == BACKEND_FALLBACK
        assert f"no ray release's llm extra pins vllm=={v}" in c.reason and "2.60.0->0.29.0" in c.reason
        assert "vllm serve" in c.reason


class _Counting:
    def __init__(self, inner):
        self.inner, self.reads = inner, []

    def files(self, project):
        return self.inner.files(project)

    def metadata(self, f):
        self.reads.append(f.filename)
        return self.inner.metadata(f)


def test_ray_releases_read_newest_first_and_stop_at_an_older_pin(rayhouse):
    idx = _Counting(ix.FindLinks([rayhouse]))
    rels = ray_releases(idx, "0.27.0", TAGS)
    assert [(r.version, r.llm_vllm) for r in rels] == [("2.60.0", "0.29.0"), ("2.59.0", "0.27.0")]
    assert len(idx.reads) == 2  # the rc is skipped, nothing older read
    idx = _Counting(ix.FindLinks([rayhouse]))
    assert [r.version for r in ray_releases(idx, "0.33.0", TAGS)] == ["2.60.0"]
    # exclude-newer: releases uploaded later are not candidates (2.59.0 is day 4, 2.60.0 day 5)
    cutoff = datetime(2026, 10, 4, 12, tzinfo=timezone.utc)
    assert choose("0.26.0", ray_releases(ix.FindLinks([rayhouse]), "0.26.0", TAGS, cutoff)).version == "2.58.1"
    assert [r.version for r in ray_releases(ix.FindLinks([rayhouse]), "0.29.0", TAGS, cutoff)][:1] == ["2.59.0"]


def test_simple_index_reads_metadata_by_range_requests_and_caches_it(rayhouse, tmp_path):
    wheel = next(rayhouse.glob("ray-2.58.1-*.whl"))
    data = wheel.read_bytes()
    url = "https://index.invalid/files/" + wheel.name
    listing = {
        "meta": {"api-version": "1.1"},
        "name": "ray",
        "files": [
            {
                "filename": wheel.name,
                "url": url,
                "hashes": {"sha256": ix.sha256_bytes(data)},
                "upload-time": "2026-10-21T00:43:25.281368Z",
                "yanked": False,
            }
        ],
    }
    calls = []

    class _Resp(io.BytesIO):
        def __init__(self, body, status=200, headers=None):
            super().__init__(body)
            self.status, self.headers = status, headers or {}

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    def opener(req, timeout=60):
        calls.append((req.get_method(), req.full_url, req.headers.get("Range")))
        if req.full_url.endswith("/simple/ray/"):
            return _Resp(json.dumps(listing).encode())
        if req.get_method() == "HEAD":
            return _Resp(b"", headers={"Content-Length": str(len(data))})
        lo, hi = map(int, req.headers["Range"].removeprefix("bytes=").split("-"))
        return _Resp(data[lo : hi + 1], status=206)

    idx = ix.SimpleIndex("https://index.invalid/simple", opener=opener)
    (f,) = idx.files("ray")
    assert f.upload_time == datetime(2026, 10, 21, 0, 43, 25, 281368, tzinfo=timezone.utc)
    assert ix.format_time(f.upload_time) == "2026-10-21T00:43:25Z"
    assert llm_vllm_pin(ix.metadata_field(idx.metadata(f), "Requires-Dist")) == "0.26.0"
    assert any(r for (_m, _u, r) in calls if r)  # range requests, not the whole file
    n = len(calls)
    idx.metadata(f)
    idx.files("ray")
    assert len(calls) == n  # metadata cached by sha256, listing within its TTL


def _vllm_base(tmp_path: Path, rayhouse: Path, vllm: str) -> Path:
    sp = install_into(tmp_path / f"sp-{vllm}", [f"vllm=={vllm}", "click==8.1.0"], rayhouse)
    out = tmp_path / f"base-{vllm}.json"
    r = CliRunner().invoke(
        main,
        [
            "base",
            "snapshot",
            "--site-packages",
            str(sp),
            "--python",
            "3.12",
            "--glibc",
            "2.35",
            "--image-ref",
            f"example.invalid/vllm:{vllm}",
            "-o",
            str(out),
        ],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    return out


def test_lock_default_overlay_takes_the_ray_pinning_the_bases_vllm_and_says_why(rayhouse, tmp_path):
    base = _vllm_base(tmp_path, rayhouse, "0.26.0")
    out = tmp_path / "l.lock"
    r = CliRunner().invoke(
        main,
        ["lock", "--vllm", "0.26.0", "--base", str(base), "--no-index", "--find-links", str(rayhouse), "-o", str(out)],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    lock = load_lock(out)
    assert lock.by_name()["ray"].version == "2.58.1"
    assert lock.overlay == ["ray[serve]"]  # the input is the policy; the header records the choice
    assert lock.header["serve-backend"] == BACKEND_RAY_LLM
    assert lock.header["ray"].startswith("2.58.1 (ray[llm] 2.58.1 pins vllm==0.26.0")
    # fresh without asking the index again
    r = CliRunner().invoke(
        main,
        [
            "lock",
            "--vllm",
            "0.26.0",
            "--base",
            str(base),
            "--no-index",
            "--find-links",
            str(rayhouse),
            "-o",
            str(out),
            "--check",
        ],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output


def test_lock_with_no_matching_ray_takes_the_newest_and_the_fallback(rayhouse, tmp_path):
    base = _vllm_base(tmp_path, rayhouse, "0.28.0")
    out = tmp_path / "l.lock"
    r = CliRunner().invoke(
        main,
        ["lock", "--vllm", "0.28.0", "--base", str(base), "--no-index", "--find-links", str(rayhouse), "-o", str(out)],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    lock = load_lock(out)
    assert lock.by_name()["ray"].version == "2.60.0"
    assert lock.header["serve-backend"] == BACKEND_FALLBACK
    assert "no ray release's llm extra pins vllm==0.28.0" in lock.header["ray"]


def test_a_ray_named_in_the_overlay_wins_and_its_backend_is_judged(rayhouse, tmp_path):
    base = _vllm_base(tmp_path, rayhouse, "0.26.0")
    out = tmp_path / "l.lock"
    r = CliRunner().invoke(
        main,
        [
            "lock",
            "--vllm",
            "0.26.0",
            "--base",
            str(base),
            "--no-index",
            "--find-links",
            str(rayhouse),
            "--with",
            "ray[serve]==2.59.0",
            "-o",
            str(out),
        ],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    lock = load_lock(out)
    assert lock.by_name()["ray"].version == "2.59.0"
    assert lock.header["serve-backend"] == BACKEND_FALLBACK
    assert "named in the overlay" in lock.header["ray"] and "pins vllm==0.27.0, not 0.26.0" in lock.header["ray"]


def test_a_matching_ray_that_does_not_fit_the_base_falls_back_and_says_how_to_get_it(rayhouse, tmp_path):
    import shutil

    house = tmp_path / "house"
    shutil.copytree(rayhouse, house)
    p = write_wheel(
        house,
        "ray",
        "2.58.2",
        "py3-none-any",
        {"ray/__init__.py": ""},
        requires=["click>=9", 'vllm[audio]==0.26.0; extra == "llm"', 'purepkg; extra == "serve"'],
    )
    t = datetime(2026, 10, 3, 12, tzinfo=timezone.utc).timestamp()
    os.utime(p, (t, t))
    write_wheel(house, "click", "9.0.0", "py3-none-any", {"click/__init__.py": ""})
    base = _vllm_base(tmp_path, rayhouse, "0.26.0")  # click 8.1.0 in the base
    out = tmp_path / "l.lock"
    r = CliRunner().invoke(
        main,
        ["lock", "--vllm", "0.26.0", "--base", str(base), "--no-index", "--find-links", str(house), "-o", str(out)],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    lock = load_lock(out)
    assert lock.by_name()["ray"].version == "2.60.0"  # the newest that fits, base pins untouched
    assert not [e for e in lock.entries if e.base_version]
    assert lock.header["serve-backend"] == BACKEND_FALLBACK
    assert "ray[llm] 2.58.2 pins vllm==0.26.0 but needs moving base pins (click 8.1.0 -> 9.0.0)" in lock.header["ray"]
    assert "--with 'ray[serve]==2.58.2' --with 'click==9.0.0'" in lock.header["ray"]
