# ruff: noqa: E501  (the vLLM log lines are quoted whole, as captured)
"""Issue 28: the cold-start phases from vLLM's log, the cold-start estimate, --load-format, and the KubeRay
cold-start settings.  The log lines are the ones vLLM 0.26.0 printed on the lent H200 (benchmarks/coldstart-h200/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from builder.cli import main
from builder.errors import BadInput
from builder.serving import coldstart, kuberay
from builder.serving.coldstart import GB, ColdStartInputs, GiB, estimate, parse_rate
from builder.serving.plan import RELEASE_FACTS, check_load_format, release_facts
from builder.serving.smoke import SmokeConfig
from builder.serving.smoke.server import serve_flags
from builder.serving.vllm_log import cold_start_phases, parse_server_log, render_cold_start
from builder.spec import Serving, Spec, parse_spec

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "coldstart-h200"
MODEL_600GB = ROOT / "tests" / "data" / "plan" / "600gb-on-8-gpus"

# st-cold-cc0: an empty compile cache (benchmarks/coldstart-h200/run2/st-cold-cc0.log)
EMPTY_CC = """\
(APIServer pid=2560) INFO 12-02 07:24:56 [api_utils.py:273] non-default args: {'model_tag': '/tmp/ck20', 'host': '127.0.0.1', 'port': 45707, 'model': '/tmp/ck20', 'max_model_len': 2048}
(EngineCore pid=2707) INFO 12-02 07:25:46 [core.py:116] Initializing a V1 LLM engine (v0.26.0) with config: model='/tmp/ck20', speculative_config=None
(EngineCore pid=2707) INFO 12-02 07:26:05 [default_loader.py:430] Loading weights took 14.80 seconds
(EngineCore pid=2707) INFO 12-02 07:26:06 [model_runner.py:305] Model loading took 20.31 GiB and 17.390204 seconds
(EngineCore pid=2707) INFO 12-02 07:26:18 [backends.py:1155] Dynamo bytecode transform time: 11.39 s
(EngineCore pid=2707) INFO 12-02 07:26:35 [backends.py:393] Compiling a graph for compile range (1, 8192) takes 16.70 s
(EngineCore pid=2707) INFO 12-02 07:26:37 [monitor.py:53] torch.compile took 30.15 s in total
(EngineCore pid=2707) INFO 12-02 07:26:46 [model_runner.py:747] Graph capturing finished in 6 secs, took 0.83 GiB
(EngineCore pid=2707) INFO 12-02 07:27:03 [core.py:340] init engine (profile, create kv cache, warmup model) took 56.89 s (compilation: 30.15 s)
(APIServer pid=2560) INFO 12-02 07:27:04 [api_server.py:677] Starting vLLM server on http://127.0.0.1:45707
"""
# st-cold-ccw: the compile cache of the run before (run2/st-cold-ccw.log)
WARM_CC = """\
(APIServer pid=3134) INFO 12-02 07:27:36 [api_utils.py:273] non-default args: {'model_tag': '/tmp/ck20', 'host': '127.0.0.1', 'port': 34579, 'model': '/tmp/ck20', 'max_model_len': 2048}
(EngineCore pid=3214) INFO 12-02 07:28:10 [default_loader.py:430] Loading weights took 13.36 seconds
(EngineCore pid=3214) INFO 12-02 07:28:10 [model_runner.py:305] Model loading took 20.31 GiB and 15.140614 seconds
(EngineCore pid=3214) INFO 12-02 07:28:14 [backends.py:1155] Dynamo bytecode transform time: 3.06 s
(EngineCore pid=3214) INFO 12-02 07:28:16 [backends.py:292] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 2.253 s
(EngineCore pid=3214) INFO 12-02 07:28:16 [monitor.py:53] torch.compile took 5.67 s in total
(EngineCore pid=3214) INFO 12-02 07:28:26 [model_runner.py:747] Graph capturing finished in 7 secs, took 0.83 GiB
(EngineCore pid=3214) INFO 12-02 07:28:27 [core.py:340] init engine (profile, create kv cache, warmup model) took 16.35 s (compilation: 5.67 s)
"""
# rs-cold: the runai streamer logs no "Loading weights" line (run1/rs-cold.log)
RUNAI = """\
(APIServer pid=1595) INFO 12-02 07:19:33 [api_utils.py:273] non-default args: {'model_tag': '/tmp/ck20', 'host': '127.0.0.1', 'port': 35639, 'model': '/tmp/ck20', 'max_model_len': 2048, 'load_format': 'runai_streamer'}
(EngineCore pid=1675) INFO 12-02 07:20:15 [model_runner.py:305] Model loading took 20.31 GiB and 17.744105 seconds
"""


# --- the phases from the log -------------------------------------------------------------------------------


def test_phases_of_an_empty_compile_cache():
    cs = cold_start_phases(parse_server_log(EMPTY_CC), {"health_s": 158.67, "first_token_s": 158.75})
    assert cs["load_format"] == "auto"
    assert cs["weights_gib"] == 20.31 and cs["model_load_s"] == 17.390204 and cs["weights_load_s"] == 14.80
    assert cs["model_load_gib_per_s"] == round(20.31 / 17.390204, 3)
    assert cs["weights_load_gib_per_s"] == round(20.31 / 14.80, 3)
    assert cs["dynamo_transform_s"] == 11.39 and cs["graph_compile_s"] == 16.70 and cs["graph_from_cache_s"] is None
    assert cs["compile_cache"] == "miss" and cs["torch_compile_s"] == 30.15
    assert cs["cuda_graph_capture_s"] == 6.0 and cs["cuda_graph_gib"] == 0.83
    assert cs["init_engine_s"] == 56.89
    assert cs["log_to_engine_start_s"] == 50.0 and cs["log_to_server_start_s"] == 128.0
    assert cs["health_s"] == 158.67 and cs["first_token_s"] == 158.75


def test_phases_of_a_warm_compile_cache():
    cs = cold_start_phases(parse_server_log(WARM_CC))
    assert cs["compile_cache"] == "hit" and cs["graph_from_cache_s"] == 2.253 and cs["graph_compile_s"] is None
    assert cs["torch_compile_s"] == 5.67 and cs["cuda_graph_capture_s"] == 7.0 and cs["init_engine_s"] == 16.35
    assert cs["health_s"] is None and cs["first_token_s"] is None


def test_runai_load_format_from_the_log_and_only_model_loading():
    cs = cold_start_phases(parse_server_log(RUNAI))
    assert cs["load_format"] == "runai_streamer"
    assert cs["weights_load_s"] is None and cs["weights_load_gib_per_s"] is None
    assert cs["model_load_gib_per_s"] == round(20.31 / 17.744105, 3)
    assert cs["compile_cache"] is None and cs["torch_compile_s"] is None
    # the configured format wins over the log's echo
    assert cold_start_phases(parse_server_log(RUNAI), load_format="safetensors")["load_format"] == "safetensors"


def test_eager_or_empty_log_has_no_phases():
    cs = cold_start_phases(parse_server_log(""))
    assert all(v is None for k, v in cs.items() if k != "load_format")
    assert render_cold_start(cs) == "cold start (load format auto): no phases logged"


def test_render_names_every_phase():
    cs = cold_start_phases(parse_server_log(EMPTY_CC), {"health_s": 158.67, "first_token_s": 158.75})
    line = render_cold_start(cs)
    assert line.startswith("cold start (load format auto): weights load 17.4 s (20.31 GiB, 1.17 GiB/s)")
    for part in (
        "torch.compile 30.1 s (compile cache miss)",
        "CUDA-graph capture 6.0 s",
        "engine init 56.9 s",
        "/health 158.7 s",
        "first token 158.8 s",
    ):
        assert part in line


@pytest.mark.parametrize("run", ["st-cold-cc0", "st-cold-ccw", "st-warm-ccw", "fst-cold"])
def test_the_committed_h200_logs_parse(run):
    text = (BENCH / "run2" / f"{run}.log").read_text()
    cs = cold_start_phases(parse_server_log(text))
    assert cs["weights_gib"] == 20.31 and cs["model_load_s"] > 0 and cs["torch_compile_s"] > 0
    assert cs["cuda_graph_capture_s"] > 0 and cs["init_engine_s"] > cs["torch_compile_s"]
    assert cs["compile_cache"] == ("miss" if run == "st-cold-cc0" else "hit")
    assert cs["load_format"] == ("fastsafetensors" if run == "fst-cold" else "auto")


# --- --load-format -------------------------------------------------------------------------------------------


def test_load_formats_per_release_come_from_the_wheels():
    assert "runai_streamer" in RELEASE_FACTS["0.26.0"].load_formats
    assert "bitsandbytes" in RELEASE_FACTS["0.27.1"].load_formats
    assert "bitsandbytes" not in RELEASE_FACTS["0.28.0"].load_formats
    assert (
        "ipc_cache" in RELEASE_FACTS["0.30.0"].load_formats and "ipc_cache" not in RELEASE_FACTS["0.29.0"].load_formats
    )
    assert all(f.load_formats and f.load_formats[0] == "auto" for f in RELEASE_FACTS.values())


def test_check_load_format_lowercases_and_refuses_naming_the_release_formats():
    facts = release_facts("0.26.0")
    assert check_load_format("RunAI_Streamer", facts) == "runai_streamer"
    with pytest.raises(BadInput) as e:
        check_load_format("ipc_cache", facts)
    assert "vLLM 0.26.0 does not accept it" in str(e.value) and "runai_streamer" in str(e.value)
    assert check_load_format("ipc_cache", release_facts("0.30.0")) == "ipc_cache"


def test_smoke_passes_the_load_format_to_vllm(tmp_path):
    cfg = SmokeConfig(model=str(tmp_path), load_format="Fastsafetensors")
    cfg = cfg.validate()  # --load-format in the spelling vLLM takes
    flags = serve_flags(cfg, str(tmp_path), 8000, "127.0.0.1")
    assert flags[flags.index("--load-format") + 1] == "fastsafetensors"
    assert "--load-format" not in serve_flags(SmokeConfig(model=str(tmp_path)), str(tmp_path), 8000, "127.0.0.1")


def test_smoke_cli_unknown_load_format_is_exit_2_naming_the_formats(tmp_path):
    r = CliRunner().invoke(main, ["smoke", "--local", "--model", str(tmp_path), "--load-format", "gguf-turbo"])
    assert r.exit_code == 2, r.output
    assert "gguf-turbo" in r.output and "safetensors" in r.output and "runai_streamer" in r.output
    r = CliRunner().invoke(
        main, ["smoke", "--local", "--vllm", "0.26.0", "--model", str(tmp_path), "--load-format", "ipc_cache"]
    )
    assert r.exit_code == 2 and "0.26.0" in r.output


# --- the estimate ----------------------------------------------------------------------------------------------


def test_parse_rate_units_and_refusals():
    assert parse_rate("1GiB/s", what="x") == GiB
    assert parse_rate("10Gbit/s", what="x") == 10 * GB / 8
    assert parse_rate("125MB/s", what="x") == 125e6
    assert parse_rate("2", what="x") == 2 * GiB
    for bad in ("0", "-1GB/s", "0MB/s", "fast", "nanGB/s", "infGB/s"):
        with pytest.raises(BadInput):
            parse_rate(bad, what="--pull-bandwidth")


def test_estimate_terms_and_total():
    cs = estimate(
        ColdStartInputs(
            weights_bytes=20 * GiB, image_bytes=10 * GB, pull_bandwidth=1e9, load_rate=2 * GiB, engine_start_s=60.0
        )
    )
    assert cs.pull_s == 10.0 and cs.weights_load_s == 10.0 and cs.engine_start_s == 60.0 and cs.total_s == 80.0
    assert [t["term"] for t in cs.terms] == ["image pull", "weights load", "engine start"]
    assert cs.to_dict()["schema"] == "build-image/cold-start/v1"


def test_defaults_are_the_h200_measurements():
    cs = estimate(ColdStartInputs(weights_bytes=21_795_334_144))
    rate = coldstart.MEASURED_LOAD_RATES[("safetensors", "cold")]
    assert cs.weights_load_s == round(21_795_334_144 / (rate * GiB), 1)
    assert cs.engine_start_s == coldstart.MEASURED_ENGINE_START["0.26.0"]["empty"]
    assert cs.pull_s is None and any("--image-size" in n for n in cs.notes)
    warm = estimate(ColdStartInputs(weights_bytes=21_795_334_144, compile_cache="warm", page_cache="warm"))
    assert warm.total_s < cs.total_s
    pulled = estimate(ColdStartInputs(weights_bytes=GiB, image_bytes=125 * 10**6))
    assert pulled.pull_s == 1.0  # the default 1 Gbit/s


def test_node_storage_bounds_the_load_of_many_gpus():
    one = estimate(ColdStartInputs(weights_bytes=600 * GB, gpus=8, load_rate=GiB))
    assert one.terms[1]["inputs"]["bound"] == "node storage" and one.weights_load_s == round(600 * GB / GiB, 1)
    fast = estimate(ColdStartInputs(weights_bytes=600 * GB, gpus=8, load_rate=GiB, storage_rate=16 * GiB))
    assert fast.terms[1]["inputs"]["bound"] == "per GPU" and fast.weights_load_s == round(75 * GB / GiB, 1)
    two = estimate(ColdStartInputs(weights_bytes=600 * GB, gpus=16, nodes=2, load_rate=GiB))
    assert two.weights_load_s == round(300 * GB / GiB, 1)
    assert any("not measured" in n for n in one.notes)


def test_the_reference_case_is_600GB_over_8_gpus_of_one_node():
    cs = coldstart.reference_600gb(load_format="auto", compile_cache="warm")
    assert cs.inputs["weights_bytes"] == 600 * GB and cs.inputs["gpus"] == 8
    rate = coldstart.MEASURED_LOAD_RATES[("safetensors", "cold")] * GiB
    assert cs.weights_load_s == round(600 * GB / rate, 1)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(storage="object"), "object storage was not measured"),
        (dict(load_format="instanttensor"), "no measured load rate"),
        (dict(pull_bandwidth=0.0), "--pull-bandwidth"),
        (dict(pull_bandwidth=-5.0), "--pull-bandwidth"),
        (dict(load_rate=0.0), "--load-rate"),
        (dict(gpus=2, nodes=3), "not a layout"),
        (dict(engine_start_s=-1.0), "--engine-start"),
        (dict(page_cache="lukewarm"), "--page-cache"),
    ],
)
def test_bad_estimate_inputs_are_bad_input(kw, match):
    with pytest.raises(BadInput, match=match):
        estimate(ColdStartInputs(weights_bytes=GB, **kw))


def test_object_storage_with_a_given_rate():
    cs = estimate(
        ColdStartInputs(weights_bytes=10 * GiB, storage="object", load_format="runai_streamer", load_rate=5 * GiB)
    )
    assert cs.weights_load_s == 2.0


def test_manifest_compressed_bytes(tmp_path):
    m = tmp_path / "m.json"
    m.write_text(json.dumps({"config": {"size": 100}, "layers": [{"size": 1000}, {"size": 2000}]}))
    assert coldstart.manifest_compressed_bytes(m) == 3100
    m.write_text(json.dumps({"manifests": [{"digest": "sha256:x"}]}))
    with pytest.raises(BadInput, match="no layers"):
        coldstart.manifest_compressed_bytes(m)


def test_compressed_size_of_a_pushed_manifest_and_the_push_result(tmp_path):
    from builder.image.registry import compressed_size

    manifest = {"config": {"digest": "sha256:c", "size": 10}, "layers": [{"size": 5}, {"size": 7}]}
    assert compressed_size(manifest) == 22
    assert compressed_size({"manifests": []}) is None and compressed_size({"layers": [{"digest": "x"}]}) is None
    res = tmp_path / "push.json"
    res.write_text(json.dumps({"digest": "sha256:d", "compressed_bytes": 12 * GB}))
    assert coldstart.push_result_compressed_bytes(res) == 12 * GB
    res.write_text(json.dumps({"digest": "sha256:d", "compressed_bytes": None}))
    with pytest.raises(BadInput, match="compressed_bytes"):
        coldstart.push_result_compressed_bytes(res)
    res.write_text(json.dumps({"digest": "sha256:d", "compressed_bytes": 25 * 10**8}))
    r = CliRunner().invoke(main, PLAN + ["--json", "--image-result", str(res)])
    cs = json.loads(r.output)["cold_start"]
    assert cs["pull_s"] == 20.0 and cs["terms"][0]["inputs"]["image_source"] == f"push result {res}"
    r = CliRunner().invoke(main, PLAN + ["--image-result", str(res), "--image-size", "1GB"])
    assert r.exit_code == 2 and "one of" in r.output


def test_predicted_within_20_percent_of_the_measured_h200_runs():
    """docs/cold-start.md: predicted (weights load + engine start) vs the measured /health of each run."""
    runs = {
        "st-cold-cc0": ("auto", "cold", "empty"),
        "st-cold-ccw": ("auto", "cold", "warm"),
        "st-warm-ccw": ("auto", "warm", "warm"),
        "fst-cold": ("fastsafetensors", "cold", "warm"),
    }
    weights = json.loads((BENCH / "run1" / "checkpoint.json").read_text())["safetensors_bytes"]
    for run, (fmt, pc, cc) in runs.items():
        measured = json.loads((BENCH / "run2" / f"{run}.json").read_text())["boot"]["health_s"]
        predicted = estimate(
            ColdStartInputs(weights_bytes=weights, load_format=fmt, page_cache=pc, compile_cache=cc)
        ).total_s
        assert abs(predicted - measured) / measured <= 0.20, (run, predicted, measured)


# --- plan --------------------------------------------------------------------------------------------------

PLAN = [
    "plan",
    "--model",
    str(MODEL_600GB),
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


def test_plan_json_carries_the_cold_start_terms():
    r = CliRunner().invoke(
        main, PLAN + ["--json", "--image-size", "12GB", "--pull-bandwidth", "10Gbit/s", "--compile-cache", "warm"]
    )
    assert r.exit_code in (0, 1), r.output
    cs = json.loads(r.output)["cold_start"]
    assert [t["term"] for t in cs["terms"]] == ["image pull", "weights load", "engine start"]
    assert cs["pull_s"] == round(12 * GB / (10 * GB / 8), 1)
    assert cs["total_s"] == round(cs["pull_s"] + cs["weights_load_s"] + cs["engine_start_s"], 1)
    assert cs["reference_600gb"]["inputs"]["weights_bytes"] == 600 * GB


def test_plan_text_shows_each_term_for_the_model_and_for_600GB_over_8_gpus():
    r = CliRunner().invoke(main, PLAN + ["--load-format", "runai_streamer", "--page-cache", "warm"])
    assert "cold start of" in r.output and "cold start of 600 GB over 8 GPUs of one node" in r.output
    for term in ("image pull", "weights load", "engine start", "total"):
        assert term in r.output
    assert "runai_streamer" in r.output


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--pull-bandwidth", "0"], "--pull-bandwidth"),
        (["--pull-bandwidth", "-1GB/s"], "--pull-bandwidth"),
        (["--load-rate", "0GiB/s"], "--load-rate"),
        (["--load-format", "nope"], "LoadFormats"),
        (["--storage", "object"], "--load-rate"),
    ],
)
def test_plan_bad_cold_start_flags_are_exit_2(flags, match):
    r = CliRunner().invoke(main, PLAN + flags)
    assert r.exit_code == 2, r.output
    assert match in r.output


# --- KubeRay -----------------------------------------------------------------------------------------------


def _render(**serving):
    from tests.test_kuberay import render

    base = dict(model="/models/qwen", gpus=8, tp=8, max_model_len=4096)
    base.update(serving)
    return render(spec=Spec(serving=Serving(**base)))


def _worker(docs):
    group = docs["raycluster.yaml"]["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    return group["containers"][0], group["volumes"]


def test_kuberay_compile_cache_volume_at_vllm_cache_root_and_load_format():
    docs = _render(load_format="fastsafetensors")
    container, volumes = _worker(docs)
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {"VLLM_CACHE_ROOT": "/var/cache/vllm", "TRITON_CACHE_DIR": "/var/cache/vllm/triton"}
    assert {"name": "vllm-compile-cache", "mountPath": "/var/cache/vllm"} in container["volumeMounts"]
    vol = next(v for v in volumes if v["name"] == "vllm-compile-cache")
    assert vol["hostPath"] == {"path": "/var/cache/build-image/vllm", "type": "DirectoryOrCreate"}
    app = yaml.safe_load(docs["rayservice.yaml"]["spec"]["serveConfigV2"])["applications"][0]
    assert app["args"]["load_format"] == "fastsafetensors"
    from tests.test_kuberay import load_serve_module

    mod = load_serve_module()
    assert mod.engine_kwargs(mod.parse_args(app["args"]))["load_format"] == "fastsafetensors"


def test_kuberay_pvc_and_no_compile_cache():
    container, volumes = _worker(_render(compile_cache="pvc:vllm-cache"))
    assert next(v for v in volumes if v["name"] == "vllm-compile-cache")["persistentVolumeClaim"] == {
        "claimName": "vllm-cache"
    }
    container, volumes = _worker(_render(compile_cache="none"))
    assert "env" not in container and [v["name"] for v in volumes] == ["dshm"]


def test_kuberay_model_cache_node_and_object():
    container, volumes = _worker(_render(model_cache="node", model="/models/qwen"))
    assert {"name": "model-cache", "mountPath": "/models", "readOnly": True} in container["volumeMounts"]
    docs = _render(model_cache="object", model="s3://bucket/qwen", load_format="runai_streamer")
    app = yaml.safe_load(docs["rayservice.yaml"]["spec"]["serveConfigV2"])["applications"][0]
    assert app["args"]["model"] == "s3://bucket/qwen" and app["args"]["load_format"] == "runai_streamer"


@pytest.mark.parametrize(
    "serving, match",
    [
        (dict(load_format="bogus"), "serving.load_format"),
        (dict(compile_cache="tmpfs"), "serving.compile_cache"),
        (dict(model_cache="object", model="/models/qwen", load_format="runai_streamer"), "URI"),
        (dict(model_cache="object", model="s3://b/q"), "runai_streamer"),
        (dict(model_cache="node", model="/data/qwen"), "/models"),
        (dict(model_cache="nfs"), "serving.model_cache"),
    ],
)
def test_kuberay_bad_cold_start_settings(serving, match):
    with pytest.raises(BadInput, match=match):
        _render(**serving)


def test_spec_accepts_the_cold_start_keys():
    spec = parse_spec(
        '[serving]\nmodel = "/models/q"\nload_format = "runai_streamer"\ncompile_cache = "none"\n'
        'model_cache = "node"\n',
        "spec.toml",
    )
    assert (spec.serving.load_format, spec.serving.compile_cache, spec.serving.model_cache) == (
        "runai_streamer",
        "none",
        "node",
    )
    assert kuberay.cold_start_settings(spec)["load_format"] == "runai_streamer"


def test_every_smoke_report_names_the_phases(tmp_path):
    """Against the fake OpenAI server (real vLLM 0.26.0 boot lines): the report's cold_start, text and JSON."""
    import jsonschema

    from builder.serving.smoke import SMOKE_REPORT_SCHEMA, render_text
    from tests.test_smoke import _run

    rep = _run(tmp_path, "--boot-delay", "1", rounds=1, load_format="safetensors")
    assert rep.verdict == "PASS", rep.failures
    cs = rep.cold_start
    assert cs["load_format"] == "safetensors" and rep.settings["load_format"] == "safetensors"
    assert cs["model_load_s"] == 1.316428 and cs["weights_gib"] == 0.29 and cs["init_engine_s"] == 2.45
    assert cs["health_s"] == rep.boot["health_s"] and cs["first_token_s"] == rep.boot["first_token_s"]
    assert "cold start (load format safetensors): weights load 1.3 s (0.29 GiB" in render_text(rep)
    jsonschema.validate(rep.to_dict(), SMOKE_REPORT_SCHEMA)
