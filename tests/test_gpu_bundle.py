"""scripts/gpu/bundle_plan.py and bundle_pack.py: the H200 bundle's wheel list per release, read from the
shipped base manifests and default locks (no network), and its layers split into parts."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import tarfile
import zipfile
from pathlib import Path

import pytest

from builder.util import project_root

ROOT = project_root()


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "gpu" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bp = _load("bundle_plan")
pk = _load("bundle_pack")
TORCH_213 = ["0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0"]
TORCH_214 = ["0.33.0", "0.34.0"]


def manifest(v: str) -> dict[str, str]:
    d = json.loads((ROOT / "lockfiles" / "base" / f"vllm-openai-v{v}.json").read_text())["distributions"]
    return {bp.norm(k): x["version"] for k, x in d.items()}


def test_every_shipped_release_is_planned():
    assert bp.releases() == ["0.26.0", *TORCH_213, *TORCH_214]
    p = bp.plan(bp.releases())
    assert set(p["releases"]) == set(bp.releases())
    for v, r in p["releases"].items():
        kinds = [p["layers"][n]["kind"] for n in r["layers"]]
        assert kinds[-2:] == ["vllm", "ray"], v  # torch first where carried (PYTHONPATH order)
        assert p["layers"][f"vllm-{v}"]["slim_vllm"] == v


def test_the_devices_torch_is_not_carried_for_0_26_0():
    r = bp.plan(["0.26.0"])
    assert r["releases"]["0.26.0"]["layers"] == ["vllm-0.26.0", "ray-2.58.1"]
    assert not any(lay["kind"] == "torch" for lay in r["layers"].values())


def test_releases_that_pin_torch_2_13_share_one_torch_layer():
    p = bp.plan(TORCH_213 + TORCH_214)
    torch_layers = {n: lay for n, lay in p["layers"].items() if lay["kind"] == "torch"}
    assert set(torch_layers) == {"torch-2.13.0", "torch-2.14.0"}
    assert torch_layers["torch-2.13.0"]["releases"] == TORCH_213
    assert torch_layers["torch-2.14.0"]["releases"] == TORCH_214  # 0.34.0 travels with 0.33.0's torch layer
    for v in TORCH_213:
        assert p["releases"][v]["layers"][0] == "torch-2.13.0"


@pytest.mark.parametrize("v", TORCH_213 + ["0.33.0"])
def test_the_torch_stack_comes_from_the_manifest(v):
    m = manifest(v)
    r = bp.release_plan(v)
    w = r["torch_wheels"]
    for name in ("torch", "triton", "torchvision", "nvidia-nccl-cu13"):
        assert w[name] == m[name], name
    assert "nvidia-cublas" not in w  # loaded from the device's site-packages (docstring)
    assert {x["name"] for x in r["left_to_device"]} >= {"nvidia-cublas", "nvidia-cudnn-cu13"}
    assert "torchaudio" not in w  # every manifest pins torchaudio 2.11.0, the device's


def test_full_torch_stack_carries_every_differing_cuda_library():
    w = bp.release_plan("0.33.0", full_stack=True)["torch_wheels"]
    assert w["nvidia-cudnn-cu13"] == manifest("0.33.0")["nvidia-cudnn-cu13"] == "9.24.0.43"
    assert "nvidia-nvshmem-cu13" not in w  # 3.4.5 everywhere: the device's version


def test_engine_names_at_the_manifest_versions_and_missing_names_skipped():
    r26 = bp.release_plan("0.26.0")
    m26 = manifest("0.26.0")
    assert r26["engine_wheels"]["transformers"] == m26["transformers"] == "5.14.1"
    assert r26["engine_wheels"]["xgrammar"] == m26["xgrammar"]
    assert {"name": "httpx2", "why": "not in the 0.26.0 base manifest"} in r26["skipped"]
    r33 = bp.release_plan("0.33.0")
    assert r33["engine_wheels"]["transformers"] == "5.20.2"
    assert r33["engine_wheels"]["unidiff"] == "1.0.1"  # build-image's own, the names file's fallback pin
    # the device's exact version is not carried again
    dev = bp.device()
    assert all(dev.get(n) != v for n, v in r33["engine_wheels"].items())


def test_ray_at_the_default_locks_version():
    for v, ray in (("0.26.0", "2.58.1"), ("0.27.0", "2.59.0"), ("0.31.0", "2.59.0"), ("0.33.0", "2.60.0")):
        r = bp.release_plan(v)
        assert r["ray"] == ray and r["ray_wheels"]["ray"] == ray
        _, entries = bp.lock(v)
        for name, ver in entries.items():
            if name in r["ray_wheels"]:
                assert r["ray_wheels"][name] == ver
    assert "grpcio-reflection" in bp.release_plan("0.33.0")["ray_wheels"]  # new in ray 2.60's lock


def test_layers_of_equal_version_but_other_content_carry_a_digest():
    p = bp.plan(["0.27.0", "0.27.1", "0.28.0"])
    ray = {n: lay for n, lay in p["layers"].items() if lay["kind"] == "ray"}
    assert len(ray) == 2 and all(n.startswith("ray-2.59.0-") and len(n) == len("ray-2.59.0-") + 8 for n in ray)
    assert sorted(lay["releases"] for lay in ray.values()) == [["0.27.0", "0.27.1"], ["0.28.0"]]
    assert p["releases"]["0.27.0"]["layers"][-1] == p["releases"]["0.27.1"]["layers"][-1]
    assert bp.plan(["0.28.0"])["releases"]["0.28.0"]["layers"] == ["torch-2.13.0", "vllm-0.28.0", "ray-2.59.0"]


def test_unknown_release_is_refused():
    with pytest.raises(SystemExit, match="no base manifest for vllm 0.25.0"):
        bp.release_plan("0.25.0")


def _wheel(path: Path, name: str, version: str, requires: list[str]) -> Path:
    f = path / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(f, "w") as z:
        meta = [f"Name: {name}", f"Version: {version}"] + [f"Requires-Dist: {r}" for r in requires]
        z.writestr(f"{name}-{version}.dist-info/METADATA", "\n".join(meta) + "\n")
    return f


def test_vllm_requirements_the_device_lacks_are_added(tmp_path):
    _wheel(
        tmp_path,
        "vllm",
        "0.27.0",
        [
            "lark==1.2.2",
            "numpy",
            "flashinfer-python==0.6.16.post3",
            "torch==2.13.0",
            "six>=1.16.0; python_version > '3.11'",
            "pywin32; sys_platform == 'win32'",
            "pytest; extra == 'test'",
        ],
    )
    assert bp.vllm_requirements(tmp_path / "vllm-0.27.0-py3-none-any.whl") == [
        "lark",
        "numpy",
        "flashinfer-python",
        "torch",
        "six",
    ]
    r = bp.release_plan("0.27.0", wheel_dir=tmp_path)
    assert r["auto_added"] == ["lark"]  # numpy/six: the device's; flashinfer: SKIP; torch: the torch layer
    assert r["engine_wheels"]["lark"] == manifest("0.27.0")["lark"]


def test_quack_kernels_travel_with_the_cutlass_dsl(tmp_path):
    # vLLM's sm_90 kernel warm-up imports quack whenever cutlass is importable, and Gemma 4 needs cutlass
    _wheel(tmp_path, "vllm", "0.26.0", ["quack-kernels==0.6.1", "nvidia-cutlass-dsl==4.6.0", "tilelang"])
    r = bp.release_plan("0.26.0", wheel_dir=tmp_path)
    assert r["engine_wheels"]["quack-kernels"] == manifest("0.26.0")["quack-kernels"] == "0.6.1"
    assert "nvidia-cutlass-dsl" in r["engine_wheels"] and "tilelang" not in r["engine_wheels"]


def test_cli_requirements_of_one_layer(capsys):
    assert bp.main(["--vllm", "0.27.0", "--requirements", "torch-2.13.0"]) == 0
    lines = capsys.readouterr().out.split()
    assert "torch==2.13.0" in lines and "triton==3.7.1" in lines and "nvidia-nccl-cu13==2.30.7" in lines


def test_pack_splits_each_layer_once_with_sha256s(tmp_path, monkeypatch):
    wheels = tmp_path / "w"
    wheels.mkdir()
    for name, ver in (("a", "1.0"), ("b", "2.0"), ("vllm", "9.9")):
        f = _wheel(wheels, name, ver, [])
        with zipfile.ZipFile(f, "a") as z:
            z.writestr("blob", bytes(range(256)) * 40)
    plan = {
        "layers": {
            "base-1": {"kind": "torch", "version": "1", "releases": ["9.9", "9.8"], "wheels": {"a": "1.0", "b": "2.0"}},
            "vllm-9.9": {"kind": "vllm", "version": "9.9", "releases": ["9.9"], "wheels": {}, "slim_vllm": "9.9"},
        },
        "releases": {"9.9": {"layers": ["base-1", "vllm-9.9"]}, "9.8": {"layers": ["base-1"]}},
    }
    monkeypatch.setattr(pk, "PART", 4096)
    monkeypatch.setattr(pk.split, "__defaults__", (4096,))
    m = pk.pack(plan, wheels, tmp_path / "out")
    assert m["releases"] == {"9.9": ["base-1", "vllm-9.9"], "9.8": ["base-1"]}
    lay = m["layers"]["base-1"]
    assert len(lay["parts"]) > 1 and all(p["bytes"] <= 4096 for p in lay["parts"])
    joined = b"".join((tmp_path / "out" / p["dir"] / "part").read_bytes() for p in lay["parts"])
    assert hashlib.sha256(joined).hexdigest() == lay["sha256"]
    for p in lay["parts"]:
        assert (tmp_path / "out" / p["dir"] / "part.sha256").read_text().split()[0] == p["sha256"]
    (tmp_path / "j.tar").write_bytes(joined)
    with tarfile.open(tmp_path / "j.tar") as t:
        assert sorted(t.getnames()) == ["whl/LAYER.txt", "whl/a-1.0-py3-none-any.whl", "whl/b-2.0-py3-none-any.whl"]
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["layers"]["vllm-9.9"]["wheels"] == [
        "vllm-9.9-py3-none-any.whl"
    ]
    assert m["missing"] == []


def _calls_module():
    import sys

    spec = importlib.util.spec_from_file_location("bundle_calls", ROOT / "scripts" / "gpu" / "bundle_calls.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bundle_calls"] = mod  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod


MANIFEST = {
    "layers": {
        "vllm-A": {"kind": "vllm", "parts": ["p00", "p01"]},
        "torch-T": {"kind": "torch", "parts": ["p00", "p01", "p02"]},
        "vllm-B": {"kind": "vllm", "parts": ["p00"]},
        "ray-R": {"kind": "ray", "parts": ["p00"]},
    },
    "releases": {"A": ["vllm-A", "ray-R"], "B": ["torch-T", "vllm-B", "ray-R"]},
}


def test_calls_launch_after_the_first_release_and_ray_last():
    bc = _calls_module()
    cmds = [
        c.command.removeprefix("scripts/gpu-proof.sh ") for c in bc.plan_calls(MANIFEST, ".bundle", ["A", "B"], ["B"])
    ]
    assert cmds == [
        "layer vllm-A 0",
        "launch vllm-A 1",
        "layer torch-T 0",
        "layer torch-T 1",
        "layer torch-T 2",
        "layer vllm-B 0",
        "layer ray-R 0",
        "wait",
    ]
    engine_only = [c.command for c in bc.plan_calls(MANIFEST, ".bundle", ["A", "B"], [], launch=False)]
    assert engine_only[-2:] == ["scripts/gpu-proof.sh run vllm-B 0", "scripts/gpu-proof.sh wait"]
    assert not any("ray-R" in c for c in engine_only)


def test_resend_lists_only_what_the_machine_lacks():
    bc = _calls_module()
    reply = (
        "torch-T: part 1 received (2 of 3; boot b1)\n"
        "INVENTORY boot=b1 vllm-A=ok torch-T=2/3:0,1 vllm-B=failed ray-R=0/1\n"
        "run in flight (alive):\n"
    )
    why, calls = bc.resend(MANIFEST, ".bundle", reply, ["A", "B"], ["B"])
    assert "b1" in why
    assert [c.command.split(" ", 1)[1] for c in calls] == ["layer torch-T 2", "layer vllm-B 0", "layer ray-R 0", "wait"]
    assert calls[0].carry == (".bundle/manifest.json", ".bundle/torch-T/p02")
    # no run yet: the launch rides on the first release's missing part
    _, calls = bc.resend(MANIFEST, ".bundle", "INVENTORY boot=b2 vllm-A=1/2:1 torch-T=installing", ["A", "B"], [])
    assert [c.command.split(" ", 1)[1] for c in calls] == ["launch vllm-A 0", "layer vllm-B 0", "wait"]
    # a refusal of the tool (no INVENTORY): a bare machine, every call again
    why, calls = bc.resend(
        MANIFEST, ".bundle", "the device machine stopped answering and was given back", ["A", "B"], ["B"]
    )
    assert "bare" in why and len(calls) == len(bc.plan_calls(MANIFEST, ".bundle", ["A", "B"], ["B"]))


def test_calls_refuse_a_release_the_bundle_lacks():
    bc = _calls_module()
    with pytest.raises(SystemExit, match="no release C"):
        bc.plan_calls(MANIFEST, ".bundle", ["A", "C"], [])
