"""`plan --vllm X` and `smoke --vllm X`: every shipped release, its facts read from the wheels,
its default lock / image tag / patch series recorded in the smoke report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from builder.cli import main
from builder.errors import BadInput
from builder.resolve.lockfile import load_lock
from builder.serving.plan import RELEASE_FACTS, GiB, make_plan, release_facts
from builder.serving.smoke.release import check_image_release, resolve_release
from builder.spec import default_lock_path, supported_vllm_versions
from builder.util import project_root

ROOT = project_root()
DATA = Path(__file__).parent / "data" / "plan"
FAKE = Path(__file__).parent / "fake_openai_server.py"


def llama() -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 4,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "intermediate_size": 1024,
        "vocab_size": 1000,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
    }


def test_every_shipped_release_has_its_facts():
    """Adding a base manifest without the release's plan facts fails here (and the other way round)."""
    assert list(RELEASE_FACTS) == supported_vllm_versions()
    assert len(RELEASE_FACTS) >= 9


def test_the_plan_records_the_release_and_takes_its_defaults():
    for v in ("0.26.0", "0.33.0"):
        p = make_plan(llama(), weights_bytes=0, gpu_memory_bytes=80 * GiB, max_model_len=4096, vllm=v)
        assert p.vllm == v and p.to_dict()["vllm"] == v
        assert p.gpu_memory_utilization == RELEASE_FACTS[v].default_gpu_memory_utilization == 0.92
    assert make_plan(llama(), weights_bytes=0, gpu_memory_bytes=80 * GiB).vllm == "0.26.0"
    with pytest.raises(BadInput, match=r"vLLM version '0.25.0' is not supported .*known: 0.26.0.*0.33.0"):
        make_plan(llama(), weights_bytes=0, gpu_memory_bytes=80 * GiB, vllm="0.25.0")


def test_a_kv_cache_dtype_is_checked_against_the_releases_cachedtype():
    from builder.serving.plan import check_kv_cache_dtype

    check_kv_cache_dtype("nvfp4_4over6", release_facts("0.28.0"))
    with pytest.raises(BadInput, match=r"'nvfp4_4over6' .*vLLM 0.27.1 does not accept it"):
        check_kv_cache_dtype("nvfp4_4over6", release_facts("0.27.1"))
    check_kv_cache_dtype("octave_k3v4", release_facts("0.33.0"))
    with pytest.raises(BadInput, match="vLLM 0.32.0 does not accept it"):
        check_kv_cache_dtype("octave_k3v4", release_facts("0.32.0"))
    for v in RELEASE_FACTS:  # the planner's own spellings are vLLM's in every release
        for dt in ("auto", "bf16", "fp16", "half", "fp8", "fp8_e4m3", "fp8_e5m2", "nvfp4"):
            check_kv_cache_dtype(dt, release_facts(v))


def test_plan_cli_vllm(tmp_path):
    args = [
        "plan",
        "--model",
        str(DATA / "600gb-on-8-gpus"),
        "--weights-bytes",
        "1GB",
        "--gpu-memory",
        "80GiB",
        "--tp",
        "8",
    ]
    r = CliRunner().invoke(main, args + ["--vllm", "0.33.0", "--json"])
    assert r.exit_code in (0, 1), r.output
    assert json.loads(r.output)["vllm"] == "0.33.0"
    r = CliRunner().invoke(main, args + ["--vllm", "0.33.0"])
    assert "vLLM 0.33.0" in r.output.splitlines()[0]
    bad = CliRunner().invoke(main, args + ["--vllm", "0.35.0"])
    assert bad.exit_code == 2 and "'0.35.0' is not supported" in bad.output and "0.34.0" in bad.output
    assert "build-image upgrade --to 0.35.0 -o ." in bad.output  # the one command that adds it


