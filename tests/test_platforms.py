"""linux/arm64 beside linux/amd64: the platform grammar, the recipe of a release's aarch64 image, per-platform
base manifests and locks, the gate's elf-machine rule, and a two-platform render."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from builder import platforms as P
from builder.errors import BadInput
from builder.resolve import recipe as R
from builder.resolve.abi import ELF_MACHINE, foreign_machines
from builder.resolve.lockfile import load_lock
from builder.resolve.manifest import load_manifest
from builder.resolve.recipe.publish import published_images
from builder.resolve.scanner import scan_wheel
from builder.spec import default_base_manifest, default_lock_path, lockfiles_dir, supported_vllm_versions
from tests.conftest import run
from tests.fx_sdist import DOCKERFILE, PIPELINE, build_files
from tests.fx_wheels import write_wheel

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- the grammar
@pytest.mark.parametrize(
    "text, want",
    [
        ("linux/amd64", (P.AMD64,)),
        ("linux/arm64", (P.ARM64,)),
        ("linux/arm64/v8", (P.ARM64,)),
        ("linux/amd64,linux/arm64", (P.AMD64, P.ARM64)),
        ("linux/arm64, linux/amd64", (P.ARM64, P.AMD64)),
        ("linux/amd64,linux/amd64", (P.AMD64,)),
        (None, (P.AMD64,)),
        ("", (P.AMD64,)),
    ],
)
def test_platform_lists_parse_in_the_order_given_each_once(text, want):
    assert P.parse_list(text) == want


@pytest.mark.parametrize(
    "text",
    [
        "linux/arm/v7",
        "linux/ppc64le",
        "darwin/arm64",
        "windows/amd64",
        "arm64",
        "linux/amd64,,linux/arm64",
        "linux/amd64\nFROM evil",
    ],
)
def test_a_platform_no_cuda_image_is_published_for_is_refused_naming_the_known_ones(text):
    with pytest.raises(BadInput) as exc:
        P.parse_list(text)
    assert "linux/amd64" in exc.value.message and ("linux/arm64" in exc.value.message or ",," in text)
    assert "\n" not in exc.value.message


def test_each_tool_s_spelling_of_a_platform_comes_from_one_place():
    assert (P.ARM64.name, P.ARM64.slug, P.ARM64.machine, P.ARM64.elf) == (
        "linux/arm64",
        "linux-arm64",
        "aarch64",
        "EM_AARCH64",
    )
    assert P.ARM64.uv_platform("2.39") == "aarch64-manylinux_2_39"
    assert P.from_uv_platform("x86_64-manylinux_2_35") == P.AMD64
    assert P.from_oci("linux", "arm64", "v8") == P.ARM64 and P.from_oci("linux", "arm", "v7") is None
    assert P.AMD64.file_suffix() == "" and P.ARM64.file_suffix() == "-linux-arm64"


# --------------------------------------------------------------------------- the recipe of the aarch64 image
ARM_PIPELINE = (  # the publish step joins the aarch64 image under the release's tag too
    PIPELINE.replace("r:$BUILDKITE_COMMIT-x86_64\"", "r:$BUILDKITE_COMMIT-x86_64 r:$BUILDKITE_COMMIT-aarch64\"")
    + """\
      - label: "Build release image - aarch64 - CUDA 13.0"
        commands:
          - |
            DOCKER_BUILDKIT=1 docker build \\
              --build-arg CUDA_VERSION=13.0.2 \\
              --build-arg torch_cuda_arch_list="8.0 9.0 10.0 12.0" \\
              --build-arg INSTALL_KV_CONNECTORS=true \\
              --build-arg UBUNTU_VERSION=24.04 \\
              --target vllm-openai \\
              -f docker/Dockerfile .
          - "docker push r:$BUILDKITE_COMMIT-$(uname -m)"
      - label: "Create multi-arch manifest - CUDA 13.0"
        commands:
          - "docker manifest create r:$BUILDKITE_COMMIT r:$BUILDKITE_COMMIT-x86_64 r:$BUILDKITE_COMMIT-aarch64 --amend"
