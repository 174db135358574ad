"""The target GPU against the image's CUDA binaries, and the driver floor of the image's CUDA.

* :func:`capability_of`: a GPU model (nvidia-smi's name, ``[serving] gpu_model``, ``--gpu-model``) ->
  compute capability, from the table ``lockfiles/gate/gpus.toml`` (or an explicit ``sm_XY``); a model the
  table does not know is refused, naming the known ones.
* :func:`~builder.resolve.fatbin.covers`: SASS for ``sm_XY`` runs on GPUs of major X and minor >= Y; PTX
  for ``compute_XY`` is compiled by the driver for any GPU >= XY.
* :func:`check`: each distribution of the base manifest that records architectures (``cuda_sass``,
  ``cuda_ptx``: :mod:`builder.resolve.fatbin`); torch's and vllm's are required to cover the GPU (their
  kernels run on every request), the others are notes (a kernel library vLLM uses only on some GPUs).
* :func:`driver_floor`: the oldest driver that runs the image's CUDA major (``lockfiles/gate/cuda-drivers.toml``).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from builder import data
from builder.errors import BadInput, VerdictFailure
from builder.resolve.fatbin import covers
from builder.resolve.manifest import BaseManifest
from builder.validate import load_toml, read_bounded_text

#: the distributions whose kernels must cover the target GPU (the others' gaps are notes)
REQUIRED = ("torch", "vllm")
# ASCII digits, major 1-99 (``sm_00``, ``0.0``, Arabic-Indic digits name no GPU)
_SM = re.compile(r"^(?:sm_?)?([1-9][0-9]?)([0-9])$|^([1-9][0-9]?)\.([0-9])$")
# a Kubernetes label value (nvidia.com/gpu.product): at most 63, alphanumeric at both ends
_LABEL_VALUE = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_DROP = ("nvidia", "tesla", "geforce")


@functools.cache
def _table(rel: str) -> dict:
    path = data.path(rel)
    return load_toml(read_bounded_text(path, rel), str(path))


def gpu_table() -> dict[str, int]:
    """Model name (lower case, without vendor words) -> compute capability x 10."""
    doc = _table("lockfiles/gate/gpus.toml")
    return {name: int(cc.replace(".", "")) for name, cc in doc["capability"].items()}


def _words(model: str) -> list[str]:
    return [w for w in re.split(r"[\s_/-]+", model.strip().lower()) if w and w not in _DROP]


@dataclass(frozen=True)
class GpuTarget:
    model: str  # as given
    capability: int  # compute capability x 10 (90 = 9.0)
    matched: str  # the table's name, or "sm_XY" when given so

    @property
    def sm(self) -> str:
        return f"sm_{self.capability}"

    @property
    def dotted(self) -> str:
        return f"{self.capability // 10}.{self.capability % 10}"


def capability_of(model: str, where: str = "--gpu-model") -> GpuTarget:
    """The compute capability of ``model``: an ``sm_XY`` / ``X.Y`` given as such, else the longest table name
    whose words start the model's (``NVIDIA H100 80GB HBM3`` -> ``h100``); BadInput for any other."""
    m = _SM.match(model.strip().lower())
    if m:
        major, minor = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        return GpuTarget(model, int(major) * 10 + int(minor), f"sm_{major}{minor}")
    words = _words(model)
    table = gpu_table()
    best = max((n for n in table if words[: len(n.split())] == n.split()), key=lambda n: len(n.split()), default=None)
    if best is None:
        raise BadInput(
            f"{where} {model!r:.80}: not a GPU model build-image knows (lockfiles/gate/gpus.toml: "
            f"{', '.join(sorted(table))}).",
            hint="give nvidia-smi's model name (\"NVIDIA H200\"), or its compute capability as sm_XY (sm_90).",
        )
    return GpuTarget(model, table[best], best)


def product_label(model: str, where: str = "serving.gpu_model") -> str:
    """The GPU feature discovery label ``nvidia.com/gpu.product`` a node with the GPU ``model`` carries:
    nvidia-smi's name with '-' for spaces (``NVIDIA H100 80GB HBM3`` -> ``NVIDIA-H100-80GB-HBM3``).  BadInput
    for a compute capability (``sm_90`` names no product) or a name that is no label value (a node
    selector on it would match no node, or the API server refuses the manifest)."""
    product = re.sub(r"\s+", "-", model.strip())
    if _SM.match(model.strip().lower()) or not _LABEL_VALUE.fullmatch(product):
        raise BadInput(
            f"{where} {model!r:.80}: a node affinity needs the GPU's product name as nvidia-smi prints it "
            "(the nvidia.com/gpu.product label: letters, digits, '-', '_', '.', spaces, at most 63), not "
            "a compute capability or another text.",
            hint='give nvidia-smi\'s model name, e.g. "NVIDIA H200".',
        )
    return product


