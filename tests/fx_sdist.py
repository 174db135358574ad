"""Fixture: a small vllm sdist whose build files have the shapes of the real releases' files.

``DOCKERFILE``, ``PIPELINE`` and ``REQUIREMENTS`` are hand-written miniatures of a release's
docker/Dockerfile (global ARGs overridden by the pipeline, a stage chain to ``vllm-openai``, a
UV_OVERRIDE file, an install behind a CUDA-major test, an off-index install, the vllm wheel
from stage build, a source-built wheel, a kv step with a ``|| ( ... )`` fallback, freeze
constraints and a swap that depends on what is installed) and its release pipeline.
``write_sdist(dir, version, files)`` packs them like ``python -m build --sdist`` does
(``vllm-X/`` top folder, gzip) and returns the path.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

DOCKERFILE = """\
# a miniature of vllm's docker/Dockerfile
ARG CUDA_VERSION=13.0.3
ARG PYTHON_VERSION=3.12
ARG UBUNTU_VERSION=22.04
ARG NCCL_VERSION=2.30.7
ARG FINAL_BASE_IMAGE=nvidia/cuda:${CUDA_VERSION}-base-ubuntu${UBUNTU_VERSION}
ARG INSTALL_KV_CONNECTORS=false
ARG PYTORCH_CUDA_INDEX_BASE_URL=https://download.example.invalid/whl

FROM ${FINAL_BASE_IMAGE} AS build
RUN pip install nothing-that-counts

FROM ${FINAL_BASE_IMAGE} AS vllm-runtime-base
ARG CUDA_VERSION
ARG PYTHON_VERSION
ARG NCCL_VERSION
RUN apt-get update -y \\
    && apt-get install -y --no-install-recommends python${PYTHON_VERSION} \\
    && update-alternatives --install /usr/bin/python3 python3 /usr/bin/python${PYTHON_VERSION} 1
RUN python3 -m pip install uv
RUN CUDA_MAJOR=$(echo $CUDA_VERSION | cut -d. -f1) && \\
    if [ -n "$NCCL_VERSION" ]; then \\
        echo "nvidia-nccl-cu${CUDA_MAJOR}==${NCCL_VERSION}" \\
            > /etc/uv-overrides.txt; \\
    else \\
        touch /etc/uv-overrides.txt; \\
    fi
ENV UV_OVERRIDE=/etc/uv-overrides.txt
ARG PYTORCH_CUDA_INDEX_BASE_URL
COPY requirements/cuda.txt /tmp/requirements-cuda.txt
RUN --mount=type=cache,target=/opt/uv/cache \\
    if [ "$(echo $CUDA_VERSION | cut -d. -f1)" = "12" ]; then \\
        sed -i 's/^a/b/' /tmp/requirements-cuda.txt; \\
    fi && \\
    uv pip install --system -r /tmp/requirements-cuda.txt \\
        --extra-index-url ${PYTORCH_CUDA_INDEX_BASE_URL}/cu$(echo $CUDA_VERSION | cut -d. -f1,2 | tr -d '.')
ARG JIT_VERSION=0.6.14
RUN uv pip install --system jit-cache==${JIT_VERSION} \\
        --index-url https://jit.example.invalid/whl/cu$(echo $CUDA_VERSION | cut -d. -f1,2 | tr -d '.')
ARG TIMM_VERSION=">=1.0.17"
RUN uv pip install --system accelerate "timm${TIMM_VERSION}"

