"""The container-engine adapter: where the Docker CLI is found, and one exit code (8)
with one message when it is not there, whichever command needed it."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from builder.cli import main
from builder.engine import DockerEngine, docker_cli
from builder.errors import EngineUnavailable

ROOT = Path(__file__).resolve().parents[1]


def _fake_cli(folder: Path, name: str = "docker") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / name
    exe.write_text("#!/bin/sh\necho fake-docker \"$@\"\n")
    exe.chmod(0o755)
    return exe


def test_the_cli_is_found_on_path_not_at_a_fixed_location(tmp_path):
    exe = _fake_cli(tmp_path / "opt" / "bin")
    assert docker_cli({"PATH": f"{tmp_path / 'empty'}:{exe.parent}"}) == str(exe)
    # BUILD_IMAGE_DOCKER wins, as a path or as a name looked up on PATH
    other = _fake_cli(tmp_path / "elsewhere", "podman-docker")
    assert docker_cli({"PATH": str(exe.parent), "BUILD_IMAGE_DOCKER": str(other)}) == str(other)
    assert docker_cli({"PATH": f"{exe.parent}:{other.parent}", "BUILD_IMAGE_DOCKER": "podman-docker"}) == str(other)


def test_a_missing_cli_is_engine_unavailable_naming_what_was_looked_for(tmp_path):
    with pytest.raises(EngineUnavailable, match="`docker` on PATH") as exc:
        docker_cli({"PATH": str(tmp_path)})
    assert exc.value.exit_code == 8
    with pytest.raises(EngineUnavailable, match=f"BUILD_IMAGE_DOCKER={tmp_path}/nope"):
        docker_cli({"PATH": os.environ["PATH"], "BUILD_IMAGE_DOCKER": str(tmp_path / "nope")})
    # the adapter looks it up on first use only, and says the same
    eng = DockerEngine(env={"PATH": str(tmp_path)})
    with pytest.raises(EngineUnavailable, match="the Docker CLI was not found"):
        eng.ping()


def test_the_adapter_runs_the_cli_it_found(tmp_path):
    exe = _fake_cli(tmp_path / "bin")
    eng = DockerEngine(env={"PATH": str(exe.parent)})
    assert eng.cli(["version"]).stdout.strip() == "fake-docker version"
    assert eng.argv(["ps"]) == [str(exe), "ps"]


@pytest.mark.parametrize(
    "argv",
    [
        ["base", "snapshot", "--image", "example/base:1", "-o", "{tmp}/m.json"],
        ["ray-check", "example/image:1"],
        ["build", "{tmp}/ctx"],
        ["push", "{tmp}/ctx", "--tag", "127.0.0.1:5000/x/y"],
        ["smoke", "example/image:1", "--model", "{tmp}", "--no-plan"],
    ],
)
def test_every_command_says_the_same_when_the_cli_is_missing(tmp_path, monkeypatch, argv):
    from tests.test_render import _write

    _write(tmp_path)  # a valid build context in tmp/ctx
    monkeypatch.setenv("BUILD_IMAGE_DOCKER", str(tmp_path / "no-docker"))
    res = CliRunner().invoke(main, [a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert res.exit_code == 8, res.output
    assert f"the Docker CLI was not found (BUILD_IMAGE_DOCKER={tmp_path}/no-docker" in " ".join(res.output.split())


def _versioned_cli(folder: Path, version: str, buildx: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "docker"
    exe.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = version ]; then echo {version}; exit 0; fi\n'
        f'if [ "$1" = buildx ]; then exit {0 if buildx else 1}; fi\n'
        'if [ "$1" = build ]; then\n'
        '  echo "ERROR: BuildKit is enabled but the buildx component is missing or broken."\n'
        '  echo "       Install the buildx component to build images with BuildKit:"\n'
        "  exit 1\nfi\n"
        "exit 0\n"
    )
    exe.chmod(0o755)
    return exe


def test_a_cli_that_cannot_build_with_buildkit_does_not_hide_one_that_can(tmp_path):
    """A docker >= 23 without its buildx plugin first on PATH (as on a machine with a
    static CLI in /usr/local/bin and Debian's docker.io in /usr/bin): the later one builds."""
    new = _versioned_cli(tmp_path / "local", "28.2.2", buildx=False)
    old = _versioned_cli(tmp_path / "usr", "20.10.24+dfsg1", buildx=False)
    assert docker_cli({"PATH": f"{new.parent}:{old.parent}"}) == str(old)
    with_plugin = _versioned_cli(tmp_path / "plugin", "28.2.2", buildx=True)
    assert docker_cli({"PATH": f"{with_plugin.parent}:{old.parent}"}) == str(with_plugin)
    # none can: the first on PATH, and its build fails with a message saying why (exit 8)
    other = _versioned_cli(tmp_path / "other", "27.0.1", buildx=False)
    assert docker_cli({"PATH": f"{new.parent}:{other.parent}"}) == str(new)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    with pytest.raises(EngineUnavailable, match="cannot build with BuildKit: its buildx plugin is missing") as exc:
        DockerEngine(env={"PATH": f"{new.parent}:{other.parent}"}).build(ctx, ["x/y:1"])
    assert exc.value.exit_code == 8


def _spawns(tree: ast.AST) -> list[int]:
    """Lines that start a process (subprocess.run/Popen/call/check_output, os.exec*/spawn*)."""
    out = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
        ):
            mod, fn = node.func.value.id, node.func.attr
            if (mod == "subprocess" and fn in {"run", "Popen", "call", "check_call", "check_output"}) or (
                mod == "os" and (fn.startswith("exec") or fn.startswith("spawn") or fn == "system")
            ):
                out.append(node.lineno)
    return out


