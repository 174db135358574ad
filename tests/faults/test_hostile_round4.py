"""Hostile inputs, fourth round: the base manifest's new fields, numbers past Python's digit limit, lone
surrogates, a directory where a file is read, a lock's hand-edited header and facts (docs/faults.md).

Each class is closed where the input is read; every case here reached exit 70 before.  The properties run
in-process (:func:`builder.resolve.manifest.parse_manifest`, :func:`builder.resolve.lockfile.parse_lock`,
:func:`builder.validate.load_json`): BadInput or a value, never another exception.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from builder.errors import BadInput
from builder.resolve.lockfile import parse_lock
from builder.resolve.manifest import parse_manifest
from builder.validate import load_json, load_toml, read_bounded
from tests.faults.conftest import ROOT, cli
from tests.test_fuzz import examples

MANIFEST = (ROOT / "lockfiles/base/vllm-openai-v0.34.0.json").read_text()
LOCK = (ROOT / "lockfiles/vllm-0.34.0/requirements.lock").read_text()
HUGE = "9" * 5000  # past int()'s 4300-digit limit: a ValueError wherever it is converted
MODEL = str(ROOT / "tests/data/plan/mla/config.json")


def _manifest(**torch_fields) -> dict:
    doc = json.loads(MANIFEST)
    doc["distributions"]["torch"].update(torch_fields)
    return doc


def _plan(tmp_path: Path, manifest_text: str):
    (tmp_path / "m.json").write_text(manifest_text, encoding="utf-8")
    (tmp_path / "build-image.toml").write_text('vllm = "0.34.0"\nbase = "m.json"\n')
    args = ["plan", "--model", MODEL, "--gpu-model", "NVIDIA H200", "--gpu-memory", "h200", "--weights-bytes", "10GB"]
    return cli(args, cwd=tmp_path, timeout=120)


# ---------------------------------------------------------------- the manifest's cuda and facts (plan, base list)
@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda d: d.update(cuda="²"), id="cuda-superscript"),
        pytest.param(lambda d: d.update(cuda="x.y"), id="cuda-not-a-version"),
        pytest.param(lambda d: d["distributions"]["torch"].update(glibc="2." + HUGE[:3000]), id="facts-glibc-long"),
        pytest.param(lambda d: d["distributions"]["torch"].update(cuda_runtime=10**30), id="cuda-runtime-huge"),
        pytest.param(lambda d: d["distributions"]["torch"].update(python_abi="cp3\n12"), id="python-abi-line"),
        pytest.param(lambda d: d["provenance"].update(recipe={"sdist": 5}), id="recipe-sdist-int"),
        pytest.param(lambda d: d["provenance"].update(recipe={"exclude_newer": 5}), id="recipe-instant-int"),
        pytest.param(lambda d: d["provenance"].update(recipe={"steps": [1]}), id="recipe-step-int"),
        pytest.param(lambda d: d["lacks"]["unversioned"].update({"!!!": "x"}), id="lacks-name"),
        pytest.param(lambda d: d["lacks"]["off_index"].append("a\nFROM x"), id="lacks-line"),
    ],
)
def test_a_manifest_field_off_its_grammar_is_exit_2_naming_it(tmp_path, edit):
    doc = json.loads(MANIFEST)
    edit(doc)
    r = _plan(tmp_path, json.dumps(doc))
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "base manifest m.json" in r.stderr


def test_base_list_refuses_a_shipped_manifest_holding_a_lone_surrogate(tmp_path):
    (tmp_path / "lockfiles").mkdir()
    for sub in ("base", "vllm-0.34.0"):
        src = ROOT / "lockfiles" / sub
        dst = tmp_path / "lockfiles" / sub
        dst.mkdir()
        for f in src.iterdir():
            if f.is_file() and ("0.34.0" in f.name or sub != "base"):
                (dst / f.name).write_bytes(f.read_bytes())
    doc = json.loads(MANIFEST)
    doc["lacks"]["unversioned"]["zz"] = "\ud800"
    (tmp_path / "lockfiles/base/vllm-openai-v0.34.0.json").write_text(json.dumps(doc))  # ascii: the \ud800 escape
    r = cli(["base", "list"], cwd=tmp_path, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "surrogate" in r.stderr and "Traceback" not in r.stderr


def test_a_number_past_the_digit_limit_is_bad_input_in_json_and_toml():
    text = MANIFEST.replace('"glibc": "2.39"', f'"glibc": "2.39", "n": {HUGE}', 1)
    with pytest.raises(BadInput, match="cannot be read.*5000 digits"):
        parse_manifest(text, "m.json")
    with pytest.raises(BadInput, match="5000 digits"):
        load_toml(f"a = {HUGE}\n", "spec x.toml")
    with pytest.raises(BadInput, match="not UTF-8"):
        load_json(b'{"a": "\xff"}', "doc")


def test_a_directory_given_as_a_file_is_bad_input(tmp_path):
    with pytest.raises(BadInput, match="a directory, not a regular file"):
        read_bounded(tmp_path, "base manifest")
    (tmp_path / "build-image.toml").write_text(f'vllm = "0.34.0"\nbase = "{tmp_path}"\n')
    r = cli(["plan", "--model", MODEL, "--gpu-memory", "h200", "--weights-bytes", "10GB"], cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and "a directory" in r.stderr, r.stderr


# ---------------------------------------------------------------- a hand-edited lock (diff)
@pytest.mark.parametrize(
    ("edit", "code"),
    [
        pytest.param(lambda t: re.sub(r"^# vllm: .*$", f"# vllm: {HUGE}", t, count=1, flags=re.M), 2, id="vllm-huge"),
        pytest.param(lambda t: re.sub(r"^# vllm: .*$", "# vllm: ../../x", t, count=1, flags=re.M), 2, id="vllm-path"),
        pytest.param(lambda t: t.replace("glibc=-", "glibc=2." + HUGE, 1), 1, id="facts-glibc-huge"),
        pytest.param(lambda t: t.replace("aiohttp-cors==0.8.1", f"aiohttp-cors=={HUGE}!1", 1), 1, id="version-huge"),
    ],
)
def test_diff_of_a_hand_edited_lock_never_crashes(tmp_path, edit, code):
    (tmp_path / "old.lock").write_text(LOCK)
    (tmp_path / "new.lock").write_text(edit(LOCK))
    for args in (["old.lock", "new.lock"], ["new.lock", "old.lock", "--json"]):
        r = cli(["diff", *args], cwd=tmp_path, timeout=120)
        assert r.returncode == code, r.stderr
        assert "Traceback" not in r.stderr


# ---------------------------------------------------------------- properties
_VALUES = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40),
    st.text(max_size=12),
    st.sampled_from(["²", "٣.0", "2." + HUGE[:300], "\ud800", "", "v1:AAAA", 1e308]),
    st.lists(st.integers(min_value=-5, max_value=2000), max_size=4),
    st.none(),
    st.booleans(),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
_FIELDS = st.sampled_from(
    [
        "cuda_sass",
        "cuda_ptx",
        "cuda_runtime",
        "torch_exports",
        "glibc",
        "python_abi",
        "extensions",
        "numpy_abi",
        "native_sha256",
        "binary",
    ]
)
_TOP = st.sampled_from(["cuda", "glibc", "os", "lacks", "uv_overrides", "consistency", "platform"])


@examples(60)
@given(torch_fields=st.dictionaries(_FIELDS, _VALUES, max_size=3), top=st.dictionaries(_TOP, _VALUES, max_size=2))
def test_any_manifest_fields_are_read_or_refused(torch_fields, top):
    doc = _manifest(**torch_fields)
    doc.update(top)
    try:
        m = parse_manifest(json.dumps(doc), "m.json")
    except BadInput:
        return
    torch = m.get("torch")
    # what was read is of the grammar the readers rely on
    assert m.cuda is None or re.fullmatch(r"[0-9]{1,4}\.[0-9]{1,4}", m.cuda)
    assert torch.facts.glibc is None or re.fullmatch(r"[0-9.]{3,14}", torch.facts.glibc)
    assert torch.facts.cuda_runtime is None or 1 <= torch.facts.cuda_runtime <= 999
    assert all(10 <= a < 1000 for a in torch.facts.cuda_sass + torch.facts.cuda_ptx)


@examples(60)
@given(
    key=st.sampled_from(["vllm", "platform", "python", "entries", "base-digest"]),
    value=st.one_of(st.text(max_size=20), st.sampled_from([HUGE, "٠.1", "-", "²"])),
    facts=st.sampled_from(["glibc=", "extensions=", "numpy-abi=", "python-abi=", "base="]),
    fact=st.one_of(
        st.text(alphabet=st.characters(blacklist_categories=("Cc", "Zs", "Zl", "Zp")), max_size=8), st.just(HUGE)
    ),
)
def test_any_lock_header_or_facts_value_is_read_or_refused(key, value, facts, fact):
    value = value.replace("\n", " ").replace("\r", " ")
    text = re.sub(rf"^# {key}: .*$", lambda _: f"# {key}: {value}", LOCK, count=1, flags=re.M)
    text = re.sub(rf"{facts}\S*", lambda _: f"{facts}{fact}", text, count=1)
    for strict in (True, False):
        try:
            parse_lock(text, "x.lock", strict=strict)
        except BadInput:
            pass


# ---------------------------------------------------------------- the target GPU
@pytest.mark.parametrize("model", ["", "sm_00", "0.0", "\u0661\u0660\u0660", "sm_\u00b2"])
def test_plan_gpu_model_that_names_no_gpu_is_exit_2(tmp_path, model):
    (tmp_path / "build-image.toml").write_text('vllm = "0.34.0"\n')
    args = ["plan", "--model", MODEL, "--gpu-model", model, "--gpu-memory", "h200", "--weights-bytes", "10GB"]
    r = cli(args, cwd=tmp_path, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "--gpu-model" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("model", ["sm_90", "9.0", "NVIDIA H200 (80GB)", "H" * 70])
def test_gpu_node_affinity_needs_a_product_label_value(model):
    from builder.serving import gpus

    with pytest.raises(BadInput, match="product name"):
        gpus.product_label(model)
    assert gpus.product_label("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"


# ---------------------------------------------------------------- a hand-edited recipes file
_SCHEMA = 'schema = "build-image/base-recipes/v2"\n'


@pytest.mark.parametrize(
    ("table", "match"),
    [
        pytest.param('[release."x"]\nplatform = "x86_64-manylinux_2_39"\n', "release name 'x'", id="release-name"),
        pytest.param(f'[release."{HUGE}"]\nplatform = "x86_64-manylinux_2_39"\n', "release name", id="release-huge"),
        pytest.param(
            '[release."0.34.0"]\nplatform = "x86_64-manylinux_2_39"\nsdist_sha256 = 5\n', "sdist_sha256", id="sha-int"
        ),
        pytest.param('[release."0.34.0"]\nplatform = 5\n', "'platform' must be a string", id="platform-int"),
    ],
)
def test_a_recipes_table_off_its_grammar_is_bad_input(table, match):
    from builder.resolve.recipe.table import parse_recipes

    with pytest.raises(BadInput, match=match):
        parse_recipes(_SCHEMA + table, "r.toml")


def test_load_recipes_reads_a_fifo_through_the_bounded_reader(tmp_path):
    import os

    from builder.resolve.reconstruct import load_recipes

    os.mkfifo(tmp_path / "r.toml")
    with pytest.raises(BadInput, match="FIFO"):
        load_recipes(tmp_path / "r.toml")


@pytest.mark.parametrize("kind", ["fifo", "dir"])
def test_render_lock_that_is_no_file_is_exit_2_without_waiting(tmp_path, kind):
    import os

    target = tmp_path / "l.lock"
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    r = cli(["render", "--vllm", "0.34.0", "--lock", str(target), "-o", str(tmp_path / "ctx")], timeout=60)
    assert r.returncode == 2, r.stderr
    assert "not a regular file" in r.stderr and not (tmp_path / "ctx").exists()


# ---------------------------------------------------------------- the index from the environment
@pytest.mark.parametrize("value", ["http://[bad", "notaurl", "ftp://x/simple", "http://x y/simple"])
@pytest.mark.parametrize("var", ["UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"])
def test_an_index_variable_that_is_no_url_is_bad_input_naming_it(monkeypatch, var, value):
    from builder.resolve import index

    for other in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(var, value)
    with pytest.raises(BadInput, match=f"environment variable {var}"):
        index.index_url()
    monkeypatch.setenv(var, "https://mirror.example/simple/")
    assert index.index_url() == "https://mirror.example/simple"


# ---------------------------------------------------------------- a hand-edited pylock twin
PYLOCK = (ROOT / "lockfiles/vllm-0.34.0/pylock.toml").read_text()
_FACTS = 'numpy-abi = [\n    0,\n    0,\n]'


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (_FACTS, "numpy-abi = [1e999, 0]"),  # int(inf): OverflowError
        (_FACTS, "numpy-abi = [1.5, 0]"),  # a count rounded
        ("extensions = 0", "extensions = inf"),
        ('glibc = ""', "glibc = 5"),
        ('glibc = ""', f'glibc = "2.{HUGE}"'),
        ('python-abi = "none"', 'python-abi = "cp3 12"'),
    ],
)
def test_a_pylock_facts_table_off_its_types_is_bad_input(old, new):
    assert old in PYLOCK
    with pytest.raises(BadInput, match=r"packages\[0\] \(aiohttp-cors\)"):
        parse_lock(PYLOCK.replace(old, new, 1), "x/pylock.toml")


def test_a_pylock_facts_value_that_is_no_table_is_bad_input():
    text = PYLOCK.replace("[packages.tool.build-image.facts]\n", "[packages.tool.build-image.other]\n", 1)
    text = text.replace('via = [\n    "ray",\n]', 'via = [\n    "ray",\n]\nfacts = "x"', 1)
    with pytest.raises(BadInput, match="malformed"):
        parse_lock(text, "x/pylock.toml")


# ---------------------------------------------------------------- serving numbers given as flags
@pytest.mark.parametrize(
    ("flag", "value"),
    [("--cpu-offload-gb", "1e308"), ("--reserve-gib", "1e308"), ("--tp", "5000"), ("--max-num-seqs", "0")],
)
def test_plan_serving_number_flags_meet_the_spec_s_bounds(tmp_path, flag, value):
    (tmp_path / "build-image.toml").write_text('vllm = "0.34.0"\n')
    args = ["plan", "--model", MODEL, "--gpu-memory", "h200", "--weights-bytes", "10GB", flag, value]
    r = cli(args, cwd=tmp_path, timeout=120)
    assert r.returncode == 2, r.stderr
    assert flag in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------- smoke's counts, port and seconds
@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--timeout", "1e308"),  # socket.settimeout(1e308): OverflowError on the first request
        ("--boot-timeout", "1e308"),
        ("--port", "99999"),
        ("--port", "-1"),
        ("--prompt-tokens", str(10**17)),  # the prompt is built in memory
        ("--rounds", str(10**20)),
        ("--cpu-offload-gb", "1e308"),
    ],
)
def test_smoke_numbers_out_of_range_are_exit_2_before_anything_starts(flag, value):
    model = str(ROOT / "tests/data/plan/mla")
    args = ["smoke", "--local", "--vllm-bin", "/bin/false", "--model", model, "--no-plan", "--skip-checkpoint-check"]
    r = cli([*args, flag, value], timeout=120)
    assert r.returncode == 2, r.stderr
    assert flag in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"timeout": float("nan")}, "--timeout"), ({"timeout": 1e308}, "--timeout"), ({"workers": 10**11}, "--workers")],
)
def test_ray_check_bounds_its_workers_and_seconds_before_the_engine(kw, match):
    from builder.serving import raycheck

    class NoEngine:
        def ping(self):
            raise AssertionError("the engine is asked only after the flags are checked")

    with pytest.raises(BadInput, match=match):
        raycheck.run_check("img:1", engine=NoEngine(), **kw)


# ---------------------------------------------------------------- what the scanner writes, the reader reads
@pytest.mark.parametrize("arch", [0, 9, 1000, 2**32 - 1])
def test_a_fatbin_entry_for_no_gpu_is_refused_by_the_scanner_as_by_the_reader(arch):
    from builder.resolve import fatbin
    from tests.test_gpus import container, entry

    with pytest.raises(BadInput, match=f"architecture {arch}"):
        fatbin.parse_fatbin(container(entry(fatbin.KIND_ELF, arch)), "x.so")
    doc = _manifest(cuda_sass=[arch])
    with pytest.raises(BadInput, match="cuda_sass"):
        parse_manifest(json.dumps(doc), "m.json")


@pytest.mark.parametrize(
    ("needed", "runtime"),
    [
        ("libcudart.so.13", 13),
        ("libcudart.faf08d9a.so.12.4", 12),
        ("libcudart.so." + HUGE, None),
        ("libcudart.so.0", None),
    ],
)
def test_the_cuda_runtime_a_scan_records_is_one_the_manifest_reads(needed, runtime):
    from builder.resolve import fatbin

    m = fatbin._CUDART.match(needed)
    assert (int(m.group(1)) if m else None) == runtime


@pytest.mark.parametrize(("name", "kept"), [("GLIBC_2.17", True), ("GLIBC_2.2.5", True), (f"GLIBC_2.{HUGE}", False)])
def test_a_glibc_version_name_outside_the_manifest_grammar_is_not_recorded(name, kept):
    from builder.resolve.scanner import GLIBC_VER

    assert bool(GLIBC_VER.match(name)) is kept


# ---------------------------------------------------------------- a release given on the command line
@pytest.mark.parametrize(
    "args",
    [
        ["upgrade", "--to", HUGE, "-o", "up"],  # Version(): a ValueError that is not InvalidVersion
        ["plan", "--vllm", "1." + HUGE[:4000], "--model", MODEL, "--weights-bytes", "1GB", "--gpu-memory", "h200"],
        ["plan", "--vllm", "../../x", "--model", MODEL, "--weights-bytes", "1GB", "--gpu-memory", "h200"],
    ],
    ids=["upgrade-to-huge", "plan-vllm-file-name-too-long", "plan-vllm-path"],
)
def test_a_release_that_is_no_version_is_exit_2(tmp_path, args):
    r = cli(args, cwd=tmp_path, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and ("version" in r.stderr or "release" in r.stderr)


def test_a_cache_path_the_file_system_refuses_is_no_crash(tmp_path):
    lock = str(ROOT / "lockfiles/vllm-0.34.0/requirements.lock")
    r = cli(["diff", lock, lock], env={"BUILD_IMAGE_CACHE": str(tmp_path / ("a" * 5000))}, timeout=120)
    assert r.returncode == 0, r.stderr  # diff needs no cache: its scratch goes to the temp dir
    from builder.scratch import scratch_home

    assert scratch_home(tmp_path / ("a" * 5000)) != tmp_path / ("a" * 5000)


# ---------------------------------------------------------------- a path the file system cannot name
@pytest.mark.parametrize(
    "args",
    [
        ["plan", "--spec", "LONG", "--model", MODEL],
        ["plan", "--model", "LONG"],
        ["lock", "--vllm", "0.34.0", "-o", "LONG"],
        ["render", "--vllm", "0.34.0", "-o", "LONG"],
        ["patch", "check", "--vllm", "0.34.0", "--series", "LONG"],
        ["lock", "--vllm", "0.34.0", "-o", "LOOP"],
    ],
    ids=["spec", "model", "lock-o", "render-o", "series", "lock-o-loop"],
)
def test_a_path_too_long_or_looping_is_exit_2_naming_it(tmp_path, args):
    import os

    os.symlink(tmp_path / "loop-b", tmp_path / "loop-a")
    os.symlink(tmp_path / "loop-a", tmp_path / "loop-b")
    subst = {"LONG": "a" * 5000, "LOOP": str(tmp_path / "loop-a")}
    r = cli([subst.get(a, a) for a in args], cwd=tmp_path, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and ("ENAMETOOLONG" in r.stderr or "ELOOP" in r.stderr)
