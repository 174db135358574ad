"""Property-based fuzzing of every input surface (docs/testing.md, "Fuzzing"; docs/faults.md).

For generated hostile values (line breaks, escape sequences, shell and Dockerfile syntax, ``..``, huge and
non-finite numbers, deep documents, credentials) each surface must give exit 0 with valid output, or exit 2
(or its documented code) with a one-paragraph message: never exit 70, never a traceback, never the secret,
never a changed user file, never a hang (the CLI runs in this process; a hang fails the CI job's timeout).

Profiles (tests/conftest.py): ``ci`` (the default) runs a bounded number of examples with a fixed seed
(``derandomize``): the same cases on every run, the whole file in well under a minute on 2 cores;
``BUILD_IMAGE_FUZZ=nightly`` runs :data:`NIGHTLY_SCALE` times as many, randomly seeded.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings  # the test extra: missing, this file fails (never skipped)
from hypothesis import strategies as st

from builder import credentials, values
from builder.cli import main
from builder.errors import BadInput
from tests.faults.conftest import tiny_context

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: how many more examples the nightly profile runs than CI
NIGHTLY_SCALE = 10
SCALE = NIGHTLY_SCALE if os.environ.get("BUILD_IMAGE_FUZZ") == "nightly" else 1
SECRET = "Fz-s3cret-PW-81"


def examples(n: int):
    """``settings`` for a property: ``n`` examples in CI, ``n * NIGHTLY_SCALE`` nightly (the profile's seed rule
    and health checks kept)."""
    return settings(
        max_examples=n * SCALE,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
    )


# ---------------------------------------------------------------- strategies
#: fragments a hostile user types: line breaks, escapes, shell and Dockerfile syntax, paths, credentials
FRAGMENTS = [
    "\n",
    "\r\n",
    "\r",
    "\x1b[2J",
    "\x1b]0;t\x07",
    "\x00",
    "\t",
    "\x7f",
    "\u2028",
    "\x85",
    "$(id)",
    "`id`",
    "${HOME}",
    ";rm -rf /",
    "'",
    '"',
    "\\",
    "../..",
    "/",
    " ",
    "@",
    ":",
    "#",
    "==",
    "--index-url http://e/",
    "\nRUN touch /pwned",
    "\n--extra-index-url http://evil/",
    "{{ x }}",
    "%0a",
    "sha256:",
    "pvc:",
    f"https://ci-bot:{SECRET}@h.example/x",
    "é",
    "\U0001f600",
    "A" * 300,
    "1e400",
    "nan",
    "-1",
    "0",
]
hostile_text = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=6)), max_size=5).map("".join)
json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    hostile_text,
)
json_value = st.recursive(
    json_scalar,
    lambda kids: st.one_of(st.lists(kids, max_size=3), st.dictionaries(hostile_text, kids, max_size=3)),
    max_leaves=6,
)


def _no_bug(out: str, code: int, allowed: tuple[int, ...]) -> None:
    assert code in allowed, (code, out[-3000:])
    assert code != 70 and "Traceback" not in out and "internal error" not in out, out[-3000:]
    assert SECRET not in out, "the secret reached the terminal"
    assert "\x1b" not in out and "\x07" not in out, "a raw escape sequence reached the terminal"
    if code == 2 and "bad input:" in out:  # one paragraph: the message, its hint and details, no blank line
        err = out[out.index("bad input:") :]
        assert "\n\n" not in err.strip(), err
    elif code == 2:  # click's usage error (a flag's type or choice): its own documented form
        assert "Error: " in out and "Usage: " in out, out


def invoke(*args: str, allowed: tuple[int, ...] = (0, 2), env: dict | None = None) -> tuple[int, str, str]:
    """(exit code, stdout and stderr interleaved, stdout alone)."""
    r = CliRunner().invoke(main, list(args), env=env)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    _no_bug(r.output, r.exit_code, allowed)
    return r.exit_code, r.output, r.stdout


@contextlib.contextmanager
def bounded(seconds: float):
    """Fail the example (never hang the suite) when its body runs longer than ``seconds`` (SIGALRM)."""

    def expire(signum, frame):
        raise TimeoutError(f"no answer within {seconds} s: a hang")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def strict_json(text: str):
    def refuse(name: str):
        raise AssertionError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _digest(paths) -> dict[str, bytes]:
    return {str(p): Path(p).read_bytes() for p in paths}


def _dockerfile_shape(text: str) -> list[str]:
    """The instruction keywords of a Dockerfile, in order (a value that adds a line adds one)."""
    return [
        ln.split()[0]
        for ln in text.splitlines()
        if ln and not ln[0].isspace() and not ln.startswith("#") and re.match(r"[A-Z]+\b", ln)
    ]


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    """A tiny rendered context and its inputs (base.json, requirements.lock): read-only for the properties."""
    d = tmp_path_factory.mktemp("fuzz")
    out, plan = tiny_context(d)
    return d, out, plan


# ---------------------------------------------------------------- CLI values
KNOWN_REPOS = ["127.0.0.1:5000/f/vllm", "reg.example/a/b", "localhost/x"]


@given(
    tag=st.one_of(
        st.sampled_from(KNOWN_REPOS),
        hostile_text,
        st.sampled_from(KNOWN_REPOS).flatmap(lambda r: hostile_text.map(lambda t: r + t)),
    ),
    vllm=st.one_of(st.just("0.26.0"), hostile_text),
)
@examples(100)
def test_fuzz_render_flags(ctx, tag, vllm):
    d, _out, _plan = ctx
    inputs = _digest([d / "base.json", d / "requirements.lock"])
    out = Path(tempfile.mkdtemp(dir=d)) / "ctx"
    code, text, _ = invoke(
        "render",
        "--vllm",
        vllm,
        "--base",
        str(d / "base.json"),
        "--lock",
        str(d / "requirements.lock"),
        "--no-patches",
        "--tag",
        tag,
        "-o",
        str(out),
    )
    assert _digest(inputs) == inputs  # never a changed input
    if code == 0:
        dockerfile = (out / "Dockerfile").read_text()
        assert _dockerfile_shape(dockerfile) == _dockerfile_shape((d / "ctx" / "Dockerfile").read_text())
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", dockerfile)
    else:
        assert not out.exists()
    shutil.rmtree(out.parent, ignore_errors=True)


#: a model the planner reads (28 layers x 8 KV heads x head_dim 128, about 600 GB of weights on 8 GPUs)
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 28,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 1000000,
    "torch_dtype": "bfloat16",
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("model")
    (d / "config.json").write_text(json.dumps(MODEL_CONFIG))
    return d


plan_flag = st.sampled_from(
    [
        "--pull-bandwidth",
        "--image-size",
        "--weights-bytes",
        "--max-model-len",
        "--gpus",
        "--tp",
        "--kv-cache-dtype",
        "--load-format",
        "--max-num-seqs",
    ]
)
number_text = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.tuples(
        st.floats(min_value=1e-320, max_value=1e300), st.sampled_from(["b/s", "GB/s", "Gbit/s", "GB", "GiB", "B", ""])
    ).map(lambda t: f"{t[0]!r}{t[1]}"),
    hostile_text,
)


@given(flags=st.lists(st.tuples(plan_flag, number_text), min_size=1, max_size=3))
@examples(150)
def test_fuzz_plan_flags(model_dir, flags):
    args = [x for pair in flags for x in pair]
    code, _out, stdout = invoke(
        "plan",
        "--model",
        str(model_dir),
        "--gpu-memory",
        "h200",
        "--json",
        "--weights-bytes",
        "600GB",
        "--gpus",
        "8",
        "--tp",
        "8",
        *args,
        allowed=(0, 1, 2),
    )
    if code in (0, 1):
        strict_json(stdout)  # every JSON the tool prints is JSON: no NaN, no Infinity


CONFIG_FIELDS = [
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "torch_dtype",
    "intermediate_size",
    "quantization_config",
    "architectures",
    "model_type",
    "text_config",
]


@given(edits=st.dictionaries(st.sampled_from(CONFIG_FIELDS), json_value, min_size=1, max_size=3))
@examples(100)
def test_fuzz_plan_config(tmp_path_factory, edits):
    cfg = {**MODEL_CONFIG, **edits}
    d = tmp_path_factory.mktemp("cfg")
    (d / "config.json").write_text(json.dumps(cfg))
    code, _out, stdout = invoke(
        "plan",
        "--model",
        str(d),
        "--gpu-memory",
        "h200",
        "--json",
        "--weights-bytes",
        "600GB",
        "--gpus",
        "8",
        "--tp",
        "8",
        allowed=(0, 1, 2),
    )
    if code in (0, 1):
        strict_json(stdout)
    shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------- spec and KubeRay serving values
SERVING_KEYS = {
    "model": hostile_text,
    "kv_cache_dtype": st.one_of(st.sampled_from(["auto", "fp8", "fp9"]), hostile_text),
    "compile_cache": st.one_of(st.sampled_from(["node", "none", "pvc:c", "pvc:c\n"]), hostile_text),
    "model_cache": hostile_text,
    "load_format": hostile_text,
    "tp": st.integers(-3, 10**6),
    "gpus": st.integers(-3, 10**6),
    "gpu_memory_utilization": st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300),
    "max_model_len": st.integers(-(2**63), 2**63 - 1),
}


@given(
    serving=st.fixed_dictionaries({}, optional=SERVING_KEYS),
    repo=st.one_of(st.none(), hostile_text),
    vllm=st.one_of(st.just("0.26.0"), hostile_text),
)
@examples(200)
def test_fuzz_spec_and_kuberay_values(serving, repo, vllm):
    import tomli_w

    from builder.serving import kuberay
    from builder.spec import parse_spec
    from tests.test_kuberay import make_lock

    doc = {"vllm": vllm, "serving": {"model": "/models/q", "gpus": 8, "tp": 8, **serving}}
    if repo is not None:
        doc["repo"] = repo
    try:
        spec = parse_spec(tomli_w.dumps(doc), "spec.toml")
        config = kuberay.serve_config(spec, make_lock())
    except BadInput as exc:
        _no_bug(exc.render(), 2, (2,))
        return
    text = json.dumps(config)
    assert not re.search(r"[\x00-\x1f\x7f\u2028\u2029]", json.loads(json.dumps(text)))  # no raw control char


# ---------------------------------------------------------------- manifest fields
MANIFEST_PATHS = [
    ("image", "ref"),
    ("image", "digest"),
    ("os",),
    ("glibc",),
    ("python", "version"),
    ("python", "site_packages"),
    ("platform",),
    ("cuda",),
    ("provenance", "method"),
    ("distributions", "numpy", "name"),
    ("distributions", "numpy", "version"),
    ("distributions", "numpy", "extensions"),
    ("distributions", "numpy", "glibc"),
    ("uv_overrides",),
    ("lacks",),
    ("consistency",),
]


@given(edits=st.lists(st.tuples(st.sampled_from(MANIFEST_PATHS), json_value), min_size=1, max_size=3))
@examples(200)
def test_fuzz_manifest_fields(ctx, edits):
    from builder.image.render import render_dockerfile
    from builder.resolve.manifest import parse_manifest

    d, out, plan = ctx
    doc = json.loads((d / "base.json").read_text())
    for path, value in edits:
        node = doc
        for k in path[:-1]:
            node = node.setdefault(k, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node[path[-1]] = value
    try:
        base = parse_manifest(json.dumps(doc), "base.json")
    except BadInput as exc:
        _no_bug(exc.render(), 2, (2,))
        return
    except (ValueError, TypeError) as exc:  # json.dumps of a float key etc.: not the tool's
        pytest.fail(f"parse_manifest raised {exc!r}")
    import dataclasses

    try:
        text = render_dockerfile(dataclasses.replace(plan, base=base))
    except BadInput as exc:
        _no_bug(exc.render(), 2, (2,))
        return
    assert _dockerfile_shape(text) == _dockerfile_shape((out / "Dockerfile").read_text())
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", text)


# ---------------------------------------------------------------- lock and pylock files
_LOCK_LINE = re.compile(r"(#.*|[A-Za-z0-9._-]+==\S+( \\)?|    --hash=sha256:[0-9a-f]{64}( \\)?|    # .*|)")


def _only_pins(text: str) -> None:
    """A lock text holds comments, pins and hashes only: no option line, no control character."""
    for line in text.split("\n"):
        assert _LOCK_LINE.fullmatch(line), line
        assert not re.search(r"[\x00-\x1f\x7f]", line), line


@given(inserts=st.lists(st.tuples(st.integers(0, 60), hostile_text), min_size=1, max_size=3), strict=st.booleans())
@examples(200)
def test_fuzz_lock_text(ctx, inserts, strict):
    from builder.resolve.lockfile import parse_lock

    d, _out, _plan = ctx
    lines = (d / "requirements.lock").read_text().split("\n")
    for pos, text in inserts:
        lines.insert(min(pos, len(lines)), text)
    try:
        lock = parse_lock("\n".join(lines), "requirements.lock", strict=strict)
    except BadInput as exc:
        _no_bug(exc.render(), 2, (2,))
        return
    try:
        _only_pins(lock.format())
    except BadInput as exc:  # the writer's own guard refused a value: said so, nothing written
        _no_bug(exc.render(), 2, (2,))


PYLOCK_FIELDS = [
    ("tool", "via"),
    ("tool", "name"),
    ("tool", "base-version"),
    ("header", "tool"),
    ("header", "vllm"),
    ("header", "new-key"),
    ("overlay",),
    ("allow",),
    ("url",),
    ("version",),
]


@given(edits=st.lists(st.tuples(st.sampled_from(PYLOCK_FIELDS), hostile_text), min_size=1, max_size=3))
@examples(200)
def test_fuzz_pylock_values(ctx, edits):
    import tomli_w

    from builder.resolve.lockfile import format_pylock, parse_pylock_lock

    _d, _out, plan = ctx
    doc = tomllib.loads(format_pylock(plan.lock))
    tool, pkg = doc["tool"]["build-image"], doc["packages"][0]
    for where, text in edits:
        if where[0] == "tool":
            pkg["tool"]["build-image"][where[1]] = [text] if where[1] == "via" else text
        elif where[0] == "header":
            tool["header"][where[1]] = text
        elif where == ("overlay",):
            tool["overlay"] = [text]
        elif where == ("allow",):
            tool["allow-abi-change"] = {text or "x": text}
        elif where == ("url",):
            pkg["wheels"][0]["url"] = text
        else:
            pkg["version"] = text
    try:
        lock = parse_pylock_lock(tomli_w.dumps(doc), "pylock.toml")
        _only_pins(lock.format())
    except BadInput as exc:
        _no_bug(exc.render(), 2, (2,))


# ---------------------------------------------------------------- site-packages trees
safe_dir = st.text(alphabet="abcdefghij_-.0123456789", min_size=1, max_size=10).filter(lambda s: s not in (".", ".."))
record_line = st.one_of(
    st.sampled_from(
        [
            "../outside/evil.so,,",
            "/etc/passwd,,",
            "../../../../outside/evil.so,,",
            "pkg/mod.so,,",
            '"a,b.so",,',
            "x" * 5000 + ",,",
            '"unterminated,,',
        ]
    ),
    hostile_text,
)


@given(
    dists=st.lists(
        st.tuples(
            safe_dir,
            st.one_of(st.sampled_from(["pkg", "good-name"]), hostile_text),
            st.one_of(st.sampled_from(["1.0", "2.0rc1"]), hostile_text),
            st.lists(record_line, max_size=4),
        ),
        min_size=1,
        max_size=3,
    )
)
@examples(150)
def test_fuzz_site_packages(tmp_path_factory, dists):
    from builder import events
    from builder.resolve.scanner import scan_site_packages

    root = tmp_path_factory.mktemp("sp")
    (root / "outside").mkdir()
    (root / "outside" / "evil.so").write_bytes(b"\x7fELF" + b"\0" * 60)  # a binary the scan must never count
    sp = root / "site"
    sp.mkdir()
    for i, (dirname, name, version, record) in enumerate(dists):
        di = sp / f"{dirname}{i}.dist-info"
        di.mkdir()
        (di / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8", errors="surrogateescape"
        )
        (di / "RECORD").write_text("\n".join(record) + "\n", encoding="utf-8", errors="surrogateescape")
    recorder = events.Recorder()
    try:
        found = scan_site_packages(sp, reporter=recorder)
    except BadInput as exc:
        _no_bug(exc.render(), 2, (2,))
        return
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for key, dist in found.items():
        assert not dist.facts.binary  # nothing inside the tree is ELF: the outside binary was never counted
        assert values.DistName(dist.name) == dist.name and values.Version(dist.version) == dist.version


# ---------------------------------------------------------------- recipe sdists and recipes files
@given(
    inserts=st.lists(st.tuples(st.integers(0, 200), hostile_text), min_size=1, max_size=3),
    which=st.sampled_from(["docker/Dockerfile", ".buildkite/release-pipeline.yaml"]),
)
@examples(100)
def test_fuzz_recipe_sdist(inserts, which):
    from builder.resolve import recipe as R
    from tests.fx_sdist import build_files

    files = build_files()
    lines = files[which].split("\n")
    for pos, text in inserts:
        lines.insert(min(pos, len(lines)), text)
    files[which] = "\n".join(lines)
    try:
        with bounded(10):
            rec = R.derive(R.BuildFiles("0.99.0", R.SdistRef("vllm-0.99.0.tar.gz", "0" * 64), files))
    except BadInput as exc:
        _no_bug(exc.render(), 2, (2,))
        return
    R.parse_recipes(R.render_recipes({"0.99.0": R.recipe_table(rec)}), "recipes.toml")  # it writes what it reads


@given(doc=st.dictionaries(st.sampled_from(["schema", "release", "x"]), json_value, max_size=3), schema=st.booleans())
@examples(150)
def test_fuzz_recipes_file(doc, schema):
    import tomli_w

    from builder.resolve.recipe import RECIPES_SCHEMA, parse_recipes

    doc = {k: v for k, v in doc.items() if v is not None}
    if schema:
        doc["schema"] = RECIPES_SCHEMA
    try:
        text = tomli_w.dumps(doc)
    except (TypeError, ValueError):  # not a TOML document (a float key, None): nothing to read
        return
    try:
        parse_recipes(text, "recipes.toml")
    except BadInput as exc:
        _no_bug(exc.render(), 2, (2,))


# ---------------------------------------------------------------- credentials and typed values
#: what RFC 3986 allows unencoded in userinfo (quotes and brackets left out: a URL in a message is quoted)
userinfo_char = st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~!$&()*+,;=%")


@given(
    user=st.text(userinfo_char, min_size=1, max_size=8).filter(lambda s: ":" not in s),
    password=st.text(userinfo_char, min_size=6, max_size=16),
    port=st.one_of(st.none(), st.integers(1, 65535).map(str), hostile_text.filter(lambda s: "@" not in s)),
    scheme=st.sampled_from(["http", "https"]),
    around=hostile_text,
)
@examples(300)
def test_fuzz_credentials_are_never_printed(user, password, port, scheme, around):
    url = f"{scheme}://{user}:{password}@idx.example{':' + port if port else ''}/simple"
    bare, cred = credentials.split_userinfo(url)  # never raises, whatever the port
    assert cred is None or password not in bare or password in f"idx.example{port or ''}/simple"
    redacted = credentials.redact_text(f"{around} {url} {around}")
    assert f"{user}:{password}@" not in redacted
    try:
        values.Url(url, "--index-url")
    except BadInput as exc:
        assert password not in exc.render() or password in f"idx.example{port or ''}/simple" + around


@given(text=st.one_of(hostile_text, st.text(max_size=40)))
@examples(300)
def test_fuzz_typed_values(text):
    for cls in (
        values.ImageRef,
        values.Digest,
        values.Registry,
        values.Repository,
        values.DistName,
        values.Version,
        values.Url,
        values.PathText,
        values.Line,
    ):
        try:
            v = cls(text, "field")
        except BadInput as exc:
            assert "field" in exc.message
            continue
        assert not re.search(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]", v) and v == text