def test_release_facts_are_read_from_a_wheel_tree(tmp_path):
    """builder/serving/release_facts.py parses the CacheDType literal and the utilization default."""
    from builder.serving.release_facts import facts_from_wheel

    root = tmp_path / "w"
    (root / "vllm" / "config").mkdir(parents=True)
    (root / "vllm" / "config" / "cache.py").write_text(
        "from typing import Literal\nCacheDType = Literal[\n    'auto',\n    'fp8',\n]\n"
        "class CacheConfig:\n    gpu_memory_utilization: float = Field(default=0.85, gt=0, le=1)\n"
    )
    d = facts_from_wheel(root, "9.9.9")
    assert d["default_gpu_memory_utilization"] == 0.85 and d["kv_cache_dtypes"] == ["auto", "fp8"]
    assert "extensible_kv_cache" not in d


def test_the_extensible_kv_cache_rule_of_0_34(tmp_path):
    """From 0.34.0 the field defaults to None; the resolved value is 1.0 with the extensible KV cache."""
    from builder.serving.release_facts import facts_from_sources

    src = (
        "from typing import Literal, ClassVar\nCacheDType = Literal['auto']\nclass CacheConfig:\n"
        "    DEFAULT_GPU_MEMORY_UTILIZATION: ClassVar[float] = 0.92\n"
        "    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)\n"
        "    def resolved_gpu_memory_utilization(self) -> float:\n"
        "        if self.gpu_memory_utilization is not None:\n            return self.gpu_memory_utilization\n"
        "        if self.enable_extensible_kv_cache:\n            return 1.0\n"
        "        return self.DEFAULT_GPU_MEMORY_UTILIZATION\n"
    )
    d = facts_from_sources("9.9.9", src, None, "test")
    assert (
        d["default_gpu_memory_utilization"],
        d["extensible_kv_cache"],
        d["non_extensible_gpu_memory_utilization"],
    ) == (1.0, True, 0.92)
    with pytest.raises(BadInput, match="not the extensible-KV-cache rule"):
        facts_from_sources("9.9.9", src.replace("return 1.0", "return self.x"), None, "test")
    p = make_plan(llama(), weights_bytes=0, gpu_memory_bytes=80 * GiB, max_model_len=4096, vllm="0.34.0")
    assert p.gpu_memory_utilization == 1.0 and any("extensible KV cache" in n for n in p.notes)


def test_each_facts_entry_is_its_wheel_where_the_download_cache_holds_it():
    from builder.serving import release_facts as rf
    from builder.util import cache_dir

    checked = 0
    for v, entry in rf.load().items():
        for w in (cache_dir() / "downloads").glob(f"*/vllm-{v}-*x86_64.whl"):
            got = rf.facts_from_wheel(w, v)
            assert {k: got[k] for k in got if k != "from"} == {k: entry[k] for k in entry if k != "from"}, v
            checked += 1
            break
    if not checked:
        pytest.skip("no vllm wheel in the download cache")


# ---------------------------------------------------------------- smoke --vllm


def test_resolve_release_names_the_default_lock_image_and_series():
    rel = resolve_release("0.26.0")
    lock = load_lock(default_lock_path("0.26.0"))
    assert rel.lock == str(default_lock_path("0.26.0")) and rel.lock_hash == lock.lock_hash
    assert rel.image == f"build-image/vllm-serving:vllm0.26.0-{lock.lock_hash[:12]}"
    assert rel.serve_backend == lock.header["serve-backend"] and rel.ray == lock.header["ray"]
    assert rel.patch_series and Path(rel.patch_series).name == "0.26.0" and rel.patches
    newest = resolve_release("0.33.0")
    assert newest.lock_hash == load_lock(default_lock_path("0.33.0")).lock_hash
    assert newest.image.startswith("build-image/vllm-serving:vllm0.33.0-")
    assert newest.kv_cache_dtypes == RELEASE_FACTS["0.33.0"].kv_cache_dtypes
    with pytest.raises(BadInput, match="not supported"):
        resolve_release("0.25.1")


def test_an_image_of_another_release_is_refused():
    check_image_release({"org.build-image.vllm": "0.26.0"}, "r/x:1", "0.26.0")
    check_image_release({}, "vllm/vllm-openai:v0.27.0", "0.27.0")  # not ours: no label to compare
    with pytest.raises(BadInput, match=r"r/x:1 is a vllm 0.26.0 image .*--vllm 0.33.0 was given"):
        check_image_release({"org.build-image.vllm": "0.26.0"}, "r/x:1", "0.33.0")


