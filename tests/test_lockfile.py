"""The lock file format (builder/lockfile.py): pure parse/format rules, each written out here."""

from __future__ import annotations

import pytest

from builder.errors import BadInput
from builder.lockfile import LockEntry, LockFile, WheelRef, format_lock, parse_lock
from builder.manifest import DistFacts

HEADER = {
    "tool": "build-image 0.1.0 (uv 0.13.9)", "vllm": "0.26.0", "base-ref": "vllm/vllm-openai:v0.26.0",
    "base-digest": "-", "base-manifest-sha256": "0" * 64, "python": "3.12",
    "platform": "x86_64-manylinux_2_35", "inputs-sha256": "1" * 64,
}


def entry(name: str, version: str, h: str) -> LockEntry:
    fname = f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    return LockEntry(name=name, version=version, hashes=[h * 64], via=["-r overlay"],
                     wheel=WheelRef(url=f"https://files.example/{fname}", sha256=h * 64),
                     facts=DistFacts(binary=False, extensions=0, numpy_abi={"1": 0, "2": 0}, python_abi="none"))


def lock(*entries: LockEntry, allow: dict[str, str] | None = None) -> LockFile:
    return LockFile(header=dict(HEADER), overlay=["click"], allow_abi_change=allow or {}, entries=list(entries))


def test_allow_abi_change_reason_keeps_its_colons():
    # '# allow-abi-change: NAME: REASON' -- a package name holds no ':', so the first colon ends it
    reason = "numpy 2.x: every extension rebuilt upstream: see vllm#123"
    text = format_lock(lock(entry("numpy", "2.2.6", "a"), allow={"numpy": reason}))
    assert f"# allow-abi-change: numpy: {reason}\n" in text
    assert parse_lock(text).allow_abi_change == {"numpy": reason}


def test_allow_abi_change_name_is_canonicalised():
    text = format_lock(lock(entry("numpy", "2.2.6", "a"))).replace(
        "#\nnumpy==", "# allow-abi-change: NumPy: why\n#\nnumpy==")
    assert parse_lock(text).allow_abi_change == {"numpy": "why"}


@pytest.mark.parametrize("first, second", [("Click", "click"), ("typing_extensions", "typing-extensions"),
                                           ("zope.interface", "Zope-Interface")])
def test_duplicate_detection_uses_the_canonical_name(first, second):
    # PEP 503: names equal after lower-casing and folding runs of '-', '_', '.' are one distribution
    one = format_lock(lock(entry(first, "8.1.7", "a")))
    block = one[one.index(f"{first}=="):]
    text = one.replace("# entries: 1", "# entries: 2") + block.replace(f"{first}==", f"{second}==").replace("a" * 64, "b" * 64)
    first_line = one.splitlines().index(f"{first}==8.1.7 \\") + 1
    with pytest.raises(BadInput, match=rf"duplicate package '{second}' \(first at line {first_line}\)"):
        parse_lock(text, "x.lock")


def test_round_trip_is_exact():
    original = lock(entry("click", "8.1.7", "a"), entry("aiohttp", "3.11.10", "b"), allow={"numpy": "r: s"})
    text = format_lock(original)
    again = parse_lock(text)
    assert format_lock(again) == text
    assert [e.name for e in again.entries] == ["aiohttp", "click"]       # sorted by canonical name
    assert again.header["entries"] == "2"
