"""Slow: the vllm 0.26.0 series against the real wheel, and the patched code run as vLLM's own code.

The wheel (303 MB) is fetched once through builder.fetch (sha256-pinned by the series'
wheel.sha256, cached under the build-image cache).  A CPU environment is built once
per cache (uv venv with torch 2.13.0 CPU + transformers 5.14.1 and the few modules
vLLM's config and gemma4 loader import); the wheel's ``vllm/`` package (without its
CUDA .so files) is extracted twice: as shipped, and patched in place by
``apply_site_packages``.  Probes then import ``vllm.transformers_utils.config`` and
``vllm.model_executor.models.gemma4`` from each tree and report what vLLM's own code did.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from builder.errors import PatchFailed
from builder.patching import series as P
from builder.util import cache_dir, sha256_file
from tests.fx_cache import cache_lock, real_vllm_wheel

# one worker under pytest-xdist: the session fixtures (the CPU environment and its trees) are made once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm-cpu-env")]

VLLM = "0.26.0"
ROOT = Path(__file__).resolve().parent.parent
UV = str(Path(sys.executable).parent / "uv")
# what vllm.transformers_utils.config and vllm.model_executor.models.gemma4 import on a CPU box
ENV_REQS = (
    "torch==2.13.0",
    "transformers==5.14.1",
    "psutil==7.2.2",
    "pyzmq==27.3.0",
    "cbor2==6.3.0",
    "aiohttp==3.14.5",
    "requests==2.34.2",
    "openai-harmony==0.0.8",
    "openai==3.57.0",
    "einops==0.8.2",
    "pillow==13.0.0",
    "pybase64==1.5.1",
    "cachetools==8.0.2",
    "msgspec==0.23.0",
    "cloudpickle==3.1.3",
    "uvloop==0.23.0",
    "py-cpuinfo==9.0.0",
)


@pytest.fixture(scope="session")
def series() -> P.Series:
    return P.load_series(P.series_dir_for(VLLM), VLLM)


@pytest.fixture(scope="session")
def real_wheel(series) -> Path:
    return real_vllm_wheel(VLLM, series.wheel_sha256)


def _find_links() -> list[str]:
    links = [p for p in os.environ.get("PIP_FIND_LINKS", "").split() if p]
    if not links and Path("/opt/wheels").is_dir():
        links = ["/opt/wheels"]  # where this machine keeps torch 2.13.0+cpu
    return [a for link in links for a in ("--find-links", link)]


def _series_key(series: P.Series, wheel: Path) -> str:
    h = hashlib.sha256(sha256_file(wheel).encode())
    for name in ["series", *[p.name for p in series.patches]]:
        h.update((series.dir / name).read_bytes())
    return h.hexdigest()[:16]


@pytest.fixture(scope="session")
def cpu_env(series, real_wheel) -> dict:
    """{"python": venv python, "unpatched": tree, "patched": tree, "seconds": setup time}."""
    t0 = time.monotonic()
    with cache_lock("patch-vllm-env"):  # xdist workers and concurrent runs build it once
        base = cache_dir() / "patch-vllm-env"
        venv_key = hashlib.sha256("\n".join(ENV_REQS).encode()).hexdigest()[:12]
        venv = base / f"venv-{venv_key}"
        python = venv / "bin" / "python"
        if not (venv / ".complete").exists():
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([UV, "venv", "-q", "--python", sys.executable, str(venv)], check=True, timeout=300)
            r = subprocess.run(
                [UV, "pip", "install", "-q", "--python", str(python), *_find_links(), *ENV_REQS],
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert r.returncode == 0, r.stderr[-3000:]
            (venv / ".complete").touch()
        trees = base / f"trees-{_series_key(series, real_wheel)}"
        if not (trees / ".complete").exists():
            shutil.rmtree(trees, ignore_errors=True)
            unpatched = trees / "unpatched"
            with zipfile.ZipFile(real_wheel) as z:
                members = [
                    m
                    for m in z.namelist()
                    if (m.startswith("vllm/") and not m.endswith(".so")) or m.startswith(f"vllm-{VLLM}.dist-info/")
                ]
                z.extractall(unpatched, members)
            # the patched tree shares unchanged files by hard link; apply_site_packages replaces the targets
            shutil.copytree(unpatched, trees / "patched", copy_function=os.link)
            P.apply_site_packages(series, trees / "patched")
            (trees / ".complete").touch()
    return {
        "python": str(python),
        "unpatched": trees / "unpatched",
        "patched": trees / "patched",
        "seconds": round(time.monotonic() - t0, 1),
    }


PROBE = r'''
import json, logging, os, sys, types
scenarios = json.loads(sys.argv[1])
out = {}

class Grab(logging.Handler):
    def __init__(self):
        super().__init__(); self.records = []
    def emit(self, rec):
        if rec.levelno >= logging.WARNING:
            self.records.append(rec.getMessage())

for key, sc in scenarios.items():
    if sc["kind"] == "config":
        from vllm.transformers_utils.config import HFConfigParser
        grab = Grab(); logging.getLogger("vllm.transformers_utils.config").addHandler(grab)
        if sc.get("env") is None:
            os.environ.pop("VLLM_LAYER_TYPE_REWRITES", None)
        else:
            os.environ["VLLM_LAYER_TYPE_REWRITES"] = sc["env"]
        try:
            _, cfg = HFConfigParser().parse(sc["model"], trust_remote_code=False)
            lt = getattr(cfg.get_text_config(), "layer_types", None)
            out[key] = {"layer_types": list(lt) if lt is not None else None,
                        "warnings": [w for w in grab.records if "layer_types" in w]}
        except Exception as e:
            out[key] = {"error": f"{type(e).__name__}: {e}"}
        logging.getLogger("vllm.transformers_utils.config").removeHandler(grab)
    elif sc["kind"] == "ple":
        import torch
        from torch import nn
        import vllm.model_executor.models.gemma4 as g4
        V, L, D = 6, 2, 3
        cfg = types.SimpleNamespace(tie_word_embeddings=False, attention_k_eq_v=False,
                                    layer_types=["full_attention"] * L, num_experts=None,
                                    hidden_size_per_layer_input=D, vocab_size_per_layer_input=V,
                                    vocab_size=V, num_hidden_layers=L)
        class Text(nn.Module):  # the parameter tree Gemma4Model exposes for PLE, loaded by its own load_weights
            load_weights = g4.Gemma4Model.load_weights
            def __init__(self):
                super().__init__(); self.config = cfg
                self.embed_tokens_per_layer = nn.Module()
                self.embed_tokens_per_layer.weight = nn.Parameter(torch.zeros(V, L * D), requires_grad=False)
        class CausalLM(nn.Module):  # loaded by Gemma4ForCausalLM.load_weights (vLLM's own code)
            def __init__(self):
                super().__init__(); self.config = cfg; self.model = Text()
        table = torch.arange(1, V * L * D + 1, dtype=torch.float32).reshape(V, L * D)
        rows = {"whole": [(0, V)], "rows": sc.get("rows")}
        weights = []
        for name, (a, b) in zip(sc["names"], sc.get("rows") or [(0, V)] * len(sc["names"])):
            weights.append((name, table[a:b].clone()))
        m = CausalLM()
        if sc.get("mm"):  # through Gemma4ForConditionalGeneration.load_weights (vLLM's own) and its mapper
            if "torchvision" not in sys.modules:  # only transformers' Gemma4 image processor needs it
                import importlib.machinery
                class _Meta(type):
                    def __getattr__(cls, name):
                        if name.startswith("__"):
                            raise AttributeError(name)
                        return _Meta(name, (), {})
                class _Stub(types.ModuleType):
                    def __getattr__(self, name):
                        if name.startswith("__"):
                            raise AttributeError(name)
                        return _Meta(name, (), {})
                for n in ("torchvision", "torchvision.transforms", "torchvision.transforms.v2",
                          "torchvision.transforms.v2.functional", "torchvision.transforms.functional",
                          "torchvision.io"):
                    stub = _Stub(n); stub.__spec__ = importlib.machinery.ModuleSpec(n, None); stub.__path__ = []
                    sys.modules[n] = stub
            import vllm.model_executor.models.gemma4_mm as g4mm
            class CausalLM2(nn.Module):
                load_weights = g4.Gemma4ForCausalLM.load_weights
                def __init__(self):
                    super().__init__(); self.config = cfg; self.model = Text()
            class MM(nn.Module):
                hf_to_vllm_mapper = g4mm.Gemma4ForConditionalGeneration.hf_to_vllm_mapper
                load_weights = g4mm.Gemma4ForConditionalGeneration.load_weights
                def __init__(self):
                    super().__init__(); self.config = types.SimpleNamespace(text_config=cfg)
                    self.audio_tower = None; self.language_model = CausalLM2()
            mmodel = MM()
            try:
                loaded = mmodel.load_weights(weights)
                w = mmodel.language_model.model.embed_tokens_per_layer.weight
                out[key] = {"loaded": sorted(loaded), "equal": bool(torch.equal(w, table)),
                            "untouched": bool(torch.count_nonzero(w) == 0)}
            except Exception as e:
                out[key] = {"error": f"{type(e).__name__}: {e}"}
            continue
        try:
            loaded = g4.Gemma4ForCausalLM.load_weights(m, weights)
            w = m.model.embed_tokens_per_layer.weight
            out[key] = {"loaded": sorted(loaded), "equal": bool(torch.equal(w, table)),
                        "untouched": bool(torch.count_nonzero(w) == 0)}
        except Exception as e:
            out[key] = {"error": f"{type(e).__name__}: {e}"}
print("PROBE-RESULT " + json.dumps(out))
'''


def probe(env: dict, tree: str, scenarios: dict) -> dict:
    r = subprocess.run(
        [env["python"], "-c", PROBE, json.dumps(scenarios)],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONPATH=str(env[tree]), HF_HUB_OFFLINE="1", VLLM_LOGGING_LEVEL="WARNING"),
    )
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("PROBE-RESULT ")]
    assert r.returncode == 0 and lines, f"probe failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return json.loads(lines[-1][len("PROBE-RESULT ") :])


def _write_config(d: Path, doc: dict) -> str:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(doc))
    return str(d)


QWEN_TYPES = [
    "linear_attention",
    "qwen_sparse_attention",
    "linear_attention",
    "qwen_sparse_attention",
    "linear_attention",
    "linear_attention",
    "linear_attention",
    "qwen_sparse_attention",
]


def _qwen_next(layer_types):
    return {
        "model_type": "qwen3_next",
        "architectures": ["Qwen3NextForCausalLM"],
        "num_hidden_layers": len(layer_types),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 128,
        "layer_types": layer_types,
    }


# ------------------------------------------------------------------ the series against the real wheel
def test_series_applies_cleanly_to_the_real_wheel(series, real_wheel, tmp_path):
    assert sha256_file(real_wheel) == series.wheel_sha256
    assert [r.status for r in P.check(series, real_wheel)] == ["applied"] * len(series.patches)
    done = P.apply_to_dir(series, real_wheel, tmp_path / "ctx")
    assert {f.relpath: f.original_sha256 for f in done} == series.originals
    assert all(f.patched_sha256 == sha256_file(tmp_path / "ctx" / f.relpath) for f in done)


def test_mutated_target_is_refused(series, real_wheel, tmp_path):
    site = tmp_path / "site"
    with zipfile.ZipFile(real_wheel) as z:
        z.extractall(site, series.targets)
    target = site / "vllm/model_executor/models/gemma4.py"
    target.write_text("# a different vllm build\n" + target.read_text())
    before = {rel: (site / rel).read_bytes() for rel in series.targets}
    with pytest.raises(PatchFailed, match="differ from the vllm 0.26.0 wheel's originals") as ei:
        P.apply_site_packages(series, site)
    assert "vllm/model_executor/models/gemma4.py" in ei.value.details
    assert {rel: (site / rel).read_bytes() for rel in series.targets} == before  # nothing changed
    res = {r.name: r for r in P.check(series, site, raise_on_failure=False)}
    assert res["0001-layer-type-rewrites.patch"].status == "applied"
    assert res["0002-ple-empty-shard-names.patch"].status == "does-not-apply"
    assert "offsets are refused" in res["0002-ple-empty-shard-names.patch"].detail


def test_cli_patch_check_real_wheel_json():
    r = subprocess.run(
        [str(Path(sys.executable).parent / "build-image"), "patch", "check", "--vllm", VLLM, "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] and {p["status"] for p in doc["patches"]} == {"applied"}


# ------------------------------------------------------------------ patched code, run as vLLM's code
def test_cpu_env_trees_hold_original_and_patched_targets(cpu_env, series):
    print(f"cpu env ready in {cpu_env['seconds']} s")  # measured: ~13 s cold (empty uv cache), <1 s cached
    for rel, orig in series.originals.items():
        assert sha256_file(cpu_env["unpatched"] / rel) == orig
        assert sha256_file(cpu_env["patched"] / rel) != orig
    # gemma4_mm cannot be imported on this CPU box (transformers' Gemma4Processor needs torchvision,
    # whose PyPI build does not load against torch+cpu): at least it must compile, and it must route
    # every PLE name through gemma4's helper before its WeightsMapper
    src = (cpu_env["patched"] / "vllm/model_executor/models/gemma4_mm.py").read_text()
    compile(src, "gemma4_mm.py", "exec")
    assert "from vllm.model_executor.models.gemma4 import _merge_ple_table" in src
    assert src.index("_merge_ple_table(\n            weights") < src.index(
        "loader.load_weights(weights, mapper=self.hf_to_vllm_mapper)"
    )


def test_layer_type_rewrite_through_vllm_config_parser(cpu_env, tmp_path):
    declared = _write_config(tmp_path / "declared", _qwen_next(QWEN_TYPES))
    plain = _write_config(tmp_path / "plain", _qwen_next(["linear_attention", "full_attention"]))
    nested = _write_config(
        tmp_path / "nested",
        {
            "model_type": "qwen3_5",
            "architectures": ["Qwen3_5ForConditionalGeneration"],
            "text_config": {
                "model_type": "qwen3_5_text",
                "num_hidden_layers": 4,
                "hidden_size": 64,
                "head_dim": 16,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "vocab_size": 128,
                "layer_types": ["linear_attention", "qwen_sparse_attention", "linear_attention", "full_attention"],
            },
        },
    )
    llama = _write_config(
        tmp_path / "llama",
        {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 128,
        },
    )
    scen = {  # one process, in this order: "env_off" first, before any rewrite extends transformers' allowed types
        "env_off": {"kind": "config", "model": declared, "env": "{}"},
        "default": {"kind": "config", "model": declared},
        "env_map": {"kind": "config", "model": declared, "env": '{"qwen_sparse_attention": "sliding_attention"}'},
        "env_bad": {"kind": "config", "model": declared, "env": "{not json"},
        "plain": {"kind": "config", "model": plain},
        "nested": {"kind": "config", "model": nested},
        "env_list": {"kind": "config", "model": declared, "env": '["qwen_sparse_attention"]'},
        "env_nonstr": {"kind": "config", "model": declared, "env": '{"qwen_sparse_attention": 1}'},
        "no_layer_types": {"kind": "config", "model": llama},
    }
    unpatched = probe(cpu_env, "unpatched", {"default": scen["default"], "plain": scen["plain"]})
    # the claim: transformers rejects the declared type while parsing, before any --hf-overrides
    assert "qwen_sparse_attention" in unpatched["default"]["error"] and "ValueError" in unpatched["default"]["error"]
    assert unpatched["plain"]["layer_types"] == ["linear_attention", "full_attention"]

    got = probe(cpu_env, "patched", scen)
    idx = [i for i, t in enumerate(QWEN_TYPES) if t == "qwen_sparse_attention"]
    want = ["full_attention" if i in idx else t for i, t in enumerate(QWEN_TYPES)]
    assert got["default"]["layer_types"] == want
    assert len(got["default"]["warnings"]) == 1  # one warning, naming every index and the mapping
    w = got["default"]["warnings"][0]
    assert str(idx) in w and "'qwen_sparse_attention': 'full_attention'" in w and "not been validated" in w
    assert got["env_map"]["layer_types"] == ["sliding_attention" if i in idx else t for i, t in enumerate(QWEN_TYPES)]
    assert "qwen_sparse_attention" in got["env_off"]["error"]  # "{}" turns the rewrite off: as unpatched
    assert "VLLM_LAYER_TYPE_REWRITES is not valid JSON" in got["env_bad"]["error"]
    assert got["plain"] == {"layer_types": ["linear_attention", "full_attention"], "warnings": []}
    assert got["nested"]["layer_types"] == ["linear_attention", "full_attention", "linear_attention", "full_attention"]
    assert "[1]" in got["nested"]["warnings"][0]
    for key in ("env_list", "env_nonstr"):  # valid JSON but not a str -> str object: named, not a TypeError
        assert got[key]["error"].startswith("ValueError: VLLM_LAYER_TYPE_REWRITES must be a JSON object"), got[key]
    assert got["no_layer_types"] == {"layer_types": None, "warnings": []}  # no layer_types at all: untouched


PLE = "embed_tokens_per_layer"
NAMES = [
    f"model.language_model.{PLE}.shard_.weight",
    f"model.{PLE}.shard_.weight",
    f"{PLE}.shard_.weight",
    f"model.language_model.{PLE}.weight",
    f"model.{PLE}.weight",
    f"{PLE}.weight",
]


def test_ple_table_names_through_vllm_gemma4_loader(cpu_env):
    scen = {n: {"kind": "ple", "names": [n]} for n in NAMES}
    scen["shards"] = {
        "kind": "ple",
        "names": [f"model.language_model.{PLE}.shard_{i}.weight" for i in (2, 0, 1)],
        "rows": [(4, 6), (0, 2), (2, 4)],
    }
    scen["short_shards"] = {
        "kind": "ple",
        "names": [f"{PLE}.shard_{i}.weight" for i in (0, 1)],
        "rows": [(0, 3), (3, 6)],
    }
    scen["missing"] = {
        "kind": "ple",
        "names": [f"model.{PLE}.shard_{i}.weight" for i in (0, 2)],
        "rows": [(0, 3), (3, 6)],
    }
    scen["short_total"] = {
        "kind": "ple",
        "names": [f"model.{PLE}.shard_{i}.weight" for i in (0, 1)],
        "rows": [(0, 2), (2, 4)],
    }
    scen["bad_whole"] = {"kind": "ple", "names": [f"{PLE}.shard_.weight"], "rows": [(0, 5)]}

    before = probe(cpu_env, "unpatched", {k: scen[k] for k in NAMES[:3] + NAMES[5:]})
    # unpatched 0.26.0: the empty-index names are skipped without a word; the table stays as initialised
    for n in NAMES[:2]:
        assert before[n] == {"loaded": [], "equal": False, "untouched": True}, before[n]
    for n in (NAMES[2], NAMES[5]):  # short names: AutoWeightsLoader finds no such module
        assert "There is no module or parameter named 'embed_tokens_per_layer'" in before[n]["error"]

    got = probe(cpu_env, "patched", scen)
    for key in NAMES + ["shards", "short_shards"]:
        assert got[key] == {"loaded": ["model.embed_tokens_per_layer.weight"], "equal": True, "untouched": False}, (
            key,
            got[key],
        )
    assert "shard(s) [1] missing" in got["missing"]["error"]
    assert "has shape (4, 6), expected (6, 6)" in got["short_total"]["error"]
    assert "has shape (5, 6), expected (6, 6)" in got["bad_whole"]["error"]


def test_ple_table_names_through_vllm_gemma4_multimodal_loader(cpu_env):
    """The same names through Gemma4ForConditionalGeneration.load_weights (patched in gemma4_mm.py), whose
    hf_to_vllm_mapper hands the table to the language model's loader; shape checked there."""
    scen = {n: {"kind": "ple", "mm": True, "names": [n]} for n in NAMES}
    scen["shards"] = {
        "kind": "ple",
        "mm": True,
        "names": [f"{PLE}.shard_{i}.weight" for i in (1, 0)],
        "rows": [(3, 6), (0, 3)],
    }
    scen["missing"] = {
        "kind": "ple",
        "mm": True,
        "names": [f"model.{PLE}.shard_{i}.weight" for i in (0, 2)],
        "rows": [(0, 3), (3, 6)],
    }
    scen["bad_whole"] = {"kind": "ple", "mm": True, "names": [f"{PLE}.shard_.weight"], "rows": [(0, 5)]}
    got = probe(cpu_env, "patched", scen)
    for key in NAMES + ["shards"]:
        assert got[key] == {
            "loaded": ["language_model.model.embed_tokens_per_layer.weight"],
            "equal": True,
            "untouched": False,
        }, (key, got[key])
    assert "shard(s) [1] missing" in got["missing"]["error"]
    assert "has shape (5, 6), expected (6, 6)" in got["bad_whole"]["error"]