def _cli(args):
    return subprocess.run(
        [sys.executable, "-c", "from builder.cli import main; main(prog_name='build-image')", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def _fake_cmd() -> str:
    return f"{sys.executable} {FAKE} --port {{port}}"


def test_smoke_vllm_is_recorded_in_the_report(tmp_path):
    (tmp_path / "m").mkdir()
    r = _cli(
        [
            "smoke",
            "--vllm",
            "0.26.0",
            "--model",
            str(tmp_path / "m"),
            "--server-cmd",
            _fake_cmd(),
            "--rounds",
            "1",
            "--concurrency",
            "2",
            "--max-tokens",
            "4",
            "--no-chat",
            "--json",
        ]
    )
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)["settings"]
    lock = load_lock(default_lock_path("0.26.0"))
    assert s["vllm"] == "0.26.0"
    assert s["release"]["lock_hash"] == lock.lock_hash and s["release"]["patch_series"].endswith("patches/vllm/0.26.0")
    assert s["release"]["serve_backend"] == lock.header["serve-backend"]
    unported = [v for v in supported_vllm_versions() if not (ROOT / "patches" / "vllm" / v / "series").is_file()]
    for v, series_text in [(unported[0], "patch series none shipped")] if unported else []:
        text = _cli(
            [
                "smoke",
                "--vllm",
                v,
                "--model",
                str(tmp_path / "m"),
                "--server-cmd",
                _fake_cmd(),
                "--rounds",
                "1",
                "--concurrency",
                "2",
                "--max-tokens",
                "4",
                "--no-chat",
            ]
        )
        assert text.returncode == 0, text.stderr
        assert f"release: vllm {v}, lock " in text.stdout and series_text in text.stdout


@pytest.mark.parametrize(
    "args, msg",
    [
        (["--vllm", "0.25.0", "--local"], "'0.25.0' is not supported"),
        (["--vllm", "0.27.1", "--local", "--kv-cache-dtype", "nvfp4_4over6"], "vLLM 0.27.1 does not accept it"),
    ],
)
def test_smoke_vllm_bad_input(tmp_path, args, msg):
    (tmp_path / "m").mkdir()
    r = _cli(["smoke", "--model", str(tmp_path / "m"), *args])
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert msg in r.stderr


def test_smoke_vllm_without_image_runs_the_default_locks_tag(tmp_path):
    """No IMAGE and no --local: the default lock's content-addressed tag, refused with the way to build it
    when the engine does not hold it (never pulled)."""
    from tests.fx_docker import DOCKER, missing

    if not DOCKER:
        missing("no docker CLI")
    (tmp_path / "m").mkdir()
    r = _cli(["smoke", "--vllm", "0.33.0", "--model", str(tmp_path / "m")])
    if r.returncode == 8:
        missing("no docker engine")
    tag = resolve_release("0.33.0").image
    assert r.returncode == 2, r.stderr
    assert f"image {tag} is not in the local engine" in r.stderr and "build-image --vllm 0.33.0" in r.stderr


def test_a_release_without_a_series_says_none_shipped(tmp_path, monkeypatch):
    import builder.patching.series as patches
    from builder.serving.smoke.report import render_text  # noqa: F401 - the text is checked through the dict below

    monkeypatch.setattr(patches, "patches_root", lambda: tmp_path)
    rel = resolve_release("0.27.0")
    assert rel.patch_series is None and rel.patches == [] and rel.lock_hash


def test_the_plans_notes_name_the_release_planned():
    cfg = {**llama(), "layer_types": ["full_attention", "qwen_sparse_attention", "full_attention", "full_attention"]}
    for v in ("0.26.0", "0.33.0", "0.34.0"):
        p = make_plan(cfg, weights_bytes=0, gpu_memory_bytes=80 * GiB, max_model_len=4096, vllm=v)
        note = next(n for n in p.notes if "qwen_sparse_attention" in n)
        assert f"not a type vLLM {v} knows" in note
        assert all("vLLM 0.26.0" not in n for n in p.notes) or v == "0.26.0"
