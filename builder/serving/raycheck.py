"""ray-check: one image, the same versions on every node of a real Ray cluster.

Two halves:

* **pure** — :class:`NodeReport` (what one node says about itself) and
  :func:`compare` (node reports + lock -> findings).  No subprocess, no Ray.
* **adapter** — :class:`LocalRayCluster` starts a Ray head and N workers as
  containers on the local engine (``--pull=never``; the head in a namespace of
  its own with only loopback, ``--network=none``, the workers joining it with
  ``--network=container:<head>``; Ray ports distinct per node, dashboard off, small object
  store), runs :data:`PROBE_SCRIPT` in the head, which waits for the nodes to
  join and runs one task pinned to each node (``NodeAffinitySchedulingStrategy``,
  ``soft=False``).  Containers are always removed by ID, also on error or Ctrl-C.

A node that never joins (Ray refuses a node whose Python or Ray version differs)
is probed on its own (``docker exec``/``docker run --rm`` of the same script), so
the failure still names the difference.

Each task reports: the Python version, the versions of ray, numpy, torch, vllm,
transformers and of every package in the lock (absent = null), the sha256 of
each patched vllm file listed in the image's ``patched.sha256`` (and the sum the
build recorded), and the image ID/digest the host injected into that container
(``BUILD_IMAGE_IMAGE_ID``/``BUILD_IMAGE_DIGEST``), so a report proves which
container its task ran in.
"""

from __future__ import annotations

import json
import math
import secrets
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from builder import engine as engine_adapter
from builder.errors import BadInput, ExternalToolError
from builder.events import SILENT, Reporter
from builder.report import render_json
from builder.resolve.lockfile import LockFile
from builder.util import canonical_name, same_version

REPORTED_PACKAGES = ("ray", "numpy", "torch", "vllm", "transformers")
# Where the rendered Dockerfile leaves the list of patched vllm files (sha256sum format:
# "<hex>  <path>", path relative to vllm's site-packages); absent in an image without patches.
PATCHED_SUMS = "/usr/share/build-image/patched.sha256"
CONTAINER_LABEL = "org.build-image.ray-check"
MARKER = "@@BUILD-IMAGE-RAY-CHECK@@"
PYTHON = "python3"
OBJECT_STORE_BYTES = 100 * 1000 * 1000  # Ray's minimum is 75 MiB
WORKER_PORTS_PER_NODE = 24

# ---------------------------------------------------------------------------------------------
# pure part: reports and comparison
# ---------------------------------------------------------------------------------------------


@dataclass
class NodeReport:
    node: str  # "head", "worker-1", ...
    image: str  # the ref the container was started from
    joined: bool = True  # did it join the Ray cluster (report from a pinned task)?
    python: str | None = None
    packages: dict[str, str | None] = field(default_factory=dict)  # canonical name -> version
    patched: dict[str, str | None] = field(default_factory=dict)  # path -> actual sha256 (None: missing)
    patched_recorded: dict[str, str] = field(default_factory=dict)  # path -> sha256 the build recorded
    patch_list: str | None = None  # the patched.sha256 file read, if any
    image_id: str | None = None
    image_digest: str | None = None
    error: str | None = None  # why the node has no (full) report / did not join

    @classmethod
    def from_dict(cls, doc: dict[str, Any], *, node: str, image: str, joined: bool) -> NodeReport:
        return cls(
            node=node,
            image=image,
            joined=joined,
            python=doc.get("python"),
            packages={canonical_name(k): v for k, v in (doc.get("packages") or {}).items()},
            patched=dict(doc.get("patched") or {}),
            patched_recorded=dict(doc.get("patched_recorded") or {}),
            patch_list=doc.get("patch_list"),
            image_id=doc.get("image_id"),
            image_digest=doc.get("image_digest"),
            error=doc.get("error"),
        )


@dataclass
class Finding:
    kind: str  # not-joined | differs | lock | patch | probe-failed
    subject: str  # "python", "package numpy", "patched vllm/x.py", "node worker-1"
    message: str
    values: dict[str, Any] = field(default_factory=dict)  # node (or "lock") -> value