FROM vllm-runtime-base AS vllm-base
ARG PYTORCH_CUDA_INDEX_BASE_URL
ARG PYTORCH_NIGHTLY
RUN --mount=type=bind,from=build,src=/workspace/dist,target=/vllm-workspace/dist \\
    if [ "${PYTORCH_NIGHTLY}" = "1" ]; then \\
        uv pip install --system $(cat torch_lib_versions.txt | xargs) --pre; \\
    else \\
        uv pip install --system dist/*.whl --verbose \\
        --extra-index-url ${PYTORCH_CUDA_INDEX_BASE_URL}/cu$(echo $CUDA_VERSION | cut -d. -f1,2 | tr -d '.'); \\
    fi
RUN --mount=type=bind,from=build,src=/tmp/ep_kernels_workspace/dist,target=/vllm-workspace/ep_kernels/dist \\
    uv pip install --system ep_kernels/dist/*.whl --verbose

FROM vllm-base AS vllm-openai-base
ARG INSTALL_KV_CONNECTORS=false
ARG CUDA_VERSION
RUN --mount=type=bind,source=requirements,target=/tmp/vllm-requirements,ro \\
    set -eu; \\
    CUDA_MAJOR="${CUDA_VERSION%%.*}"; \\
    if [ "$INSTALL_KV_CONNECTORS" = "true" ]; then \\
        uv pip freeze --system > /tmp/kv-installed.txt; \\
        grep -E '^(torch|triton)==' /tmp/kv-installed.txt > /tmp/kv-constraints.txt; \\
        uv pip install --system -c /tmp/kv-constraints.txt -r /tmp/vllm-requirements/kv_connectors.txt --no-build || ( \\
            # if the above fails, install from source
            apt-get update -y && \\
            uv pip install --system -r /tmp/vllm-requirements/kv_connectors.txt --no-build-isolation \\
        ); \\
        MOON=$(python3 -c "import importlib.metadata as m; print(m.version('moon-engine'))" 2>/dev/null || true) && \\
        if [ "${CUDA_MAJOR}" = "13" ] && [ -n "${MOON}" ]; then \\
            uv pip uninstall --system moon-engine 2>/dev/null || true; \\
            uv pip install --system -c /tmp/kv-constraints.txt "moon-engine-cuda13==${MOON}"; \\
        fi; \\
    fi

FROM vllm-openai-base AS vllm-sagemaker
RUN uv pip install --system sagemaker-only

FROM vllm-openai-base AS vllm-openai
ENTRYPOINT ["vllm", "serve"]
"""  # noqa: E501 - verbatim Dockerfile text

PIPELINE = """\
env:
  ARCH_LIST: "9.0 10.0"
steps:
  - label: "Build wheel - x86_64 - CUDA 13.0"
    commands:
      - "docker build --build-arg CUDA_VERSION=12.9.1 --target build -f docker/Dockerfile ."
  - label: "Publish release images"
    commands:
      - "docker manifest create vllm/vllm-openai:v$RELEASE_VERSION r:$BUILDKITE_COMMIT-x86_64"
      - "docker manifest push vllm/vllm-openai:v$RELEASE_VERSION"
  - group: "Build release Docker images"
    steps:
      - label: "Build release image - x86_64 - CUDA 13.0"
        commands:
          - |
            DOCKER_BUILDKIT=1 docker build \\
              $(bash .buildkite/scripts/docker-build-metadata-args.sh) \\
              --build-arg CUDA_VERSION=13.0.2 \\
              --build-arg torch_cuda_arch_list="${ARCH_LIST}" \\
              --build-arg INSTALL_KV_CONNECTORS=true \\
              --build-arg UBUNTU_VERSION=24.04 \\
              --target vllm-openai \\
              -f docker/Dockerfile .
          - "docker push r:$BUILDKITE_COMMIT-$(uname -m)"
"""

REQUIREMENTS = {
    "requirements/common.txt": "numpy\nrequests >= 2.0\n",
    "requirements/cuda.txt": "-r common.txt\n--extra-index-url https://jit.example.invalid/whl/\ntorch==2.11.0\n"
    "jit-cubin==0.6.14\n",
    "requirements/kv_connectors.txt": "moon-engine >= 0.3\n",
}


def build_files(dockerfile: str = DOCKERFILE, pipeline: str = PIPELINE, requirements=None) -> dict[str, str]:
    files = {"docker/Dockerfile": dockerfile, ".buildkite/release-pipeline.yaml": pipeline}
    files.update(REQUIREMENTS if requirements is None else requirements)
    return {k: v for k, v in files.items() if v is not None}


def write_sdist(folder: Path, version: str, files: dict[str, str]) -> Path:
    path = Path(folder) / f"vllm-{version}.tar.gz"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for rel, text in sorted({**files, "PKG-INFO": f"Name: vllm\nVersion: {version}\n"}.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-{version}/{rel}")
            info.size = len(data)
            info.mtime = 0
            tf.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return path


TARGET_FROM = "FROM vllm-openai-base AS vllm-openai"


def files_with(lines: str, extra: dict[str, str] | None = None, *, stage: str = TARGET_FROM) -> dict[str, str]:
    """The miniature's build files with ``lines`` added right after the ``stage`` line."""
    files = build_files()
    d = files["docker/Dockerfile"].split("\n")
    i = d.index(stage)
    d[i + 1 : i + 1] = lines.split("\n")
    files["docker/Dockerfile"] = "\n".join(d)
    files.update(extra or {})
    return files