"""
)
# an install that only the arm64 image runs, decided on TARGETPLATFORM as vllm's Dockerfile does
ARM_DOCKERFILE = DOCKERFILE.replace(
    'RUN uv pip install --system accelerate "timm${TIMM_VERSION}"',
    'RUN uv pip install --system accelerate "timm${TIMM_VERSION}"\n'
    'ARG TARGETPLATFORM\n'
    'RUN case "${TARGETPLATFORM}" in \\\n'
    '      linux/arm64) uv pip install --system grace-only==1.0 ;; \\\n'
    '      *) uv pip install --system x86-only==1.0 ;; \\\n'
    '    esac',
)


def _files(pipeline=ARM_PIPELINE, dockerfile=ARM_DOCKERFILE):
    return R.BuildFiles("0.99.0", R.SdistRef("vllm-0.99.0.tar.gz", "0" * 64), build_files(dockerfile, pipeline))


def _derive(platform, pipeline=ARM_PIPELINE, dockerfile=ARM_DOCKERFILE):
    return R.derive(_files(pipeline, dockerfile), platform=platform)


def test_the_aarch64_recipe_is_the_aarch64_pipeline_step_with_its_build_args_and_target_platform():
    arm, x86 = _derive(P.ARM64), _derive(P.AMD64)
    assert arm.pipeline_step.value == "Build release image - aarch64 - CUDA 13.0"
    assert arm.platform == "aarch64-manylinux_2_39" and x86.platform == "x86_64-manylinux_2_39"
    assert dict((k, d.value) for k, d in arm.build_args)["torch_cuda_arch_list"] == "8.0 9.0 10.0 12.0"
    arm_reqs = [r for s in arm.steps for r in s.requirements]
    x86_reqs = [r for s in x86.steps for r in s.requirements]
    assert "grace-only==1.0" in arm_reqs and "x86-only==1.0" not in arm_reqs
    assert "x86-only==1.0" in x86_reqs and "grace-only==1.0" not in x86_reqs
    assert arm.to_json()["target_platform"] == "linux/arm64" and "target_platform" not in x86.to_json()


def test_what_a_release_publishes_comes_from_the_images_its_publish_command_joins():
    said = published_images(_files(ARM_PIPELINE))
    assert [(p.platform, p.step) for p in said] == [
        (P.AMD64, "Build release image - x86_64 - CUDA 13.0"),
        (P.ARM64, "Build release image - aarch64 - CUDA 13.0"),
    ]
    assert all(str(w).startswith(".buildkite/release-pipeline.yaml:") for p in said for w in p.where)
    assert [p.platform for p in published_images(_files(PIPELINE))] == [P.AMD64]  # the x86_64 image alone


def test_a_platform_the_release_does_not_publish_is_exit_2_naming_what_it_publishes():
    with pytest.raises(BadInput) as exc:
        _derive(P.ARM64, pipeline=PIPELINE)
    assert "does not publish vllm/vllm-openai:v0.99.0 for linux/arm64" in exc.value.message
    assert "linux/amd64 (.buildkite/release-pipeline.yaml:" in exc.value.message


# --------------------------------------------------------------------------- shipped per-platform files
@pytest.mark.parametrize("vllm", ["0.32.0", "0.33.0", "0.34.0"])
def test_the_shipped_aarch64_base_manifests_and_locks_are_the_tool_s_and_of_one_platform(vllm):
    assert vllm in supported_vllm_versions(P.ARM64)
    m = load_manifest(default_base_manifest(vllm, P.ARM64))
    assert m.platform.startswith("aarch64-manylinux_") and m.provenance_kind == "reconstructed"
    assert "Build release image - aarch64 - CUDA 13.0" in m.provenance_method
    lock = load_lock(default_lock_path(vllm, P.ARM64))
    assert lock.header["platform"] == m.platform and lock.header["vllm"] == vllm
    assert lock.header["base-ref"] == f"vllm/vllm-openai:v{vllm}"
    for e in lock.entries:  # every wheel is for aarch64 or for any machine, never x86_64
        assert "x86_64" not in e.wheel.filename and (
            "aarch64" in e.wheel.filename or e.wheel.filename.endswith("-any.whl")
        ), e.wheel.filename
    assert (default_lock_path(vllm, P.ARM64).parent / "pylock.toml").is_file()
    # the default platform's files keep their names and say x86_64
    assert load_manifest(default_base_manifest(vllm)).platform.startswith("x86_64-")
    assert "linux-arm64" not in str(default_lock_path(vllm)) and vllm not in supported_vllm_versions(P.ARM64)[:0]


def test_the_aarch64_recipes_file_holds_the_shipped_releases_and_names_its_step():
    text = (lockfiles_dir() / "base" / "recipes-linux-arm64.toml").read_text()
    assert '"Build release image - aarch64 - CUDA 13.0"' in text and "--platform linux/arm64" in text.splitlines()[0]
    tables = R.parse_recipes(text)
    assert set(tables) == set(supported_vllm_versions(P.ARM64))
    assert all(t["platform"].startswith("aarch64-") for t in tables.values())


def test_a_release_without_an_aarch64_manifest_here_is_exit_2_with_the_commands_that_add_it(tmp_path):
    code, out = run("lock", "--vllm", "0.26.0", "--platform", "linux/arm64", "-o", str(tmp_path / "r.lock"))
    assert code == 2, out
    assert "no linux/arm64 base manifest for vllm 0.26.0" in out
    assert "build-image base reconstruct --vllm 0.26.0 --platform linux/arm64" in out
    assert not (tmp_path / "r.lock").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["lock", "--vllm", "0.33.0"],
        ["render", "--vllm", "0.33.0"],
        ["--vllm", "0.33.0"],
        ["base", "recipe", "--vllm", "0.33.0"],
    ],
)
def test_an_unknown_platform_is_exit_2_on_every_command_that_takes_one(args, tmp_path):
    code, out = run(*args, "--platform", "linux/arm/v7")
    assert code == 2, out
    assert "'linux/arm/v7' is not a platform build-image can build" in out and "linux/arm64" in out


def test_a_base_of_another_platform_than_the_lock_is_exit_2_naming_both(tmp_path):
    out_lock = tmp_path / "r.lock"
    code, out = run(
        "lock",
        "--vllm",
        "0.33.0",
        "--platform",
        "linux/arm64",
        "--base",
        str(default_base_manifest("0.33.0")),
        "-o",
        str(out_lock),
    )
    assert code == 2, out
    assert "describes a linux/amd64 image (x86_64-manylinux_2_39), but the lock is for linux/arm64" in out
    code, out = run(
        "lock", "--vllm", "0.33.0", "--base", str(default_base_manifest("0.33.0", P.ARM64)), "-o", str(out_lock)
    )
    assert code == 2, out
    assert "describes a linux/arm64 image (aarch64-manylinux_2_39), but the lock is for linux/amd64" in out
    assert not out_lock.exists()


def test_one_lock_path_for_two_platforms_is_refused(tmp_path):
    code, out = run("lock", "--vllm", "0.33.0", "--platform", "linux/amd64,linux/arm64", "-o", str(tmp_path / "x"))
    assert code == 2 and "each platform has its own lock" in out


# --------------------------------------------------------------------------- the gate: elf-machine
def _so(tmp_path: Path, machine: int | None = None) -> bytes:
    """A real shared object from the host's gcc; ``machine`` rewrites its ELF header's e_machine."""
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    (tmp_path / "m.c").write_text("int answer(void) { return 42; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", "m.so", "m.c"], cwd=tmp_path, check=True)
    data = bytearray((tmp_path / "m.so").read_bytes())
    if machine is not None:
        data[18:20] = machine.to_bytes(2, "little")
    return bytes(data)


def test_the_scanner_reads_each_elf_file_s_machine(tmp_path):
    x86 = write_wheel(
        tmp_path, "native", "1.0", "cp312-cp312-manylinux_2_17_x86_64", {"native/m.so": _so(tmp_path, 62)}
    )
    arm = write_wheel(
        tmp_path, "native", "2.0", "cp312-cp312-manylinux_2_17_aarch64", {"native/m.so": _so(tmp_path, 183)}
    )
    assert scan_wheel(x86)[2].machines == {"EM_X86_64": 1}
    assert scan_wheel(arm)[2].machines == {"EM_AARCH64": 1}
    assert foreign_machines(scan_wheel(x86)[2], "aarch64-manylinux_2_39") == {"EM_X86_64": 1}
    assert foreign_machines(scan_wheel(arm)[2], "x86_64-manylinux_2_39") == {"EM_AARCH64": 1}
    assert foreign_machines(scan_wheel(arm)[2], "aarch64-manylinux_2_39") == {}


@pytest.mark.parametrize(
    "platform, tag, machine, other",
    [
        ("linux/arm64", "cp312-cp312-manylinux_2_17_aarch64", 62, "EM_X86_64"),  # x86_64 code under an aarch64 tag
        ("linux/amd64", "cp312-cp312-manylinux_2_17_x86_64", 183, "EM_AARCH64"),  # the reverse
    ],
)
def test_the_gate_refuses_a_wheel_whose_elf_files_are_for_the_other_machine(
    tmp_path, private_cache, platform, tag, machine, other
):
    links = tmp_path / "links"
    links.mkdir()
    write_wheel(links, "crafted-native", "1.0", tag, {"crafted_native/m.so": _so(tmp_path, machine)})
    target = P.parse(platform)
    out_lock = tmp_path / "r.lock"
    code, out = run(
        "lock",
        "--vllm",
        "0.33.0",
        "--platform",
        platform,
        "--no-default-overlay",
        "--no-index",
        "--find-links",
        str(links),
        "--with",
        "crafted-native==1.0",
        "-o",
        str(out_lock),
        "--json",
    )
    assert code == 3, out
    doc, _end = json.JSONDecoder().raw_decode(out[out.index("{") :])  # the document; the message follows on stderr
    assert doc["status"] == "abi-rejected" and not out_lock.exists()
    (finding,) = [v for v in doc["gate"]["violations"] if v["rule"] == ELF_MACHINE]
    assert finding["name"] == "crafted-native" and other in finding["message"]
    assert target.machine in finding["message"]


# --------------------------------------------------------------------------- real resolution and render (PyPI)
@pytest.mark.slow
def test_an_aarch64_lock_of_the_default_overlay_resolves_from_pypi_on_the_aarch64_base(tmp_path):
    out_lock = tmp_path / "requirements.lock"
    code, out = run("lock", "--vllm", "0.33.0", "--platform", "linux/arm64", "--upgrade", "-o", str(out_lock), "--json")
    assert code == 0, out
    lock = load_lock(out_lock)
    base = load_manifest(default_base_manifest("0.33.0", P.ARM64))
    assert lock.header["platform"] == base.platform == "aarch64-manylinux_2_39"
    names = {e.key for e in lock.entries}
    assert "ray" in names and not names & set(base.distributions)  # the overlay only: the base's pins stay
    binary = [e.wheel.filename for e in lock.entries if not e.wheel.filename.endswith("-any.whl")]
    assert binary and all("aarch64" in f for f in binary), binary
    assert all(e.wheel.sha256 and len(e.wheel.sha256) == 64 for e in lock.entries)
    assert (tmp_path / "pylock.toml").is_file()  # its PEP 751 twin


@pytest.mark.slow
def test_a_two_platform_render_writes_one_context_per_platform_and_the_build_plan(tmp_path):
    ctx = tmp_path / "ctx"
    code, out = run(
        "render", "--vllm", "0.33.0", "--platform", "linux/amd64,linux/arm64", "--no-patches", "-o", str(ctx), "--json"
    )
    assert code == 0, out
    doc, _end = json.JSONDecoder().raw_decode(out[out.index('{\n  "context"') :])
    assert [p["platform"] for p in doc["platforms"]] == ["linux/amd64", "linux/arm64"]
    assert json.loads((ctx / "platforms.json").read_text())["platforms"] == doc["platforms"]
    for p in doc["platforms"]:
        sub = ctx / p["context"]
        lock = load_lock(sub / "requirements.lock")
        machine = P.parse(p["platform"]).machine
        assert lock.header["platform"].startswith(machine + "-")
        assert lock.lock_hash == p["lock_hash"] and p["tags"][0].endswith(p["lock_hash"][:12])
        assert (sub / "Dockerfile").read_text().count("FROM vllm/vllm-openai:v0.33.0") >= 1
        wheels = sorted(w.name for w in (sub / "wheels").iterdir())
        assert all(machine in w or w.endswith("-any.whl") for w in wheels), wheels
    assert doc["index_tags"][0] not in {t for p in doc["platforms"] for t in p["tags"]}
    builds = [line for line in doc["build_plan"] if line.startswith("DOCKER_BUILDKIT=1 docker build")]
    assert ["--platform linux/amd64" in builds[0], "--platform linux/arm64" in builds[1]] == [True, True]
    # a file render did not write is never deleted by the next render
    (ctx / "linux-arm64" / "NOTES.md").write_text("mine")
    code, out = run(
        "render", "--vllm", "0.33.0", "--platform", "linux/amd64,linux/arm64", "--no-patches", "-o", str(ctx)
    )
    assert code == 2 and "NOTES.md" in out and (ctx / "linux-arm64" / "NOTES.md").read_text() == "mine"


def test_upgrade_for_a_platform_without_a_s_base_is_exit_2_before_any_work(tmp_path):
    code, out = run(
        "upgrade", "--from", "0.26.0", "--to", "0.27.0", "--platform", "linux/amd64,linux/arm64", "-o", str(tmp_path)
    )
    assert code == 2, out
    assert "no linux/arm64 base manifest for vllm 0.26.0" in out
    assert "build-image base reconstruct --vllm 0.26.0 --platform linux/arm64" in out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_upgrade_reports_each_platform_its_base_moves_and_its_lock(tmp_path):
    code, out = run(
        "upgrade", "--from", "0.33.0", "--to", "0.34.0", "--platform", "linux/amd64,linux/arm64", "--format", "json"
    )
    assert code == 0, out
    doc, _end = json.JSONDecoder().raw_decode(out[out.index('{\n  "schema"') :])
    (arm,) = doc["platforms"]
    assert arm["platform"] == "linux/arm64" and arm["base"]["to_source"] == "shipped"
    assert arm["base"]["to"].endswith("vllm-openai-v0.34.0-linux-arm64.json")
    moves = {m["what"]: (m["old"], m["new"]) for m in arm["base"]["moves"] if m["changed"]}
    assert moves["vllm"] == ("0.33.0", "0.34.0") and moves["transformers"] == ("5.20.2", "5.22.2")
    assert arm["lock"]["status"] == "written" and arm["lock"]["overlay"] == ["ray[serve]"]
    assert doc["lock"]["status"] == "written" and "platforms" not in doc["base"]


def test_diff_of_two_aarch64_locks_reads_the_aarch64_base_manifests():
    code, out = run(
        "diff", str(default_lock_path("0.33.0", P.ARM64)), str(default_lock_path("0.34.0", P.ARM64)), "--json"
    )
    assert code in (0, 1), out
    assert "vllm-openai-v0.34.0-linux-arm64.json" in out and "vllm-openai-v0.34.0.json" not in out
    assert '"numpy"' in out or "numpy" in out  # the base move read from the aarch64 manifests


def test_a_wheel_without_an_aarch64_build_is_named_with_the_requirement_that_needs_it(tmp_path):
    links = tmp_path / "links"
    links.mkdir()
    write_wheel(links, "x86only", "1.0", "cp312-cp312-manylinux_2_17_x86_64", {"x86only/__init__.py": ""})
    write_wheel(
        links, "needs-x86only", "1.0", "py3-none-any", {"needs_x86only/__init__.py": ""}, requires=["x86only>=1"]
    )
    code, out = run(
        "lock",
        "--vllm",
        "0.33.0",
        "--platform",
        "linux/arm64",
        "--no-default-overlay",
        "--no-index",
        "--find-links",
        str(links),
        "--with",
        "needs-x86only==1.0",
        "-o",
        str(tmp_path / "r.lock"),
    )
    assert code == 4, out
    assert "x86only==1.0 has no wheels with a matching platform tag" in out and "aarch64" in out
    assert "needs-x86only" in out and not (tmp_path / "r.lock").exists()