def test_only_the_engine_module_starts_the_container_engine():
    """No module but builder/engine.py starts a process whose command line names docker:
    every process-starting call elsewhere is checked for a docker word on its line."""
    offenders = []
    for path in sorted((ROOT / "builder").rglob("*.py")):
        if path.name == "engine.py" and path.parent.name == "builder":
            continue
        text = path.read_text()
        lines = text.splitlines()
        for ln in _spawns(ast.parse(text)):
            window = " ".join(lines[ln - 1 : ln + 2]).lower()
            if "docker" in window or "podman" in window:
                offenders.append(f"{path.relative_to(ROOT)}:{ln}")
    assert offenders == []


@pytest.mark.parametrize(
    "stderr, unreachable",
    [
        ("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?", True),
        ("error during connect: Get \"http://%2Fvar%2Frun%2Fdocker.sock/v1.47/info\": EOF", True),
        ("permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock", True),
        ("Unable to find image 'x:1' locally\ndocker: Error response from daemon: pull access denied for x", False),
        (
            "Error response from daemon: Head \"https://127.0.0.1:5000/v2/x/manifests/1\": dial tcp 127.0.0.1:5000: "
            "connect: connection refused",
            False,
        ),
    ],
)
def test_one_classifier_decides_whether_the_engine_itself_was_unreachable(stderr, unreachable):
    """The engine adapter and the image snapshot (its own docker runs) classify a failed command alike:
    the CLI's connection to the engine is exit 8, anything else (a registry's dial error too) exit 12."""
    from builder.engine import engine_unreachable
    from builder.errors import ExternalToolError
    from builder.resolve import base

    assert engine_unreachable(stderr) is unreachable
    err = base._engine_error(["run", "--rm", "x:1"], stderr)
    assert isinstance(err, EngineUnavailable if unreachable else ExternalToolError)


# --------------------------------------------------------------------------- podman beside Docker
def test_engine_kind_from_the_flag_the_cli_name_and_refused_otherwise():
    from builder.engine import engine_kind
    from builder.errors import BadInput

    assert engine_kind({}) == "docker"
    assert engine_kind({"BUILD_IMAGE_DOCKER": "/usr/bin/podman"}) == "podman"
    assert engine_kind({"BUILD_IMAGE_DOCKER": "podman-docker"}) == "docker"  # Debian's docker-CLI shim
    assert engine_kind({"BUILD_IMAGE_ENGINE": "Podman", "BUILD_IMAGE_DOCKER": "/x/docker"}) == "podman"
    with pytest.raises(BadInput, match="'nerdctl'.*drives docker and podman"):
        engine_kind({"BUILD_IMAGE_ENGINE": "nerdctl"})


def test_podman_cli_found_for_the_podman_engine_and_named_when_missing(tmp_path):
    exe = _fake_cli(tmp_path / "bin", "podman")
    assert docker_cli({"PATH": str(exe.parent), "BUILD_IMAGE_ENGINE": "podman"}) == str(exe)
    with pytest.raises(EngineUnavailable, match="`podman` on PATH"):
        docker_cli({"PATH": str(tmp_path / "none"), "BUILD_IMAGE_ENGINE": "podman"})


def test_gpus_the_docker_way_and_the_cdi_way():
    from builder.engine import gpu_flags
    from builder.errors import BadInput

    assert gpu_flags("docker", "all") == ["--gpus", "all"]
    assert gpu_flags("podman", "all") == ["--device", "nvidia.com/gpu=all"]
    assert gpu_flags("podman", "device=0,1") == ["--device", "nvidia.com/gpu=0", "--device", "nvidia.com/gpu=1"]
    assert gpu_flags("podman", "2") == ["--device", "nvidia.com/gpu=0", "--device", "nvidia.com/gpu=1"]
    assert gpu_flags("podman", None) == [] == gpu_flags("docker", "")
    with pytest.raises(BadInput, match="CDI"):
        gpu_flags("podman", "device=0;rm")


def test_the_smoke_requests_gpus_as_its_engine_does(tmp_path, monkeypatch):
    from builder.serving.smoke.config import SmokeConfig
    from builder.serving.smoke.server import build_docker_command

    cfg = SmokeConfig(model=str(tmp_path), image="x:1")
    monkeypatch.delenv("BUILD_IMAGE_ENGINE", raising=False)
    docker = build_docker_command(cfg, 1, "n", "/usr/bin/docker")
    assert docker[docker.index("--gpus") + 1] == "all" and "--device" not in docker
    podman = build_docker_command(cfg, 1, "n", "/usr/bin/podman")
    assert "--gpus" not in podman and podman[podman.index("--device") + 1] == "nvidia.com/gpu=all"
    assert "--pull=never" in podman


def test_loopback_registries():
    from builder.engine import is_loopback_registry

    assert all(map(is_loopback_registry, ["127.0.0.1:5000", "localhost:5000", "[::1]:5000", "127.1.2.3"]))
    assert not any(map(is_loopback_registry, ["ghcr.io", "10.0.0.1:5000", "127.0.0.1.example.com"]))


def test_builds_for_the_host_and_binfmt_handlers(tmp_path):
    from builder import platforms
    from builder.engine import builds_for

    arm = platforms.parse("linux/arm64")
    assert builds_for(platforms.parse("linux/amd64"), machine="x86_64", binfmt=tmp_path)
    assert not builds_for(arm, machine="x86_64", binfmt=tmp_path)
    (tmp_path / "qemu-aarch64").write_text("enabled\n")
    assert builds_for(arm, machine="x86_64", binfmt=tmp_path)
