"""The memory plan wired into the pipeline: `build-image --smoke` plans the spec's serving
settings before anything is locked, rendered or built (zero GPU and build time)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from builder import cli

DATA = Path(__file__).parent / "data" / "plan"


def _model(tmp_path: Path) -> Path:
    m = tmp_path / "model"
    m.mkdir()
    shutil.copy(DATA / "tiny_qwen3" / "config.json", m / "config.json")
    # 60 GiB of "weights" on an 80 GiB card, declared through the index (no real tensors needed).
    (m / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 60 << 30}, "weight_map": {}})
    )
    return m


def _spec(tmp_path: Path, model: Path, max_model_len: int, max_num_seqs: int) -> Path:
    spec = tmp_path / "build-image.toml"
    spec.write_text(
        f'vllm = "0.26.0"\nlock = "{tmp_path / "lock" / "requirements.lock"}"\n'
        f'[serving]\nmodel = "{model}"\ngpus = 1\ngpu_memory = "80GiB"\ntp = 1\n'
        f"gpu_memory_utilization = 0.80\nmax_model_len = {max_model_len}\nmax_num_seqs = {max_num_seqs}\n"
    )
    return spec


def test_impossible_serving_settings_are_refused_before_lock_and_render(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = _model(tmp_path)
    # 80 GiB x 0.80 = 64 GiB, minus 60 GiB of weights: a few GiB for KV -- a 10M-token
    # context x 256 sequences cannot fit.
    spec = _spec(tmp_path, model, max_model_len=10_000_000, max_num_seqs=256)
    out = tmp_path / "ctx"
    r = CliRunner().invoke(cli.main, ["--spec", str(spec), "--smoke", "-o", str(out)])
    assert r.exit_code == 1, r.output
    assert "memory plan refuses the serving settings" in r.output
    assert "DOES NOT FIT" in r.output
    # nothing was locked or rendered
    assert not (tmp_path / "lock").exists()
    assert not out.exists()
