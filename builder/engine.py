"""The container-engine adapter: the only module that runs the container engine.

One small :class:`Engine` protocol; :class:`DockerEngine` implements it over the
engine's CLI: ``BUILD_IMAGE_DOCKER`` (a path or a command name) when set, else
``docker`` (``podman`` when the engine is podman) on ``PATH`` (:func:`docker_cli`);
neither -> :class:`EngineUnavailable`, exit 8, with one message for every command.
The CLI honours ``DOCKER_HOST``/``DOCKER_CONFIG``, so registry credentials stay in the
engine's own credential store and never pass through this tool.

Two engines: Docker and podman (:func:`engine_kind`: ``BUILD_IMAGE_ENGINE`` / ``--engine``,
else a CLI named ``podman*``).  Where they differ, the difference is one method here:
podman builds with ``--pull=never`` (Docker's BuildKit never pulls an image its store
holds, and build-image checks the store first), without its layer cache and at the
context's ``SOURCE_DATE_EPOCH`` (:meth:`DockerEngine._build_flags`), reports a push's digest through
``--digestfile``, pushes to a loopback registry without TLS, and requests GPUs the CDI
way (:func:`gpu_flags`).  Any other engine name is :class:`BadInput` (exit 2) naming it.

Every other module reaches the engine through this one: builds and pushes
(:meth:`~DockerEngine.build`, :meth:`~DockerEngine.push`), the base snapshot's
``create``/``export`` (:meth:`~DockerEngine.cli`, :meth:`~DockerEngine.popen`),
ray-check's containers and smoke's ``docker run`` server (:meth:`~DockerEngine.popen`).

Errors: engine unreachable -> :class:`EngineUnavailable`; build failure (incl. the
Dockerfile's early checks) -> :class:`BuildFailed`; push refused/unreachable
registry -> :class:`RegistryError`; anything else unexpected -> :class:`ExternalToolError`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from builder.credentials import redact_text
from builder.errors import BadInput, BuildFailed, EngineUnavailable, ExternalToolError, RegistryError
from builder.events import SILENT, Reporter
from builder.platforms import Platform, from_oci
from builder.scratch import die_with_parent
from builder.values import split_ref

UNIX_SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes with the terminating NUL (Linux)

DOCKER_ENV = "BUILD_IMAGE_DOCKER"
ENGINE_ENV = "BUILD_IMAGE_ENGINE"
ENGINES = ("docker", "podman")
# Only the CLI's own connection to the engine: a registry's dial error ("dial tcp HOST:PORT:
# connect: connection refused", relayed by the engine during a push or pull) is a registry fault.
_UNREACHABLE = re.compile(
    r"Cannot connect to the Docker daemon|Is the docker daemon running|error during connect|"
    r"permission denied while trying to connect|"
    r"dial unix [^:]*: connect",
    re.I,
)
_REGISTRY_TROUBLE = re.compile(
    r"connection refused|no such host|i/o timeout|dial tcp|denied|unauthorized|server gave HTTP response|"
    r"received unexpected HTTP status|toomanyrequests|blob upload|manifest invalid|name unknown",
    re.I,
)
_SECRETISH = re.compile(r"(?i)(authorization:\s*\S+\s+)\S+|((?:password|token|auth)[\"']?\s*[:=]\s*[\"']?)[^\s\"',]+")


def engine_unreachable(output: str) -> bool:
    """Pure: does docker CLI output say the CLI could not reach the engine itself?"""
    return bool(_UNREACHABLE.search(output or ""))


def registry_of(ref: str) -> str:
    """Pure: the registry host[:port] of an image reference (``docker.io`` when it names none)."""
    return split_ref(ref).registry


def registry_fault(output: str, registry: str) -> bool:
    """Pure: does engine output of a push/pull say the *registry* could not be reached
    (the engine dials the registry; its dial error names the registry's address)?"""
    text = output or ""
    host = re.escape(registry)
    return bool(
        re.search(rf"(dial tcp|lookup|Get|Head|Put|Post|Patch) \"?(https?://)?\[?{host}", text)
        or re.search(
            rf"{host}\S*: (connect: connection refused|i/o timeout|no such host|EOF|"
            rf"connection reset by peer)",
            text,
        )
    )


_BUILDX_MISSING = re.compile(r"buildx component|BuildKit is enabled but the buildx", re.I)
_found: dict[tuple[str, str], str] = {}


def docker_cli(env: dict[str, str] | None = None) -> str:
    """The Docker CLI to run: ``BUILD_IMAGE_DOCKER`` (a path, or a name looked up on
    ``PATH``) when set, else ``docker`` on ``PATH``.  :class:`EngineUnavailable`
    (exit 8) when it is not there.

    When ``PATH`` holds more than one ``docker``, the first that can build with
    BuildKit wins (a CLI from 23.0 on needs its buildx plugin for that; older ones
    have it built in), so a plugin-less CLI early on ``PATH`` does not hide a working
    one; with none able to, the first."""
    env = os.environ if env is None else env
    search = env.get("PATH", os.defpath)
    if env.get(DOCKER_ENV):
        found = shutil.which(env[DOCKER_ENV], path=search)
        if not found:
            raise _cli_missing(f"{DOCKER_ENV}={env[DOCKER_ENV]}")
        return found
    if engine_kind(env) == "podman":
        found = shutil.which("podman", path=search)
        if not found:
            raise _cli_missing(f"`podman` on PATH ({ENGINE_ENV}=podman)")
        return found
    key = (search, env.get("DOCKER_CONFIG", ""))
    if key not in _found:
        cands: list[str] = []
        for folder in search.split(os.pathsep):
            exe = shutil.which("docker", path=folder) if folder else None
            if exe and os.path.realpath(exe) not in {os.path.realpath(c) for c in cands}:
                cands.append(exe)
        if not cands:
            raise _cli_missing("`docker` on PATH")
        _found[key] = (
            cands[0] if len(cands) == 1 else next((c for c in cands if _builds_with_buildkit(c, env)), cands[0])
        )
    return _found[key]


def engine_kind(env: Mapping[str, str] | None = None) -> str:
    """Which engine the CLI drives: ``docker`` or ``podman``.  ``BUILD_IMAGE_ENGINE`` (the ``--engine`` flag
    sets it) when given, and it must name one of the two; else ``podman`` when ``BUILD_IMAGE_DOCKER`` names a
    CLI called ``podman*``, else ``docker``.  Any other engine name is :class:`BadInput` (exit 2) naming it:
    build-image speaks to Docker and podman only."""
    env = os.environ if env is None else env
    named = (env.get(ENGINE_ENV) or "").strip()
    if named:
        if named.lower() not in ENGINES:
            raise BadInput(
                f"{ENGINE_ENV}={named!r} (or --engine) names an engine build-image does not drive; it drives "
                f"{' and '.join(ENGINES)}.",
                hint="set --engine docker or --engine podman (BUILD_IMAGE_DOCKER may name the CLI's path).",
            )
        return named.lower()
    cli = os.path.basename((env.get(DOCKER_ENV) or "").strip())
    return "podman" if cli.startswith("podman") and cli != "podman-docker" else "docker"


def gpu_flags(kind: str, gpus: str | None) -> list[str]:
    """Pure: the ``run`` flags that give a container GPUs.  Docker: ``--gpus VALUE``; podman: CDI devices, the
    form RHEL/OpenShift hosts use: ``--device nvidia.com/gpu=all``, one ``nvidia.com/gpu=ID`` per ID of
    ``device=0,1`` (or ``0,1``), the first N for a count ``N``.  None or "": no flag."""
    if not gpus:
        return []
    if kind != "podman":
        return ["--gpus", gpus]
    raw = gpus.strip().strip("\"'")
    if raw.startswith("device="):
        ids = [x.strip() for x in raw[len("device=") :].split(",") if x.strip()]
    elif raw == "all":
        ids = ["all"]
    elif raw.isdigit():
        ids = [str(i) for i in range(int(raw))]
    else:
        ids = [x.strip() for x in raw.split(",") if x.strip()]
    if not ids or not all(i == "all" or re.fullmatch(r"[0-9]+|GPU-[0-9a-fA-F-]+", i) for i in ids):
        raise BadInput(
            f"GPUs {gpus!r}: podman requests GPUs as CDI devices; give all, a count, or device indices/UUIDs."
        )
    return [a for i in ids for a in ("--device", f"nvidia.com/gpu={i}")]


def is_loopback_registry(registry: str) -> bool:
    """Pure: does a registry address (``host[:port]``) name this machine (127.0.0.0/8, ::1, localhost)?"""
    host = registry.rsplit(":", 1)[0] if not registry.startswith("[") else registry[1:].split("]", 1)[0]
    return host == "localhost" or host == "::1" or bool(re.fullmatch(r"127(\.\d{1,3}){3}", host))


def builds_for(platform: Platform, machine: str | None = None, binfmt: Path = Path("/proc/sys/fs/binfmt_misc")) -> bool:
    """Whether an engine on this host can build ``platform``'s image: the host's own machine, or one whose
    binaries the kernel runs under QEMU (a ``qemu-<machine>`` handler in binfmt_misc)."""
    machine = machine or os.uname().machine
    if platform.machine == machine:
        return True
    return (binfmt / f"qemu-{platform.machine}").exists()


def _builds_with_buildkit(cli: str, env: dict[str, str]) -> bool:
    """Whether ``cli`` can run a BuildKit build (client-side checks only; no engine needed)."""
    try:
        ver = subprocess.run(
            [cli, "version", "--format", "{{.Client.Version}}"],
            capture_output=True,
            text=True,
            env=dict(env),
            timeout=20,
        )
        m = re.match(r"(\d+)\.", ver.stdout.strip())
        if m and int(m.group(1)) < 23:
            return True
        return (
            subprocess.run(
                [cli, "buildx", "version"], capture_output=True, text=True, env=dict(env), timeout=20
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def _cli_missing(what: str) -> EngineUnavailable:
    """The one message for a missing CLI (exit 8), whichever command needed it."""
    return EngineUnavailable(
        f"the Docker CLI was not found ({what} is not an executable file).",
        hint=f"install the Docker CLI (Debian: docker.io), or set {DOCKER_ENV} to the docker binary.",
    )


def buildkit_step(line: str, seen: list[str]) -> str | None:
    """Pure: the step header a BuildKit plain-progress line starts (``#7 [stage-1 2/5] RUN ...``), once
    per step, as one step line (whitespace collapsed, at most 110 characters); None for every other line."""
    if line.startswith("#") and "] " in line and "[internal]" not in line:
        head = line.split(" ", 1)[1] if " " in line else line
        if not seen or seen[-1] != head:
            seen.append(head)
            return " ".join(head.split())[:110]
    return None


def redact(text: str) -> str:
    """Strip anything that looks like a credential from engine output before logging it."""
    return redact_text(_SECRETISH.sub(lambda m: (m.group(1) or m.group(2) or "") + "***", text))


@dataclass
class BuiltImage:
    """What ``docker build`` produced (the build stage's result is :class:`builder.image.build.BuildResult`)."""

    image_id: str
    tags: list[str]
    log: str = ""


@dataclass
class PushedRef:
    """What ``docker push`` reported for one ref (the stage's result is :class:`builder.image.push.PushResult`)."""

    ref: str
    digest: str
    log: str = ""


@dataclass
class ImageInfo:
    id: str
    size: int
    labels: dict[str, str] = field(default_factory=dict)
    repo_digests: list[str] = field(default_factory=list)
    created: str = ""
    os: str = ""  # the image config's os / architecture / variant ("" when the engine says none)
    architecture: str = ""
    variant: str = ""

    @property
    def platform_name(self) -> str:
        """``linux/arm64`` (``linux/arm/v7`` for one build-image does not build); "" when unknown."""
        if not self.architecture:
            return ""
        return "/".join(x for x in (self.os or "linux", self.architecture, self.variant) if x)

    @property
    def platform(self) -> Platform | None:
        """The image's platform, None when the engine did not say or it is none build-image builds."""
        return from_oci(self.os or "linux", self.architecture, self.variant or None) if self.architecture else None


class Engine(Protocol):
    name: str

    def ping(self) -> str: ...
    def build(
        self,
        context: Path,
        tags: list[str],
        *,
        network: str = "none",
        build_args: dict[str, str] | None = None,
        reporter: Reporter = SILENT,
        platform: Platform | None = None,
    ) -> BuiltImage: ...
    def inspect(self, ref: str) -> ImageInfo | None: ...
    def image_platform(self, ref: str) -> Platform | None: ...
    def push(self, ref: str, *, reporter: Reporter = SILENT) -> PushedRef: ...
    def pull(self, ref: str) -> None: ...
    def cli(
        self, args: list[str], *, timeout: float = 120, input: str | None = None, check: bool = False
    ) -> subprocess.CompletedProcess: ...
    def popen(self, args: list[str], **popen_kw) -> subprocess.Popen: ...
    def tag(self, src: str, dst: str) -> None: ...
    def remove(self, ref: str) -> None: ...
    def run(
        self, image: str, argv: list[str], *, network: str = "none", timeout: int = 300
    ) -> subprocess.CompletedProcess: ...


class DockerEngine:
    """The engine CLI's adapter: Docker (BuildKit builds) or podman (:attr:`kind`, :func:`engine_kind`)."""

    def __init__(self, docker: str | None = None, env: dict[str, str] | None = None, kind: str | None = None):
        self.env = dict(os.environ if env is None else env)
        self.env["DOCKER_BUILDKIT"] = "1"
        self._docker = docker
        if kind is None:  # a CLI named podman* given by path is podman, as BUILD_IMAGE_DOCKER=podman is
            kind = engine_kind(self.env if docker is None else {**self.env, DOCKER_ENV: docker})
        self.kind = kind

    @property
    def name(self) -> str:
        return self.kind

    def gpu_flags(self, gpus: str | None) -> list[str]:
        """The ``run`` flags that give a container GPUs on this engine (:func:`gpu_flags`)."""
        return gpu_flags(self.kind, gpus)

    @property
    def docker(self) -> str:
        """The CLI's path, looked up on first use (a command that never reaches the
        engine does not need one)."""
        if self._docker is None:
            self._docker = docker_cli(self.env)
        return self._docker

    # -- plumbing: every engine process is started by popen() or _run() -----------
    def _missing(self) -> EngineUnavailable:
        return _cli_missing(str(self._docker))

    def popen(self, args: list[str], **popen_kw) -> subprocess.Popen:
        """Start ``docker ARGS`` (streams, long-lived servers); the caller owns the process."""
        popen_kw.setdefault("env", self.env)
        popen_kw.setdefault("preexec_fn", die_with_parent)  # no docker CLI outlives a killed build-image
        try:
            return subprocess.Popen([self.docker, *args], **popen_kw)
        except FileNotFoundError:
            raise self._missing() from None

    def argv(self, args: list[str]) -> list[str]:
        """The full command line of ``docker ARGS`` (for reports; run it with :meth:`popen`)."""
        return [self.docker, *args]

    def cli(
        self, args: list[str], *, timeout: float = 120, input: str | None = None, check: bool = False
    ) -> subprocess.CompletedProcess:
        """Run ``docker ARGS`` to completion, output captured as text.  ``check``: a
        non-zero exit raises (EngineUnavailable when the engine is unreachable, else
        ExternalToolError)."""
        return self._run(args, timeout=timeout, input=input, check=check)

    def _run(
        self, args: list[str], *, timeout: float = 120, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess:
        try:
            proc = subprocess.run(
                [self.docker, *args],
                capture_output=True,
                text=True,
                env=self.env,
                timeout=timeout,
                input=input,
                preexec_fn=die_with_parent,
            )
        except FileNotFoundError:
            raise self._missing() from None
        except subprocess.TimeoutExpired:
            raise EngineUnavailable(f"`docker {args[0]}` did not answer within {timeout}s.") from None
        if check and proc.returncode != 0:
            self._raise_unreachable(proc.stderr)
            raise ExternalToolError(
                f"`docker {' '.join(args[:2])}` failed ({proc.returncode}): {redact(proc.stderr.strip())[-800:]}"
            )
        return proc

    def _refuse_silent_cli(self, proc: subprocess.CompletedProcess) -> None:
        """A CLI that says nothing at all for ``docker version`` (``/bin/false``, a broken wrapper) is not an
        engine that is down: ExternalToolError (exit 12) naming the CLI, not "start dockerd"."""
        if proc.stderr.strip() or proc.stdout.strip():
            return
        raise ExternalToolError(
            f"the Docker CLI {self.docker} exited {proc.returncode} without a word for `docker version`: it does "
            "not behave like a docker CLI, so whether the engine runs is unknown.",
            hint=f"check {DOCKER_ENV} (or the docker on PATH): it must name a working docker binary.",
        )

    def _refuse_long_socket_path(self) -> None:
        """A ``unix://`` DOCKER_HOST whose path does not fit a socket address (107 bytes on Linux): no engine
        can be reached there, and the docker CLI crashes on it instead of saying so."""
        host = self.env.get("DOCKER_HOST") or ""
        if not host.startswith("unix://"):
            return
        size = len(os.fsencode(host[len("unix://") :]))
        if size > UNIX_SOCKET_PATH_MAX:
            raise EngineUnavailable(
                f"the Docker engine at {redact(host)} is not reachable: the socket path is {size} bytes, over the "
                f"{UNIX_SOCKET_PATH_MAX} a unix socket address holds.",
                hint="point DOCKER_HOST at a shorter path (a symlink to the socket's folder will do).",
            )

    def _raise_unreachable(self, stderr: str) -> None:
        if engine_unreachable(stderr):
            host = self.env.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
            raise EngineUnavailable(
                f"the Docker engine at {host} is not reachable: {redact(stderr.strip().splitlines()[-1])}",
                hint="start dockerd (scripts/services.sh start) or point DOCKER_HOST at a running engine.",
            )

    def _stream(
        self, args: list[str], reporter: Reporter, timeout: int, step: Callable[[str], str | None] = lambda line: line
    ) -> tuple[int, str]:
        """Run ``args``: (its exit status, its whole output).  ``step`` makes an output line (redacted) the
        text of a step event on ``reporter``, or None for no event."""
        proc = self.popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        lines: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            line = redact(line.rstrip("\n"))
            lines.append(line)
            said = step(line)
            if said is not None:
                reporter.step(said)
        rc = proc.wait(timeout=timeout)
        return rc, "\n".join(lines)

    # -- protocol -----------------------------------------------------------
    def ping(self) -> str:
        """Server version; raises EngineUnavailable when the engine does not answer."""
        self._refuse_long_socket_path()
        # podman runs no daemon: `podman info` answers when its store and runtime work
        asked = (
            ["info", "--format", "{{.Version.Version}}"]
            if self.kind == "podman"
            else ["version", "--format", "{{.Server.Version}}"]
        )
        proc = self._run(asked, timeout=30, check=False)
        if proc.returncode != 0 or not proc.stdout.strip():
            self._refuse_silent_cli(proc)
            self._raise_unreachable(proc.stderr)
            raise EngineUnavailable(f"the Docker engine did not answer: {redact(proc.stderr.strip())[-400:]}")
        return proc.stdout.strip()

    def build(
        self,
        context: Path,
        tags: list[str],
        *,
        network: str = "none",
        build_args: dict[str, str] | None = None,
        reporter: Reporter = SILENT,
        timeout: int = 3600,
        platform: Platform | None = None,
    ) -> BuiltImage:
        """``docker build``; each BuildKit step's first line is a step event on ``reporter``.  ``platform``:
        ``--platform OS/ARCH`` (BuildKit runs another machine's steps under the host's QEMU binfmt handler);
        None: the engine's own platform, no flag."""
        with tempfile.TemporaryDirectory(prefix="build-image-iid.") as tmp:
            iid = Path(tmp) / "iid"
            args = ["build", *self._build_flags(), *self._timestamp(context, build_args)]
            args += [f"--network={network}", "--iidfile", str(iid)]
            if platform is not None:
                args.append(f"--platform={platform.name}")
            for t in tags:
                args += ["-t", t]
            for k, v in sorted((build_args or {}).items()):
                args += ["--build-arg", f"{k}={v}"]
            args.append(str(context))
            seen: list[str] = []
            rc, log = self._stream(args, reporter, timeout, lambda line: buildkit_step(line, seen))
            if rc != 0:
                self._raise_unreachable(log)
                if _BUILDX_MISSING.search(log):
                    raise EngineUnavailable(
                        f"the Docker CLI {self.docker} cannot build with BuildKit: its buildx plugin is missing.",
                        hint=f"install the buildx plugin, or set {DOCKER_ENV} to a docker CLI that builds with "
                        "BuildKit (one before 23.0 has it built in).",
                    )
                tail = "\n".join(log.splitlines()[-25:])
                raise BuildFailed(
                    f"`docker build` of {context} failed (exit {rc}).",
                    hint="the lines below show the failing step; the early checks fail with 'build-image "
                    "check:' messages.",
                    details=tail,
                )
            image_id = iid.read_text().strip()
        return BuiltImage(image_id=image_id, tags=list(tags), log=log)

    def _build_flags(self) -> list[str]:
        """Docker: BuildKit's plain progress (it never pulls a base its store holds; callers check the store
        first).  podman: ``--pull=never``, the base must be in its store; and ``--no-cache``: its layer cache
        keys a RUN step on its text, not on the files the step bind-mounts (the wheelhouse, the lock), so a
        cached layer could hold another lock's wheels."""
        if self.kind != "podman":
            return ["--progress=plain"]
        return ["--pull=never", "--no-cache"]

    def _timestamp(self, context: Path, build_args: Mapping[str, str] | None) -> list[str]:
        """podman: ``--timestamp N`` (the image's creation time and its files' times) from the build's
        ``SOURCE_DATE_EPOCH`` (a build arg, else the Dockerfile's ``ARG SOURCE_DATE_EPOCH=N``), as BuildKit
        takes it; nothing when the context names none.  (A podman rebuild is still not byte-identical: the
        installers' bytecode records when it was written.)"""
        if self.kind != "podman":
            return []
        value = (build_args or {}).get("SOURCE_DATE_EPOCH")
        if value is None:
            try:
                text = (Path(context) / "Dockerfile").read_text(encoding="utf-8", errors="replace")
            except OSError:
                return []
            m = re.search(r"^ARG SOURCE_DATE_EPOCH=(\d+)\s*$", text, re.M)
            value = m.group(1) if m else None
        return [f"--timestamp={value}"] if value is not None and str(value).isdigit() else []

    def inspect(self, ref: str) -> ImageInfo | None:
        proc = self._run(["image", "inspect", ref], check=False)
        if proc.returncode != 0:
            self._raise_unreachable(proc.stderr)
            return None
        doc = json.loads(proc.stdout)[0]
        image_id = str(doc["Id"])
        if re.fullmatch(r"[0-9a-f]{64}", image_id):  # podman's ID has no algorithm; Docker's and --iidfile's do
            image_id = "sha256:" + image_id
        return ImageInfo(
            id=image_id,
            size=int(doc.get("Size") or 0),
            labels=(doc.get("Config") or {}).get("Labels") or {},
            repo_digests=doc.get("RepoDigests") or [],
            created=doc.get("Created", ""),
            os=str(doc.get("Os") or ""),
            architecture=str(doc.get("Architecture") or ""),
            variant=str(doc.get("Variant") or ""),
        )

    def image_platform(self, ref: str) -> Platform | None:
        """The platform of the image the engine holds under ``ref`` (its config's Os/Architecture/Variant);
        None when it holds none, or one of a platform build-image does not build."""
        info = self.inspect(ref)
        return info.platform if info else None

    def push(self, ref: str, *, reporter: Reporter = SILENT, timeout: int = 3600) -> PushedRef:
        """``docker push``; each line it prints is a step event on ``reporter``.  podman: the digest comes from
        ``--digestfile``, and a loopback registry is spoken to without TLS (``--tls-verify=false``)."""
        if self.kind == "podman":
            return self._podman_push(ref, reporter, timeout)
        rc, log = self._stream(["push", ref], reporter, timeout)
        return self._pushed(ref, rc, log)

    def _podman_push(self, ref: str, reporter: Reporter, timeout: int) -> PushedRef:
        with tempfile.TemporaryDirectory(prefix="build-image-digest.") as tmp:
            digest_file = Path(tmp) / "digest"
            args = ["push", "--digestfile", str(digest_file)]
            if is_loopback_registry(registry_of(ref)):
                args.append("--tls-verify=false")
            rc, log = self._stream([*args, ref], reporter, timeout)
            if rc == 0 and digest_file.is_file():
                log += f"\ndigest: {digest_file.read_text().strip()}"
        return self._pushed(ref, rc, log)

    def _pushed(self, ref: str, rc: int, log: str) -> PushedRef:
        """The pushed ref's digest from the push's output; a failed push is :class:`RegistryError`."""
        if rc != 0:
            registry = registry_of(ref)
            if not registry_fault(log, registry):
                self._raise_unreachable(log)
            last = redact(log.strip().splitlines()[-1]) if log.strip() else "no output"
            raise RegistryError(
                f"pushing {ref} failed (exit {rc}): the registry {registry} "
                + ("is not reachable" if registry_fault(log, registry) else "refused the push")
                + f": {last}",
                hint=f"is the registry {registry} running and reachable, and does the engine's credential store "
                "hold a login for it? A push that stopped midway is retried from the start; the registry "
                "digest is verified after each push.",
            )
        m = re.search(r"digest: (sha256:[0-9a-f]{64})", log)
        if not m:
            raise RegistryError(f"pushing {ref}: the engine did not report a manifest digest.", details=log[-800:])
        return PushedRef(ref=ref, digest=m.group(1), log=log)

    def pull(self, ref: str) -> None:
        proc = self._run(["pull", "-q", ref], timeout=1800, check=False)
        if proc.returncode != 0:
            if not registry_fault(proc.stderr, registry_of(ref)):
                self._raise_unreachable(proc.stderr)
            raise RegistryError(
                f"pulling {ref} from the registry {registry_of(ref)} failed: {redact(proc.stderr.strip())[-400:]}"
            )

    def tag(self, src: str, dst: str) -> None:
        self._run(["tag", src, dst])

    def remove(self, ref: str) -> None:
        self._run(["image", "rm", "-f", ref], check=False)

    def run(
        self, image: str, argv: list[str], *, network: str = "none", timeout: int = 300
    ) -> subprocess.CompletedProcess:
        return self._run(
            ["run", "--rm", "--pull=never", f"--network={network}", image, *argv], timeout=timeout, check=False
        )


def get_engine() -> Engine:
    """The engine to use: Docker or podman (:func:`engine_kind`; another engine name is exit 2 naming it)."""
    return DockerEngine(kind=engine_kind())
