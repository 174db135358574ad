"""Lock stage: pure helpers, and the real `build-image lock` on the fixture wheels.

The CLI tests are offline and deterministic: the base is made by
``build-image base snapshot --site-packages`` of a directory holding the
fixture ``fakearrow 14.0.2`` (a gcc-built extension whose bytes name only
``numpy.core._multiarray_umath``: built against numpy 1.x) and the fake
``numpy 1.26.4``; overlays are resolved by the real uv with
``--no-index --find-links <wheelhouse>``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from builder.cli import main
from builder.errors import BadInput, IntegrityError
from builder.platforms import ARM64
from builder.resolve import explain as X
from builder.resolve import lock as L
from builder.resolve.lockfile import load_lock
from builder.resolve.manifest import load_manifest
from builder.util import sha256_file
from tests.conftest import run

PRIVATE_CACHE = "bi-cache"  # the download cache of this module's tests (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture(scope="session")
def np1_base(tmp_path_factory, make_site_packages) -> Path:
    """Manifest of a base holding fakearrow 14.0.2 (numpy-1.x extension) + numpy 1.26.4 + purepkg."""
    d = tmp_path_factory.mktemp("np1base")
    sp = make_site_packages(d / "site-packages", ["fakearrow==14.0.2", "numpy==1.26.4", "purepkg==1.0.0"])
    out = d / "base.json"
    res = CliRunner().invoke(
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
            "--cuda",
            "13.0",
            "-o",
            str(out),
        ],
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.output
    m = load_manifest(out)
    assert m.get("fakearrow").facts.numpy_abi == {"1": 1, "2": 0}
    return out


@pytest.fixture
def offline(np1_base, wheelhouse):
    def args(*extra: str) -> list[str]:
        return [
            "lock",
            "--base",
            str(np1_base),
            "--no-default-overlay",
            "--no-index",
            "--find-links",
            str(wheelhouse),
            *extra,
        ]

    return args


# ------------------------------------------------------------------ the numpy story, end to end


def test_overlay_needing_numpy2_is_refused_with_base_pin_and_evidence(offline, tmp_path):
    out = tmp_path / "r.lock"
    code, text = run(*offline("--with", "numpy2user", "-o", str(out)))
    assert code == 4, text
    assert "numpy==1.26.4 is pinned by the base" in text
    assert "fakearrow 14.0.2 there has 1 extension built against numpy 1.x" in text
    assert "numpy2user" in text and "No solution found" in text  # uv's derivation passed through
    assert "--with 'numpy>=2' releases the numpy pin" in text  # the specifier uv says is needed
    assert not out.exists()


def test_releasing_numpy_pin_hits_the_gate_with_evidence_and_chain(offline, tmp_path):
    out = tmp_path / "r.lock"
    code, text = run(*offline("--with", "numpy2user", "--with", "numpy>=2", "-o", str(out)))
    assert code == 3, text
    assert "[numpy-abi] numpy 1.26.4 -> 2.1.0" in text
    assert "evidence: fakearrow 14.0.2: 1 extension built against numpy 1.x" in text
    assert "pulled by: numpy 2.1.0 ← numpy2user 1.0.0 (numpy>=2) ← overlay (numpy2user)" in text
    assert "--allow-abi-change numpy --reason" in text
    assert not out.exists()


def test_allow_abi_change_writes_lock_with_reason_hashes_and_facts(offline, tmp_path, wheelhouse):
    out = tmp_path / "r.lock"
    code, text = run(
        *offline(
            "--with",
            "numpy2user",
            "--with",
            "numpy>=2",
            "--allow-abi-change",
            "numpy",
            "--reason",
            "fakearrow is rebuilt in the next layer",
            "-o",
            str(out),
        )
    )
    assert code == 0, text
    lock = load_lock(out)
    assert lock.allow_abi_change == {"numpy": "fakearrow is rebuilt in the next layer"}
    assert lock.overlay == ["numpy2user", "numpy>=2"]
    assert lock.header["python"] == "3.12" and lock.header["platform"] == "x86_64-manylinux_2_35"
    assert lock.header["base-manifest-sha256"] == sha256_file(offline()[2])
    by = lock.by_name()
    assert sorted(by) == ["numpy", "numpy2user"]  # fakearrow/purepkg stay in the base
    np = by["numpy"]
    assert (np.version, np.base_version) == ("2.1.0", "1.26.4")
    wheel = wheelhouse / "numpy-2.1.0-py3-none-any.whl"
    assert np.hashes == [sha256_file(wheel)] and np.wheel.sha256 == sha256_file(wheel)
    assert np.wheel.url == wheel.resolve().as_uri()
    assert "numpy2user" in np.via and "-r overlay" in by["numpy2user"].via
    assert by["numpy2user"].base_version is None


def test_binary_overlay_is_scanned_and_recorded(offline, tmp_path, wheelhouse):
    out = tmp_path / "r.lock"
    code, text = run(*offline("--with", "stableabi", "-o", str(out)))
    assert code == 0, text
    e = load_lock(out).by_name()["stableabi"]
    assert e.facts.binary and e.facts.extensions == 1 and e.facts.python_abi == "abi3"
    assert e.facts.glibc is not None and e.wheel.url.endswith("stableabi-1.0.0-cp38-abi3-manylinux_2_17_x86_64.whl")


def test_new_glibc_wheel_is_rejected_by_elf_evidence(offline, tmp_path):
    out = tmp_path / "r.lock"
    code, text = run(*offline("--with", "newglibc", "-o", str(out)))
    assert code == 3, text
    assert "[glibc] newglibc 1.0.0" in text and "GLIBC_2.99" in text and "glibc 2.35" in text
    assert not out.exists()


def test_wrong_python_abi_only_wheel_is_unsatisfiable(offline, tmp_path):
    code, text = run(*offline("--with", "oldabi", "-o", str(tmp_path / "r.lock")))
    assert code == 4, text
    assert "oldabi" in text


def test_failed_lock_never_replaces_a_good_one(offline, tmp_path):
    out = tmp_path / "r.lock"
    code, text = run(*offline("--with", "purepkg", "--with", "stableabi", "-o", str(out)))
    assert code == 0, text
    before = out.read_bytes()
    code, _ = run(*offline("--with", "newglibc", "--upgrade", "-o", str(out)))
    assert code == 3
    assert out.read_bytes() == before
    code, _ = run(*offline("--with", "numpy2user", "-o", str(out)))
    assert code == 4
    assert out.read_bytes() == before


def test_check_up_to_date_then_stale_and_relock_short_circuit(offline, tmp_path):
    out = tmp_path / "r.lock"
    assert run(*offline("--with", "stableabi", "-o", str(out)))[0] == 0
    before = out.read_bytes()
    code, text = run(*offline("--with", "stableabi", "-o", str(out), "--check"))
    assert code == 0 and "up to date" in text
    code, text = run(*offline("--with", "stableabi", "--with", "purepkg>=1", "-o", str(out), "--check"))
    assert code == 5 and "overlay changed" in text
    assert out.read_bytes() == before
    # an up-to-date re-lock does not resolve again (and keeps the file byte for byte)
    code, text = run(*offline("--with", "stableabi", "-o", str(out), "--json"))
    assert code == 0 and json.loads(text)["status"] == "up-to-date"
    assert out.read_bytes() == before


def test_check_on_missing_lock_is_stale(offline, tmp_path):
    out = tmp_path / "none.lock"
    code, text = run(*offline("--with", "stableabi", "-o", str(out), "--check"))
    assert code == 5 and not out.exists()


def test_pure_base_upgrade_is_a_notice(tmp_path, make_site_packages, wheelhouse):
    sp = make_site_packages(tmp_path / "sp", ["numpy==1.26.4"])
    base = tmp_path / "b.json"
    assert (
        run("base", "snapshot", "--site-packages", str(sp), "--python", "3.12", "--glibc", "2.35", "-o", str(base))[0]
        == 0
    )
    code, text = run(
        "lock",
        "--base",
        str(base),
        "--no-default-overlay",
        "--no-index",
        "--find-links",
        str(wheelhouse),
        "--with",
        "numpy>=2",
        "-o",
        str(tmp_path / "r.lock"),
        "--json",
    )
    assert code == 0, text
    doc = json.loads(text[text.index("{") :])
    assert doc["moved_base"] == ["numpy"]
    assert [(n["name"], n["rule"]) for n in doc["gate"]["notices"]] == [("numpy", "newer-than-base")]


# ------------------------------------------------------------------ bad input: exit 2, nothing written


@pytest.mark.parametrize(
    "case",
    [
        "unknown-vllm",
        "malformed-spec",
        "unreadable-manifest",
        "conflicting-with",
        "reason-missing",
        "vllm-vs-with",
        "spec-unknown-key",
        "spec-wrong-type",
        "spec-serving-type",
    ],
)
def test_bad_input_exit_2_nothing_written(case, tmp_path, offline):
    out = tmp_path / "r.lock"
    if case == "unknown-vllm":
        args = ["lock", "--vllm", "9.9.9", "-o", str(out)]
        needle = "9.9.9"
    elif case == "malformed-spec":
        spec = tmp_path / "spec.toml"
        spec.write_text('vllm = "0.26.0"\nwith = [1, 2\n')
        args = ["lock", "--spec", str(spec), "-o", str(out)]
        needle = "not valid TOML"
    elif case.startswith("spec-"):
        spec = tmp_path / "spec.toml"
        spec.write_text(
            {
                "spec-unknown-key": 'wiht = ["numpy"]\n',
                "spec-wrong-type": "vllm = 0.26\n",
                "spec-serving-type": '[serving]\ntp = "8"\n',
            }[case]
        )
        args = ["lock", "--spec", str(spec), "-o", str(out)]
        needle = {
            "spec-unknown-key": f"spec {spec}: unknown key 'wiht'",
            "spec-wrong-type": f"spec {spec}: 'vllm' must be a TOML string, got float 0.26",
            "spec-serving-type": f"spec {spec}: 'serving.tp' has the wrong type: it must be an integer, got string '8'",
        }[case]
    elif case == "unreadable-manifest":
        bad = tmp_path / "bad.json"
        bad.write_text('{"schema": "build-image/base-manifest/v1", "image": ')
        args = ["lock", "--base", str(bad), "-o", str(out)]
        needle = "bad.json"
    elif case == "conflicting-with":
        args = offline("--with", "numpy==1.26.4", "--with", "numpy>=2", "-o", str(out))
        needle = "conflicting overlay requirements for numpy"
    elif case == "reason-missing":
        args = offline("--with", "purepkg", "--allow-abi-change", "numpy", "-o", str(out))
        needle = "--reason"
    else:
        args = ["lock", "--with", "vllm==0.25.0", "-o", str(out)]
        needle = "conflicts with --vllm 0.26.0"
    code, text = run(*args)
    assert code == 2, text
    assert needle in text
    assert text.startswith("bad input:")
    assert not out.exists()


# ------------------------------------------------------------------ pure helpers

UV_REQS = """\
aiohttp==3.14.5
    # via
    #   aiohttp-cors
    #   ray