@dataclass
class CheckResult:
    image: str
    nodes: list[NodeReport]
    findings: list[Finding]
    lock: str | None = None
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def mismatch(self) -> str | None:
        """None (PASS); ``"lock"`` when the nodes agree with each other and only differ from the
        lock; ``"nodes"`` when they disagree among themselves, a node did not join or could not be
        probed; ``"image"`` when they agree but a patched file differs from the build's record."""
        kinds = {f.kind for f in self.findings}
        if not kinds:
            return None
        if kinds & {"not-joined", "probe-failed", "differs"}:
            return "nodes"
        return "image" if "patch" in kinds else "lock"

    def to_json(self) -> str:
        doc = {
            "verdict": "PASS" if self.ok else "FAIL",
            "mismatch": self.mismatch,
            "image": self.image,
            "lock": self.lock,
            "elapsed_s": round(self.elapsed_s, 1),
            "nodes": [asdict(n) for n in self.nodes],
            "findings": [asdict(f) for f in self.findings],
        }
        return render_json(doc, ensure_ascii=True)


def _fmt(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={'absent' if v is None else v}" for k, v in values.items())


def compare(reports: list[NodeReport], lock: LockFile | None = None) -> list[Finding]:
    """Every way the nodes differ from each other or from the lock (empty list: PASS)."""
    findings: list[Finding] = []
    for r in reports:
        if not r.joined:
            findings.append(
                Finding(
                    "not-joined",
                    f"node {r.node}",
                    f"node {r.node} ({r.image}) did not join the cluster" + (f": {r.error}" if r.error else "."),
                    {r.node: r.error},
                )
            )
        elif r.error:
            findings.append(
                Finding(
                    "probe-failed", f"node {r.node}", f"the probe on node {r.node} failed: {r.error}", {r.node: r.error}
                )
            )
    probed = [r for r in reports if r.python is not None]

    def across(
        subject: str, get: Callable[[NodeReport], Any], same: Callable[[Any, Any], bool] = lambda a, b: a == b
    ) -> None:
        values = {r.node: get(r) for r in probed}
        vals = list(values.values())
        if any(not same(vals[0], v) for v in vals[1:]):
            findings.append(Finding("differs", subject, f"{subject} differs across nodes: {_fmt(values)}", values))

    across("image", lambda r: r.image_id)
    across("python", lambda r: r.python)
    names = sorted({n for r in probed for n in r.packages})
    for name in names:
        across(f"package {name}", lambda r, n=name: r.packages.get(n), same_version)
    paths = sorted({p for r in probed for p in (*r.patched, *r.patched_recorded)})
    for path in paths:
        across(f"patched {path}", lambda r, p=path: r.patched.get(p))
    across("patch list", lambda r: sorted(r.patched_recorded))

    for r in probed:  # inside one image: does every patched file still have the sum the build recorded?
        for path, recorded in sorted(r.patched_recorded.items()):
            actual = r.patched.get(path)
            if actual != recorded:
                findings.append(
                    Finding(
                        "patch",
                        f"patched {path}",
                        f"node {r.node}: {path} has sha256 {actual or 'absent'}, the build recorded {recorded}",
                        {r.node: actual, "recorded": recorded},
                    )
                )

    if lock is not None:
        want_py = lock.header.get("python")
        for r in probed:
            if want_py and want_py != "-" and ".".join(r.python.split(".")[:2]) != want_py:
                findings.append(
                    Finding(
                        "lock",
                        "python",
                        f"node {r.node} runs Python {r.python}, the lock is for {want_py}",
                        {r.node: r.python, "lock": want_py},
                    )
                )
        for entry in sorted(lock.entries, key=lambda e: e.key):
            for r in probed:
                have = r.packages.get(entry.key, "<not probed>")
                if have == "<not probed>":
                    continue
                if not same_version(have, entry.version):
                    findings.append(
                        Finding(
                            "lock",
                            f"package {entry.key}",
                            f"node {r.node} has {entry.key} {have or 'absent'}, the lock pins {entry.version}",
                            {r.node: have, "lock": entry.version},
                        )
                    )
    return findings


def render_text(result: CheckResult) -> str:
    """Human-readable report (the CLI prints it; --json prints CheckResult.to_json())."""
    lines = [
        f"ray-check {'PASS' if result.ok else 'FAIL'}: {result.image} "
        f"({len(result.nodes)} node(s), {result.elapsed_s:.1f}s)"
        + {
            None: "",
            "nodes": ": the nodes disagree",
            "lock": ": the nodes agree with each other, not with the lock",
            "image": ": the nodes agree, but a patched file differs from the build's record",
        }[result.mismatch]
    ]
    for r in result.nodes:
        pk = " ".join(f"{n}={r.packages.get(n) or '-'}" for n in REPORTED_PACKAGES)
        state = "joined" if r.joined else "NOT JOINED"
        lines.append(
            f"  {r.node:<10} {state:<10} python={r.python or '?'} {pk} "
            f"patched={len(r.patched)} image={(r.image_id or '?')[:19]}"
        )
    for f in result.findings:
        lines.append(f"  - {f.message}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the script that runs inside the containers (a task on each node, or alone in a container)
# ---------------------------------------------------------------------------------------------

PROBE_SCRIPT = r'''
import hashlib, json, os, platform, sys, time

MARKER = "@@BUILD-IMAGE-RAY-CHECK@@"


def collect(packages, sums_path):
    from importlib import metadata
    out = {"node": os.environ.get("BUILD_IMAGE_NODE"), "python": platform.python_version(),
           "packages": {}, "patched": {}, "patched_recorded": {}, "patch_list": None,
           "image_id": os.environ.get("BUILD_IMAGE_IMAGE_ID") or None,
           "image_digest": os.environ.get("BUILD_IMAGE_DIGEST") or None}
    for dist in metadata.distributions():  # every installed distribution; the first on sys.path wins
        name = (dist.metadata["Name"] or "").strip()
        key = "-".join(name.replace("_", "-").replace(".", "-").lower().split("-")) if name else ""
        if key and key not in out["packages"]:
            out["packages"][key] = dist.version
    for name in packages:  # the ones asked for by name: absent = null
        if name not in out["packages"]:
            try:
                out["packages"][name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                out["packages"][name] = None
    if sums_path and os.path.isfile(sums_path):
        out["patch_list"] = sums_path
        try:
            root = str(metadata.distribution("vllm").locate_file(""))
        except metadata.PackageNotFoundError:
            root = "/"
        with open(sums_path) as fh:
            for line in fh:
                parts = line.strip().split(None, 1)
                if len(parts) != 2:
                    continue
                digest, rel = parts[0], parts[1].lstrip("*")
                out["patched_recorded"][rel] = digest
                path = rel if os.path.isabs(rel) else os.path.join(root, rel)
                try:
                    with open(path, "rb") as fh2:
                        out["patched"][rel] = hashlib.sha256(fh2.read()).hexdigest()
                except OSError:
                    out["patched"][rel] = None
    return out


def cluster(cfg):
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    deadline = time.time() + cfg["timeout"]
    ray.init(address=cfg["address"], logging_level="ERROR", log_to_driver=False)
    expected = set(cfg["nodes"])
    while True:
        alive = {n.get("NodeName"): n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        print("joined: " + ",".join(sorted(k for k in alive if k)), file=sys.stderr, flush=True)
        # the host creates the give-up file when a node's container has exited (Ray refused it)
        if expected <= set(alive) or time.time() > deadline or os.path.exists(cfg["giveup"]):
            break
        time.sleep(0.5)

    @ray.remote(num_cpus=0, max_retries=0)
    def probe(packages, sums_path):
        return collect(packages, sums_path)

    refs = {}
    for name in sorted(expected & set(alive)):
        strategy = NodeAffinitySchedulingStrategy(node_id=alive[name], soft=False)
        refs[name] = probe.options(scheduling_strategy=strategy).remote(cfg["packages"], cfg["sums"].get(name))
    reports = {}
    for name, ref in refs.items():
        try:
            reports[name] = ray.get(ref, timeout=max(5.0, deadline - time.time()))
        except Exception as exc:  # report, do not crash: the host turns it into a finding
            reports[name] = {"error": "%s: %s" % (type(exc).__name__, str(exc)[:300])}
    print(MARKER + json.dumps({"joined": sorted(k for k in alive if k), "reports": reports}), flush=True)


if __name__ == "__main__":
    cfg = json.loads(sys.argv[1])
    if cfg["mode"] == "cluster":
        cluster(cfg)
    else:
        try:  # a Ray worker process sees ray's vendored packages (thirdparty_files): so does this probe
            import ray  # noqa: F401
        except Exception:
            pass
        print(MARKER + json.dumps(collect(cfg["packages"], cfg["sums"])), flush=True)
'''


def _parse_marker(stdout: str) -> dict | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARKER):
            try:
                return json.loads(line[len(MARKER) :])
            except json.JSONDecodeError:
                return None
    return None


# ---------------------------------------------------------------------------------------------
# ports (host network: every node needs its own)
# ---------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _free_range(n: int, taken: set[int]) -> int:
    """First port of ``n`` consecutive free ports on 127.0.0.1 (not in ``taken``)."""
    rng = secrets.SystemRandom()
    for _ in range(200):
        start = rng.randrange(20000, 60000 - n)
        ports = range(start, start + n)
        if taken.intersection(ports):
            continue
        socks = []
        try:
            for p in ports:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return start
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise ExternalToolError(f"could not find {n} consecutive free ports on 127.0.0.1 for the Ray workers.")


@dataclass
class NodePorts:
    node_manager: int
    object_manager: int
    agent_listen: int
    agent_grpc: int
    runtime_env_agent: int
    metrics: int
    min_worker: int
    max_worker: int
    gcs: int | None = None
    client_server: int | None = None
    dashboard: int | None = None

    def args(self) -> list[str]:
        out = [
            f"--node-manager-port={self.node_manager}",
            f"--object-manager-port={self.object_manager}",
            f"--dashboard-agent-listen-port={self.agent_listen}",
            f"--dashboard-agent-grpc-port={self.agent_grpc}",
            f"--runtime-env-agent-port={self.runtime_env_agent}",
            f"--metrics-export-port={self.metrics}",
            f"--min-worker-port={self.min_worker}",
            f"--max-worker-port={self.max_worker}",
        ]
        if self.gcs is not None:
            out += [
                f"--port={self.gcs}",
                f"--ray-client-server-port={self.client_server}",
                f"--dashboard-port={self.dashboard}",
            ]
        return out


def allocate_ports(n_nodes: int) -> list[NodePorts]:
    taken: set[int] = set()

    def one() -> int:
        while True:
            p = _free_port()
            if p not in taken:
                taken.add(p)
                return p

    out = []
    for i in range(n_nodes):
        singles = [one() for _ in range(6)]
        start = _free_range(WORKER_PORTS_PER_NODE, taken)
        taken.update(range(start, start + WORKER_PORTS_PER_NODE))
        ports = NodePorts(*singles, min_worker=start, max_worker=start + WORKER_PORTS_PER_NODE - 1)
        if i == 0:
            ports.gcs, ports.client_server, ports.dashboard = one(), one(), one()
        out.append(ports)
    return out


# ---------------------------------------------------------------------------------------------
# adapter: containers of the local engine
# ---------------------------------------------------------------------------------------------


@dataclass
class NodeSpec:
    name: str
    image: str
    image_id: str
    image_digest: str | None
    sums: str


class Containers:
    """The container operations ray-check needs, through the engine adapter
    (:meth:`builder.engine.DockerEngine.cli`/:meth:`~builder.engine.DockerEngine.popen`).

    Every container it starts is labelled and recorded; :meth:`remove_all` removes
    them by ID (never by name pattern)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.started: list[str] = []

    def _cli(self, args: list[str], *, timeout: float = 60, input: str | None = None) -> subprocess.CompletedProcess:
        return self.engine.cli(args, timeout=timeout, input=input)

    def image(self, ref: str, role: str):
        info = self.engine.inspect(ref)
        if info is None:
            raise BadInput(
                f"ray-check: {role} image {ref!r} is not in the local engine (ray-check never pulls).",
                hint="build it with `build-image build`, or `docker pull` it yourself first.",
            )
        return info

    def start(self, node: NodeSpec, argv: list[str], run_id: str, *, network: str = "none") -> str:
        args = [
            "run",
            "-d",
            "--pull=never",
            f"--network={network}",
            "--shm-size=256m",
            "--init",
            "--label",
            f"{CONTAINER_LABEL}={run_id}",
            "--label",
            f"org.build-image.image-digest={node.image_digest or node.image_id}",
            "-e",
            f"BUILD_IMAGE_NODE={node.name}",
            "-e",
            f"BUILD_IMAGE_IMAGE_ID={node.image_id}",
            "-e",
            f"BUILD_IMAGE_DIGEST={node.image_digest or ''}",
            "-e",
            "RAY_USAGE_STATS_ENABLED=0",
            "-e",
            "RAY_DISABLE_DOCKER_CPU_WARNING=1",
            "--entrypoint",
            PYTHON,
            node.image,
            *argv,
        ]
        proc = self._cli(args, timeout=120)
        cid = proc.stdout.strip()
        if proc.returncode != 0 or not cid:
            raise ExternalToolError(
                f"ray-check: starting the {node.name} container failed: {proc.stderr.strip()[-600:]}"
            )
        self.started.append(cid)
        return cid

    def running(self, cid: str) -> bool:
        proc = self._cli(["container", "inspect", "-f", "{{.State.Running}}", cid], timeout=30)
        return proc.returncode == 0 and proc.stdout.strip() == "true"

    def logs(self, cid: str, lines: int = 30) -> str:
        proc = self._cli(["logs", "--tail", str(lines), cid], timeout=30)
        return (proc.stdout + proc.stderr).strip()

    def exec_python(self, cid: str, script: str, arg: str, *, timeout: float) -> subprocess.CompletedProcess:
        return self._cli(["exec", "-i", cid, PYTHON, "-", arg], timeout=timeout, input=script)

    def exec_sh(self, cid: str, command: str) -> None:
        self._cli(["exec", cid, "sh", "-c", command], timeout=30)

    def run_python(self, node: NodeSpec, script: str, arg: str, *, timeout: float) -> subprocess.CompletedProcess:
        return self._cli(
            [
                "run",
                "--rm",
                "-i",
                "--pull=never",
                "--network=none",
                "-e",
                f"BUILD_IMAGE_NODE={node.name}",
                "-e",
                f"BUILD_IMAGE_IMAGE_ID={node.image_id}",
                "-e",
                f"BUILD_IMAGE_DIGEST={node.image_digest or ''}",
                "--entrypoint",
                PYTHON,
                node.image,
                "-",
                arg,
            ],
            timeout=timeout,
            input=script,
        )

    def remove_all(self, run_id: str | None = None) -> None:
        """Remove every container this run started, by ID; never raises.

        With ``run_id``, containers carrying this run's unique label are removed too
        (one created by a ``docker run`` interrupted before it printed its ID)."""
        if run_id:
            try:
                proc = self._cli(
                    ["ps", "-aq", "--no-trunc", "--filter", f"label={CONTAINER_LABEL}={run_id}"], timeout=30
                )
                for cid in proc.stdout.split():
                    if not any(s.startswith(cid) or cid.startswith(s) for s in self.started):
                        self.started.append(cid)
            except Exception:  # noqa: BLE001
                pass
        while self.started:
            cid = self.started.pop()
            try:
                self._cli(["rm", "-f", cid], timeout=60)
            except Exception:  # noqa: BLE001 - best effort during cleanup
                pass


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt for the duration, so cleanup runs on `kill` too."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _digest_for(info) -> str | None:
    for rd in info.repo_digests or []:
        if "@sha256:" in rd:
            return rd.split("@", 1)[1]
    return None


def node_specs(image: str, workers: int, worker_image: str | None, containers: Containers) -> list[NodeSpec]:
    infos: dict[str, Any] = {}
    out = []
    for i in range(workers + 1):
        name = "head" if i == 0 else f"worker-{i}"
        # --worker-image replaces the image of the last worker only: the head and the
        # other workers keep IMAGE, so the report shows which node differs.
        ref = worker_image if (worker_image and i == workers and i > 0) else image
        if ref not in infos:
            infos[ref] = containers.image(ref, "worker" if ref != image else "cluster")
        info = infos[ref]
        sums = PATCHED_SUMS
        out.append(NodeSpec(name=name, image=ref, image_id=info.id, image_digest=_digest_for(info), sums=sums))
    return out


#: the most worker containers ``ray-check`` starts on one host, and its longest --timeout (a day)
MAX_WORKERS = 256
MAX_TIMEOUT_S = 86400.0


def run_check(
    image: str,
    *,
    workers: int = 1,
    lock: LockFile | None = None,
    lock_path: str | None = None,
    timeout: float = 120.0,
    worker_image: str | None = None,
    engine=None,
    reporter: Reporter = SILENT,
) -> CheckResult:
    """Start the cluster, collect one report per node, compare.  Containers are always removed.  Each
    container started and waited for is a step on ``reporter``."""
    if not 1 <= workers <= MAX_WORKERS:
        raise BadInput(f"ray-check: --workers must be in [1, {MAX_WORKERS}] (containers on this host), got {workers}.")
    if not (math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT_S):  # nan never expires; 1e308 overflows
        raise BadInput(f"ray-check: --timeout must be positive seconds, at most {MAX_TIMEOUT_S}, got {timeout}.")
    if engine is None:
        engine = engine_adapter.get_engine()
    engine.ping()
    t0 = time.monotonic()
    containers = Containers(engine)
    packages = sorted({*REPORTED_PACKAGES, *(e.key for e in (lock.entries if lock else []))})
    nodes = node_specs(image, workers, worker_image, containers)
    cl = _Cluster(
        containers=containers,
        nodes=nodes,
        run_id=secrets.token_hex(4),
        ports=allocate_ports(len(nodes)),
        deadline=t0 + timeout,
        reporter=reporter,
    )
    with ExitStack() as stack:
        stack.enter_context(_sigterm_as_interrupt())
        stack.callback(containers.remove_all, cl.run_id)
        cl.start_head()
        for node in nodes[1:]:
            cl.start_worker(node)
        reporter.step(f"waiting for {len(nodes)} nodes to join (up to {int(cl.deadline - time.monotonic())}s)")
        answer = _drive(
            containers,
            cl.cids,
            nodes,
            cl.probe_config(packages),
            cl.deadline,
            restart=cl.start_worker,
            reporter=reporter,
        )
        driver_error = answer.pop("error", None)
        reports: dict[str, NodeReport] = {}
        for node in nodes:
            doc = answer.get("reports", {}).get(node.name)
            if doc is not None:
                reports[node.name] = NodeReport.from_dict(doc, node=node.name, image=node.image, joined=True)
        # nodes without a report from the cluster: probe them alone, so the failure names the difference
        joined = set(answer.get("joined", []))
        for node in nodes:
            if node.name not in reports:
                reports[node.name] = _report_alone(cl, node, packages, joined, driver_error)
    ordered = [reports[n.name] for n in nodes]
    return CheckResult(
        image=image, nodes=ordered, findings=compare(ordered, lock), lock=lock_path, elapsed_s=time.monotonic() - t0
    )


_RAY_START = [
    "-m",
    "ray.scripts.scripts",
    "start",
    "--block",
    "--node-ip-address=127.0.0.1",
    "--num-gpus=0",
    "--num-cpus=1",
    f"--object-store-memory={OBJECT_STORE_BYTES}",
    "--disable-usage-stats",
]


@dataclass
class _Cluster:
    """The containers of one ray-check run: a head and its workers on the head's loopback."""

    containers: Containers
    nodes: list[NodeSpec]
    run_id: str
    ports: list[NodePorts]
    deadline: float
    reporter: Reporter
    cids: dict[str, str] = field(default_factory=dict)  # node name -> container ID

    @property
    def gcs(self) -> str:
        return f"127.0.0.1:{self.ports[0].gcs}"

    def start_head(self) -> None:
        """Start the head and wait until its GCS accepts connections."""
        self.reporter.step(f"starting head ({self.nodes[0].image})")
        # Loopback only: the head gets a network namespace of its own that holds nothing but `lo`
        # (--network=none), and every worker joins that namespace. Ray listens on 0.0.0.0 whatever
        # --node-ip-address says; with --network=host that exposed GCS, raylets and agents on every
        # host interface. Workers removed first (remove_all pops the last started).
        self.cids["head"] = self.containers.start(
            self.nodes[0],
            _RAY_START + ["--head", "--include-dashboard=false", "--node-name=head", *self.ports[0].args()],
            self.run_id,
            network="none",
        )
        # Workers started before the head's GCS listens can give up and exit (seen under load
        # on a cold CI machine); start them only once the GCS port accepts connections.
        self.reporter.step("waiting for the head's GCS")
        _wait_for_gcs(self.containers, self.cids["head"], self.ports[0].gcs, self.deadline)

    def start_worker(self, node: NodeSpec) -> str:
        """Start (or restart) one worker in the head's network namespace."""
        p = self.ports[[n.name for n in self.nodes].index(node.name)]
        argv = _RAY_START + [f"--address={self.gcs}", f"--node-name={node.name}", *p.args()]
        self.reporter.step(f"starting {node.name} ({node.image})")
        self.cids[node.name] = self.containers.start(node, argv, self.run_id, network=f"container:{self.cids['head']}")
        return self.cids[node.name]

    def probe_config(self, packages: list[str]) -> dict:
        """What the cluster probe in the head is told: the nodes to wait for, the packages to report."""
        return {
            "mode": "cluster",
            "address": self.gcs,
            "giveup": f"/tmp/build-image-ray-check-{self.run_id}.giveup",
            "nodes": [n.name for n in self.nodes],
            "packages": packages,
            "timeout": max(5.0, self.deadline - time.monotonic() - 10),
            "sums": {n.name: n.sums for n in self.nodes},
        }


def _report_alone(
    cl: _Cluster, node: NodeSpec, packages: list[str], joined: set[str], driver_error: str | None
) -> NodeReport:
    """The report of a node that did not report from the cluster: its container probed alone,
    with why it did not join (or, for the head, why the driver failed)."""
    cl.reporter.step(f"{node.name} did not report from the cluster; probing its container alone")
    why = _why_not_joined(cl.containers, cl.cids[node.name])
    doc = _probe_alone(cl.containers, cl.cids[node.name], node, packages)
    in_cluster = node.name in joined or (node.name == "head" and driver_error is None)
    rep = NodeReport.from_dict(doc or {}, node=node.name, image=node.image, joined=in_cluster)
    if node.name == "head" and driver_error:
        why = driver_error if cl.containers.running(cl.cids["head"]) else why
    rep.error = why if not rep.joined else (rep.error or "its pinned task did not return")
    if doc is None:
        rep.error = (rep.error or "") + " (and probing the container alone failed too)"
    return rep


def _drive(
    containers: Containers,
    cids: dict[str, str],
    nodes: list[NodeSpec],
    cfg: dict,
    deadline: float,
    *,
    restart: Callable[[NodeSpec], str] | None = None,
    reporter: Reporter = SILENT,
) -> dict:
    """Run the cluster probe in the head; give up early when a node's container has exited.

    A worker whose container exits before joining is restarted once (its reason is said):
    a transient start-up failure on a loaded machine must not read as a version mismatch.
    A node Ray refuses (version mismatch) exits again, and then the survivors report."""
    restarted: set[str] = set()
    proc = containers.engine.popen(
        ["exec", "-i", cids["head"], PYTHON, "-", json.dumps(cfg)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out: list[tuple[str, str]] = []
    reader = threading.Thread(target=lambda: out.append(proc.communicate(PROBE_SCRIPT)), daemon=True)
    reader.start()
    gave_up = False
    try:
        while reader.is_alive():
            reader.join(timeout=1.0)
            if not reader.is_alive():
                break
            if time.monotonic() > deadline + 15:  # the script has its own deadline; this is a backstop
                proc.kill()
                reader.join(timeout=10)
                break
            exited = [] if gave_up else [n for n in nodes[1:] if not containers.running(cids[n.name])]
            retry = [n for n in exited if restart is not None and n.name not in restarted]
            for n in retry:
                reporter.step(
                    f"{n.name} exited before joining ({explain_log(containers.logs(cids[n.name], 60))}); "
                    "restarting it once"
                )
                restarted.add(n.name)
                restart(n)
            if exited and not retry:
                # a worker's container exited again (Ray refused it): the survivors report now
                containers.exec_sh(cids["head"], f"touch {cfg['giveup']}")
                gave_up = True
    finally:
        if proc.poll() is None:
            proc.kill()
    stdout, stderr = out[0] if out else ("", "")
    answer = _parse_marker(stdout or "")
    if answer is None:
        answer_error = explain_log((stderr or "") + "\n" + (stdout or ""))
        return {"error": f"the probe in the head failed: {answer_error}"}
    return answer


def explain_log(log: str) -> str:
    """The part of a Ray node's log that says why it stopped (pure; the last error and what follows)."""
    lines = [ln.rstrip() for ln in log.splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if "mismatch" in lines[i].lower():
            return " ".join(" ".join(ln.split()) for ln in lines[i : i + 8])[:600]
    for i in range(len(lines) - 1, -1, -1):
        if "Error" in lines[i] or "error:" in lines[i].lower():
            return " ".join(" ".join(ln.split()) for ln in lines[i : i + 3])[:600]
    return " ".join(lines[-2:])[:600] if lines else "no output"


_GCS_PROBE = (
    "import socket, sys\n"
    "s = socket.socket(); s.settimeout(1.0)\n"
    "sys.exit(0 if s.connect_ex(('127.0.0.1', int(sys.argv[1]))) == 0 else 1)\n"
)


def _wait_for_gcs(containers: Containers, head_cid: str, port: int, deadline: float) -> None:
    """Block until the head's GCS accepts TCP connections, the head exits, or the deadline;
    in the last two cases return anyway (the join step then reports why)."""
    while time.monotonic() < deadline:
        if containers.exec_python(head_cid, _GCS_PROBE, str(port), timeout=30).returncode == 0:
            return
        if not containers.running(head_cid):
            return
        time.sleep(0.5)


def _why_not_joined(containers: Containers, cid: str) -> str:
    if containers.running(cid):
        return "its container is running but the node did not register with the head before the timeout"
    return "its container exited: " + explain_log(containers.logs(cid, 60))


def _probe_alone(containers: Containers, cid: str, node: NodeSpec, packages: list[str]) -> dict | None:
    arg = json.dumps({"mode": "local", "packages": packages, "sums": node.sums})
    if containers.running(cid):
        proc = containers.exec_python(cid, PROBE_SCRIPT, arg, timeout=60)
    else:
        proc = containers.run_python(node, PROBE_SCRIPT, arg, timeout=60)
    return _parse_marker(proc.stdout)