def image_cuda_major(manifest: BaseManifest) -> int | None:
    """The image's CUDA major: the manifest's ``cuda`` (13.0), else the newest runtime its binaries link."""
    if manifest.cuda and manifest.cuda.split(".")[0].isdigit():
        return int(manifest.cuda.split(".")[0])
    runtimes = [d.facts.cuda_runtime for d in manifest.distributions.values() if d.facts.cuda_runtime]
    return max(runtimes, default=None)


def driver_floor(cuda_major: int | None) -> str | None:
    """The oldest Linux driver that runs CUDA ``cuda_major`` applications (None: not in the table)."""
    if cuda_major is None:
        return None
    return _table("lockfiles/gate/cuda-drivers.toml")["floor"].get(str(cuda_major))


@dataclass
class GpuCheck:
    """The target GPU (None: none given) against a base manifest's CUDA binaries."""

    target: GpuTarget | None
    cuda_major: int | None
    floor: str | None
    covered: list[str] = field(default_factory=list)  # "torch 2.14.0"
    uncovered: list[tuple[str, list[int], list[int]]] = field(default_factory=list)  # required, not covering
    notes: list[str] = field(default_factory=list)
    recorded: bool = False  # the manifest records architectures at all

    def to_dict(self) -> dict:
        t = self.target
        return {
            "gpu_model": t.model if t else None,
            "compute_capability": t.dotted if t else None,
            "cuda_major": self.cuda_major,
            "driver_floor": self.floor,
            "covered_by": list(self.covered),
            "not_covered_by": [n for n, _, _ in self.uncovered],
            "notes": list(self.notes),
        }


def check(manifest: BaseManifest, target: GpuTarget | None) -> GpuCheck:
    """The driver floor of the image's CUDA and, for a target GPU, which of its CUDA binaries cover it."""
    major = image_cuda_major(manifest)
    out = GpuCheck(target=target, cuda_major=major, floor=driver_floor(major))
    dists = [d for _, d in sorted(manifest.distributions.items()) if d.facts.cuda_sass or d.facts.cuda_ptx]
    out.recorded = bool(dists)
    if target is None:
        return out
    if not dists:
        out.notes.append(
            f"the base manifest records no GPU architectures (made before build-image read fat binaries): "
            f"{target.sm} is not checked; regenerate it with `build-image base snapshot`"
        )
    for d in dists:
        name = f"{d.name} {d.version}"
        if covers(d.facts.cuda_sass, d.facts.cuda_ptx, target.capability):
            out.covered.append(name)
        elif d.key in REQUIRED:
            out.uncovered.append((name, d.facts.cuda_sass, d.facts.cuda_ptx))
        else:
            out.notes.append(f"{name} has no kernels for {target.sm} ({_archs(d.facts.cuda_sass, d.facts.cuda_ptx)})")
    return out


def _archs(sass: list[int], ptx: list[int]) -> str:
    parts = [
        f"SASS {' '.join(f'sm_{a}' for a in sass)}" if sass else "",
        f"PTX {' '.join(f'compute_{a}' for a in ptx)}" if ptx else "",
    ]
    return "; ".join(p for p in parts if p) or "none"


def render(c: GpuCheck) -> list[str]:
    """The lines ``plan`` prints."""
    lines = []
    if c.floor:
        lines.append(f"driver floor: the image's CUDA {c.cuda_major} needs an NVIDIA driver >= {c.floor} on the node")
    elif c.cuda_major is not None:
        lines.append(f"driver floor: CUDA {c.cuda_major} is not in build-image's driver table (lockfiles/gate)")
    if c.target is not None:
        t = c.target
        if c.covered:
            lines.append(
                f"GPU {t.model} ({t.matched}, compute capability {t.dotted}): kernels of {', '.join(c.covered)}"
            )
        lines += [f"note: {n}" for n in c.notes]
    return lines


def refuse_uncovered(c: GpuCheck) -> None:
    """VerdictFailure (exit 1) naming each required binary whose kernels do not cover the target GPU."""
    if c.target is None or not c.uncovered:
        return
    t = c.target
    what = "; ".join(f"{n} ({_archs(s, p)})" for n, s, p in c.uncovered)
    raise VerdictFailure(
        f"the image's kernels do not cover the GPU {t.model} ({t.sm}, compute capability {t.dotted}): {what}. "
        "vLLM would fail with 'no kernel image is available for execution on the device'.",
        hint="serve on a GPU these architectures cover, or use a release built for this GPU "
        "(a newer vLLM / torch whose wheels carry its architecture).",
    )