numpy==2.1.0
    # via
    #   -r /tmp/bi-lock-x/overlay.in
    #   numpy2user
ray==2.59.0
    # via -r /tmp/bi-lock-x/overlay.in
torch==2.11.0
    # via -r base.in
"""


def test_parse_uv_requirements():
    got = L.parse_uv_requirements(UV_REQS)
    assert got["aiohttp"] == ("aiohttp", "3.14.5", ["aiohttp-cors", "ray"])
    assert got["numpy"] == ("numpy", "2.1.0", ["-r overlay", "numpy2user"])
    assert got["ray"][2] == ["-r overlay"] and got["torch"][2] == ["-r base"]


PYLOCK = """\
lock-version = "1.0"
created-by = "uv"
requires-python = ">=3.12"

[[packages]]
name = "aiohttp"
version = "3.14.5"
wheels = [
    { url = "https://h/aiohttp-3.14.5-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl", size = 10, hashes = { sha256 = "aa" } },
    { url = "https://h/aiohttp-3.14.5-py3-none-any.whl", size = 5, hashes = { sha256 = "bb" } },
]

[[packages]]
name = "numpy"
version = "2.1.0"
wheels = [{ path = "wh/numpy-2.1.0-py3-none-any.whl", hashes = { sha256 = "cc" } }]
"""  # noqa: E501 - verbatim uv output


def test_parse_pylock_and_select_wheel(tmp_path):
    got = L.parse_pylock(PYLOCK, tmp_path)
    assert [c.sha256 for c in got["aiohttp"][2]] == ["aa", "bb"]
    assert got["numpy"][2][0].url == (tmp_path / "wh" / "numpy-2.1.0-py3-none-any.whl").as_uri()
    tags = L.target_tags("3.12", "cp312", "x86_64-manylinux_2_35")
    assert L.select_wheel(got["aiohttp"][2], tags).sha256 == "aa"  # the binary wheel outranks py3-none-any
    cands = [
        L.WheelCandidate("x-1-cp39-cp39-manylinux_2_17_x86_64.whl", "u", "1"),
        L.WheelCandidate("x-1-cp312-cp312-manylinux_2_39_x86_64.whl", "u", "2"),
    ]
    assert L.select_wheel(cands, tags) is None  # wrong ABI / too new a glibc: nothing installable
    cands.append(L.WheelCandidate("x-1-cp312-cp312-manylinux_2_31_x86_64.whl", "u", "3"))
    cands.append(L.WheelCandidate("x-1-cp312-cp312-manylinux_2_17_x86_64.whl", "u", "4"))
    assert L.select_wheel(cands, tags).sha256 == "3"  # most specific compatible platform first


def test_base_requirements_release_only_named_dists():
    m = load_manifest_from_dict({"numpy": "1.26.4", "transformers": "5.14.1", "torch": "2.11.0"})
    reqs = L.base_requirements(m, ["ray[serve]", "Transformers==5.23.0"])
    assert reqs == ["numpy==1.26.4", "torch==2.11.0"]


def test_inputs_sha256_covers_every_input():
    m = load_manifest_from_dict({"numpy": "1.26.4"})
    mk = lambda **kw: L.LockRequest(
        **{"vllm": "0.26.0", "base": m, "base_bytes": b"m", "overlay": ["ray[serve]"], **kw}
    )
    ref = L.inputs_sha256(mk(), "0.13.9")
    assert ref == L.inputs_sha256(mk(), "0.13.9")
    variants = [
        L.inputs_sha256(mk(base_bytes=b"m2"), "0.13.9"),
        L.inputs_sha256(mk(overlay=["ray[serve]", "x"]), "0.13.9"),
        L.inputs_sha256(mk(allow={"numpy": "r"}), "0.13.9"),
        L.inputs_sha256(mk(no_index=True), "0.13.9"),
        L.inputs_sha256(mk(find_links=["/w"]), "0.13.9"),
        L.inputs_sha256(mk(exclude_newer="2026-07-25"), "0.13.9"),
        L.inputs_sha256(mk(), "0.14.0"),
        L.inputs_sha256(mk(), "0.13.9", tool_version="9.9"),
    ]
    assert len(set(variants + [ref])) == len(variants) + 1


def test_parse_overlay_conflicts_and_garbage():
    assert [r.name for r in L.parse_overlay(["ray[serve]", "numpy>=2", "numpy>=2"])] == ["ray", "numpy", "numpy"]
    with pytest.raises(BadInput, match="conflicting"):
        L.parse_overlay(["numpy==1.26.4", "numpy>=2"])
    with pytest.raises(BadInput, match="not a valid PEP 508"):
        L.parse_overlay(["numpy>>2"])


def test_involved_base_pins_from_derivation():
    m = load_manifest_from_dict({"numpy": "1.26.4", "torch": "2.11.0", "pyarrow": "14.0.2"})
    deriv = (
        "× No solution found when resolving dependencies:\n"
        "╰─▶ Because opencv-python-headless==4.13.0.90 depends on numpy>=2 and you require numpy==1.26.4, "
        "we can conclude that your requirements are unsatisfiable."
    )
    assert X.involved_base_pins(deriv, m) == ["numpy"]
    assert X.involved_base_pins(deriv, m, released=["numpy"]) == []
    assert X.wanted_specifier(deriv, "numpy", "1.26.4") == ">=2"
    tok = "Because transformers>=5.24.0 depends on tokenizers>=0.23.1,<0.24.0 and you require tokenizers==0.22.2"
    assert X.wanted_specifier(tok, "tokenizers", "0.22.2") == ">=0.23.1,<0.24.0"
    assert X.wanted_specifier("you require tokenizers==0.22.2", "tokenizers", "0.22.2") is None
    hub = "transformers>=5.24.0 depends on huggingface-hub>=1.31.0,<3.0 and you require huggingface-hub==1.24.0"
    assert X.wanted_specifier(hub, "huggingface_hub", "1.24.0") == ">=1.31.0,<3.0"
    # uv's real derivation for `--with 'numpy<2'` on the vllm 0.26.0 base: opencv>=5.0.0.93 is the
    # range that conflicts (subject position), so the way out is its complement, never '>=5.0.0.93'
    cv = (
        "Because opencv-python-headless>=5.0.0.93 depends on numpy>=2 and you require numpy<2, we can conclude "
        "that your requirements and opencv-python-headless>=5.0.0.93 are incompatible.\n"
        "And because you require opencv-python-headless==5.0.0.93, we can conclude that your requirements are "
        "unsatisfiable."
    )
    assert X.wanted_specifier(cv, "opencv-python-headless", "5.0.0.93") == "<5.0.0.93"
    msg, details = X.explain_unsatisfiable(
        cv, load_manifest_from_dict({"opencv-python-headless": "5.0.0.93"}), ["numpy<2"]
    )
    assert "--with 'opencv-python-headless<5.0.0.93' releases" in details and ">=5.0.0.93'" not in details
    # nothing usable: release the pin without inventing a bound ('>=X' pointed the wrong way)
    assert X.wanted_specifier("you require tokenizers==0.22.2", "tokenizers", "0.22.2") is None


def test_fetch_wheel_verifies_and_refetches_corrupt_cache(tmp_path, monkeypatch, fixture_wheel):
    monkeypatch.setenv("BUILD_IMAGE_CACHE", str(tmp_path / "cache"))
    src = fixture_wheel("purepkg", "1.0.0")
    sha = sha256_file(src)
    got = L.fetch_wheel(src.resolve().as_uri(), sha)
    assert sha256_file(got) == sha
    got.write_bytes(b"truncated")  # corrupt the cached copy
    again = L.fetch_wheel(src.resolve().as_uri(), sha)
    assert again == got and sha256_file(again) == sha
    with pytest.raises(IntegrityError, match="sha256"):
        L.fetch_wheel(src.resolve().as_uri(), "0" * 64)


def load_manifest_from_dict(versions: dict[str, str]):
    from builder.resolve.manifest import BaseManifest, Distribution

    return BaseManifest(
        None,
        None,
        None,
        "2.35",
        "3.12",
        "cp312",
        None,
        "13.0",
        "x86_64-manylinux_2_35",
        "reconstructed",
        "test",
        {k: Distribution(k, v) for k, v in versions.items()},
    )


def test_json_rejection_carries_the_gate_findings(offline, tmp_path):
    code, text = run(*offline("--with", "newglibc", "-o", str(tmp_path / "r.lock"), "--json"))
    assert code == 3
    doc = json.loads(text[text.index("{") : text.rindex("}") + 1])
    assert doc["status"] == "abi-rejected" and doc["written"] is False
    (v,) = doc["gate"]["violations"]
    assert (v["name"], v["rule"], v["new"]) == ("newglibc", "glibc", "1.0.0")


def test_relock_after_input_change_prefers_previous_pins_upgrade_does_not(tmp_path, make_site_packages, wheelhouse):
    sp = make_site_packages(tmp_path / "sp", ["numpy==1.26.4"])
    base = tmp_path / "b.json"
    assert (
        run("base", "snapshot", "--site-packages", str(sp), "--python", "3.12", "--glibc", "2.35", "-o", str(base))[0]
        == 0
    )
    out = tmp_path / "r.lock"
    common = [
        "lock",
        "--base",
        str(base),
        "--no-default-overlay",
        "--no-index",
        "--find-links",
        str(wheelhouse),
        "-o",
        str(out),
    ]
    assert run(*common, "--with", "fakearrow==14.0.2")[0] == 0
    assert load_lock(out).by_name()["fakearrow"].version == "14.0.2"
    code, text = run(*common, "--with", "fakearrow", "--with", "purepkg")  # inputs changed: re-resolve
    assert code == 0, text
    assert load_lock(out).by_name()["fakearrow"].version == "14.0.2"  # kept: still fits
    code, text = run(*common, "--with", "fakearrow", "--with", "purepkg", "--upgrade")
    assert code == 0, text
    e = load_lock(out).by_name()["fakearrow"]
    assert e.version == "17.0.0" and e.facts.numpy_abi == {"1": 0, "2": 1}


def test_spec_file_holds_what_the_flags_hold(np1_base, wheelhouse, tmp_path):
    spec = tmp_path / "build-image.toml"
    spec.write_text(
        f'base = "{np1_base}"\nwith = ["numpy2user", "numpy>=2"]\nlock = "{tmp_path / "spec.lock"}"\n'
        '[allow-abi-change]\nnumpy = "fakearrow is rebuilt in the next layer"\n'
    )
    out = tmp_path / "flag.lock"
    code, text = run(
        "lock",
        "--spec",
        str(spec),
        "--no-default-overlay",
        "--no-index",
        "--find-links",
        str(wheelhouse),
        "-o",
        str(out),
    )
    assert code == 0, text
    assert not (tmp_path / "spec.lock").exists()  # -o wins over the spec's lock
    lock = load_lock(out)
    assert lock.allow_abi_change == {"numpy": "fakearrow is rebuilt in the next layer"}
    assert lock.by_name()["numpy"].version == "2.1.0"


def test_damaged_lock_on_disk_is_stale_and_gets_replaced(offline, tmp_path):
    out = tmp_path / "r.lock"
    out.write_text("# build-image-lock: 1\nnumpy==2.1.0 \\\n")  # truncated
    code, text = run(*offline("--with", "stableabi", "-o", str(out), "--check"))
    assert code == 5 and "truncated" in text
    code, text = run(*offline("--with", "stableabi", "-o", str(out)))
    assert code == 0, text
    assert "stableabi" in load_lock(out).by_name()


@pytest.mark.parametrize(
    "edit, needle",
    [
        # the version bumped by hand: the wheel line still names 1.0.0
        (lambda t: t.replace("stableabi==1.0.0", "stableabi==1.0.1"), "names the wheel stableabi-1.0.0"),
        # the pinned hash swapped by hand: the wheel's sha256 is no longer among the --hash lines
        (lambda t: t.replace(t.split("--hash=sha256:")[1][:64], "0" * 64, 1), "is not one of its --hash lines"),
        # truncated after the hash lines: no '# wheel:' / '# facts:' line for the last entry
        (lambda t: t[: t.index("    # via")], "has no '# wheel:' line"),
    ],
    ids=["version", "hash", "truncated-after-hashes"],
)
def test_hand_edited_or_truncated_lock_is_caught_by_check(offline, tmp_path, edit, needle):
    """--check must not call a lock "up to date" when its body no longer matches what
    `build-image lock` wrote (the header's inputs-sha256 alone cannot see that)."""
    out = tmp_path / "r.lock"
    assert run(*offline("--with", "stableabi", "-o", str(out)))[0] == 0
    edited = edit(out.read_text())
    assert edited != out.read_text()
    out.write_text(edited)
    code, text = run(*offline("--with", "stableabi", "-o", str(out), "--check"))
    assert code == 5, text
    assert needle in text and f"lock {out}, line " in text
    assert out.read_text() == edited  # --check writes nothing


def test_json_on_every_failure_is_a_document_on_stdout(offline, tmp_path):
    """--json: unsatisfiable, stale and bad input also answer with JSON on stdout (not only
    success and ABI rejection), so a script never parses an empty stdout."""
    out = tmp_path / "r.lock"
    for args, code, status in [
        (offline("--with", "numpy2user", "-o", str(out), "--json"), 4, "unsatisfiable"),
        (offline("--with", "stableabi", "-o", str(out), "--check", "--json"), 5, "stale"),
        (["lock", "--vllm", "0.0.1", "-o", str(out), "--json"], 2, "bad-input"),
    ]:
        res = CliRunner().invoke(main, args, catch_exceptions=False)
        assert res.exit_code == code, res.output
        doc = json.loads(res.stdout)
        assert doc["status"] == status and doc["exit_code"] == code and doc["written"] is False
        assert doc["message"] and doc["message"] in res.stderr
    assert (
        "numpy==1.26.4 is pinned by the base"
        in json.loads(CliRunner().invoke(main, offline("--with", "numpy2user", "-o", str(out), "--json")).stdout)[
            "details"
        ]
    )
    assert not out.exists()


def test_output_that_is_a_directory_or_unwritable_is_bad_input(offline, tmp_path):
    """-o naming a directory or an unwritable place: exit 2 with the path, not a traceback (exit 1
    would read as a verdict)."""
    d = tmp_path / "locks"
    d.mkdir()
    code, text = run(*offline("--with", "stableabi", "-o", str(d)))
    assert code == 2 and f"lock path {d} is a directory" in text
    blocker = tmp_path / "file"
    blocker.write_text("x")
    res = CliRunner().invoke(main, offline("--with", "stableabi", "-o", str(blocker / "r.lock")))
    assert res.exit_code == 2, res.output
    assert f"cannot write {blocker / 'r.lock'}" in res.output and blocker.read_text() == "x"


def test_a_with_flag_replaces_the_specs_requirement_on_the_same_package(np1_base, wheelhouse, tmp_path):
    """Flags win: `--with 'numpy<2'` overrides the spec's `with = ["numpy>=2"]` instead of
    being refused as a conflict; requirements on other packages are kept."""
    from builder.spec import parse_spec

    s = parse_spec('with = ["numpy2user", "NumPy>=2"]\n', "s.toml").with_flags(with_=["numpy<2"])
    assert s.with_ == ["numpy2user", "numpy<2"]
    spec = tmp_path / "build-image.toml"
    spec.write_text(f'base = "{np1_base}"\nwith = ["purepkg", "numpy>=2"]\n')
    out = tmp_path / "r.lock"
    code, text = run(
        "lock",
        "--spec",
        str(spec),
        "--no-default-overlay",
        "--no-index",
        "--find-links",
        str(wheelhouse),
        "--with",
        "numpy<2",
        "-o",
        str(out),
    )
    assert code == 0, text
    assert load_lock(out).overlay == ["purepkg", "numpy<2"]


def test_an_allow_abi_change_that_allows_nothing_is_warned_about(offline, tmp_path):
    out = tmp_path / "r.lock"
    res = CliRunner().invoke(
        main, offline("--with", "stableabi", "--allow-abi-change", "torch", "--reason", "old", "-o", str(out), "--json")
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["unused_allow_abi_change"] == ["torch"]
    assert "--allow-abi-change torch: no gate violation to allow" in res.stderr
    assert load_lock(out).allow_abi_change == {"torch": "old"}  # still an input, still recorded


def test_exact_coupled_binary_is_rejected_without_downloading_it(offline, tmp_path, monkeypatch):
    """torch/nvidia-* moves are rejected by name: the gate must not fetch GBs of wheels first.
    (stableabi stands in for torch here.)"""
    from builder.resolve import abi

    monkeypatch.setattr(abi, "_EXACT_NAMES", abi._EXACT_NAMES | {"stableabi"})
    fetched = []
    real = L.wheel_facts
    monkeypatch.setattr(L, "wheel_facts", lambda cand: fetched.append(cand.filename) or real(cand))
    out = tmp_path / "r.lock"
    code, text = run(*offline("--with", "stableabi", "-o", str(out)))
    assert code == 3, text
    assert "[exact-coupled] stableabi 1.0.0" in text and not out.exists()
    assert not any(f.startswith("stableabi-") for f in fetched)
    # allowed: now its files matter (glibc, python ABI), so it is scanned and recorded
    code, text = run(
        *offline("--with", "stableabi", "--allow-abi-change", "stableabi", "--reason", "test", "-o", str(out))
    )
    assert code == 0, text
    assert any(f.startswith("stableabi-") for f in fetched)
    assert load_lock(out).by_name()["stableabi"].facts.extensions == 1


def test_default_manifest_and_lock_come_from_the_checkout_the_command_runs_in(tmp_path, monkeypatch):
    """A non-editable install (`pip install .`, as in the example CI workflow) has no
    lockfiles/ beside the package: `lock --check` from the repository root must still find
    the manifest and the lock there; from a subdirectory of an editable checkout, both come
    from the package's checkout (never a manifest from one place and a lock from another)."""
    import shutil

    from builder import spec as S
    from builder.util import project_root

    root = project_root()
    monkeypatch.chdir(root / "docs")
    code, text = run("lock", "--check")
    assert code == 0, text
    assert str(root / "lockfiles" / "vllm-0.26.0" / "requirements.lock") in text
    checkout = tmp_path / "checkout"
    shutil.copytree(root / "lockfiles", checkout / "lockfiles")
    monkeypatch.chdir(checkout)
    monkeypatch.setattr(S, "data_path", lambda rel="": tmp_path / "site-packages" / rel)  # installed elsewhere
    names = [
        p.name[len("vllm-openai-v") : -len(".json")]
        for p in (checkout / "lockfiles" / "base").glob("vllm-openai-v*.json")
    ]
    shipped = sorted(n for n in names if "-linux-" not in n)  # the default platform's; linux/arm64's apart
    arm = sorted(n.removesuffix("-linux-arm64") for n in names if n.endswith("-linux-arm64"))
    assert "0.26.0" in shipped and sorted(S.supported_vllm_versions()) == shipped  # the checkout's, not the package's
    assert sorted(S.supported_vllm_versions(ARM64)) == arm and "0.33.0" in arm
    code, text = run("lock", "--check")
    assert code == 0, text
    assert "lockfiles/vllm-0.26.0/requirements.lock is up to date" in text


def test_a_lock_cut_between_two_entries_is_caught_by_its_entry_count(offline, tmp_path):
    """Every entry ends with its '# facts:' line, so a cut right after one looked like a shorter
    lock; the '# entries: N' header line catches it (--check: stale, naming the last entry)."""
    out = tmp_path / "r.lock"
    assert (
        run(
            *offline(
                "--with",
                "stableabi",
                "--with",
                "purepkg",
                "--with",
                "numpy2user",
                "--with",
                "numpy>=2",
                "--allow-abi-change",
                "numpy",
                "--reason",
                "r",
                "-o",
                str(out),
            )
        )[0]
        == 0
    )
    text = out.read_text()
    assert "# entries: 3\n" in text  # numpy, numpy2user, stableabi (purepkg is in the base)
    cut = text[: text.index("stableabi==")]  # drop the last entry whole
    out.write_text(cut)
    code, msg = run(
        *offline(
            "--with",
            "stableabi",
            "--with",
            "purepkg",
            "--with",
            "numpy2user",
            "--with",
            "numpy>=2",
            "--allow-abi-change",
            "numpy",
            "--reason",
            "r",
            "-o",
            str(out),
            "--check",
        )
    )
    assert code == 5, msg
    assert "the header says 'entries: 3' but the file holds 2 package(s)" in msg and "numpy2user==1.0.0" in msg
    # locks written before the count existed still read (the line is optional)
    from builder.resolve.lockfile import parse_lock

    assert len(parse_lock(text.replace("# entries: 3\n", "")).entries) == 3


def test_spec_holds_the_index_flags_too(np1_base, wheelhouse, tmp_path):
    """find-links / no-index / exclude-newer are flags of `lock`, so the spec holds them too
    (the issue: 'the spec file holds what the flags hold'); the flag wins for exclude-newer."""
    spec = tmp_path / "build-image.toml"
    spec.write_text(
        f'base = "{np1_base}"\nwith = ["stableabi"]\nfind-links = ["{wheelhouse}"]\nno-index = true\n'
        'exclude-newer = "2000-01-01"\n'
    )
    out = tmp_path / "r.lock"
    code, text = run("lock", "--spec", str(spec), "--no-default-overlay", "-o", str(out))
    assert code == 0, text
    assert load_lock(out).header["exclude-newer"] == "2000-01-01"  # (find-links files carry no upload date)
    code, text = run(
        "lock", "--spec", str(spec), "--no-default-overlay", "--exclude-newer", "2100-01-01", "-o", str(out)
    )
    assert code == 0, text
    lock = load_lock(out)
    assert lock.header["index"] == f"--no-index --find-links {wheelhouse.resolve()}"
    assert lock.header["exclude-newer"] == "2100-01-01" and "stableabi" in lock.by_name()
    spec.write_text('no-index = "yes"\n')
    code, text = run("lock", "--spec", str(spec), "-o", str(out))
    assert code == 2 and "'no-index' must be a TOML boolean" in text


def test_ambient_uv_settings_do_not_change_the_lock(offline, tmp_path, monkeypatch):
    """UV_RESOLUTION=lowest (or a UV_CONSTRAINT file) in the caller's environment changed the
    resolution while inputs-sha256 stayed the same, so `--check` vouched for either lock."""
    plain = tmp_path / "plain.lock"
    assert run(*offline("--with", "fakearrow>=14", "-o", str(plain)))[0] == 0
    cons = tmp_path / "c.txt"
    cons.write_text("fakearrow==14.0.2\n")
    monkeypatch.setenv("UV_RESOLUTION", "lowest")
    monkeypatch.setenv("UV_CONSTRAINT", str(cons))
    ambient = tmp_path / "ambient.lock"
    code, text = run(*offline("--with", "fakearrow>=14", "-o", str(ambient)))
    assert code == 0, text
    assert (
        [(e.name, e.version) for e in load_lock(ambient).entries]
        == [(e.name, e.version) for e in load_lock(plain).entries]
        == [("fakearrow", "17.0.0")]
    )


def test_a_base_that_is_not_pip_consistent_still_takes_an_overlay_that_does_not_reach_the_break(
    np1_base, wheelhouse, tmp_path
):
    """The published images hold pins that do not fit together (a --no-deps reinstall, a later step moving an
    earlier package's requirement): the base's pins constrain what the overlay pulls in, and a break the
    overlay does not reach is not its conflict."""
    doc = json.loads(np1_base.read_text())
    doc["distributions"]["numpy"]["version"] = "0.9.0"  # fakearrow 14.0.2 needs numpy>=1.16.6: broken in the base
    base = tmp_path / "broken.json"
    base.write_text(json.dumps(doc))
    out = tmp_path / "r.lock"
    code, text = run(
        "lock",
        "--base",
        str(base),
        "--no-default-overlay",
        "--no-index",
        "--find-links",
        str(wheelhouse),
        "--with",
        "stableabi",
        "--allow-abi-change",
        "stableabi",
        "--reason",
        "t",
        "-o",
        str(out),
    )
    assert code == 0, text
    assert "numpy" not in load_lock(out).by_name()  # never re-resolved: the overlay does not need it
    code, text = run(
        "lock",
        "--base",
        str(base),
        "--no-default-overlay",
        "--no-index",
        "--find-links",
        str(wheelhouse),
        "--with",
        "numpy2user",
        "-o",
        str(tmp_path / "n.lock"),
    )
    assert code == 4 and "numpy==0.9.0 is pinned by the base" in text  # an overlay that reaches it still conflicts


def test_the_image_uv_overrides_apply_to_the_overlay_resolution(np1_base, wheelhouse, tmp_path):
    doc = json.loads(np1_base.read_text())
    doc["uv_overrides"] = ["numpy==1.26.4"]  # as the image's ENV UV_OVERRIDE: numpy2user's numpy>=2 is overridden
    base = tmp_path / "ov.json"
    base.write_text(json.dumps(doc))
    out = tmp_path / "r.lock"
    code, text = run(
        "lock",
        "--base",
        str(base),
        "--no-default-overlay",
        "--no-index",
        "--find-links",
        str(wheelhouse),
        "--with",
        "numpy2user",
        "-o",
        str(out),
    )
    assert code == 0, text
    assert "numpy2user" in load_lock(out).by_name() and "numpy" not in load_lock(out).by_name()
