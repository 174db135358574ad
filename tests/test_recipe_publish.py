"""Which build step's image the release publishes as vllm/vllm-openai:vX: read from the pipeline's publish
commands and the scripts they call (builder/resolve/recipe/publish.py), per platform and per variant."""

from __future__ import annotations

import pytest

from builder import platforms as P
from builder.errors import BadInput
from builder.resolve import recipe as R
from builder.resolve.recipe.publish import normalise_variant, published_images, publishing_step
from tests.fx_sdist import build_files

# two CUDA builds per machine, as vLLM 0.14-0.19 had them: the CUDA 12.9 steps push the plain staging tag,
# the CUDA 13.0 steps the -cu130 one; which one is vX is said by the publish script alone
STEPS = """\
steps:
  - label: "Build release image - x86_64 - CUDA 12.9"
    agents:
      queue: cpu_queue_release
    commands:
      - "docker build --build-arg CUDA_VERSION=12.9.1 --tag r:$BUILDKITE_COMMIT-$(uname -m) --target vllm-openai -f docker/Dockerfile ."
  - label: "Build release image - aarch64 - CUDA 12.9"
    agents:
      queue: arm64_cpu_queue_release
    commands:
      - "docker build --build-arg CUDA_VERSION=12.9.1 --tag r:$BUILDKITE_COMMIT-$(uname -m) --target vllm-openai -f docker/Dockerfile ."
  - label: "Build release image - x86_64 - CUDA 13.0"
    commands:
      - "docker build --build-arg CUDA_VERSION=13.0.2 --target vllm-openai -f docker/Dockerfile ."
      - "docker push r:$BUILDKITE_COMMIT-$(uname -m)-cu130"
  - label: "Build release image - aarch64 - CUDA 13.0"
    commands:
      - "docker build --build-arg CUDA_VERSION=13.0.2 --target vllm-openai -f docker/Dockerfile ."
      - "docker push r:$BUILDKITE_COMMIT-$(uname -m)-cu130"
  - label: "Publish release images to DockerHub"
    commands:
      - "bash .buildkite/scripts/publish.sh"
"""  # noqa: E501 - a pipeline's one-line commands

# the publish script in the form of vLLM 0.34's: a function per image family, a loop over the machines
SCRIPT = """\
#!/bin/bash
set -euo pipefail
RELEASE_VERSION=$(buildkite-agent meta-data get release-version | sed 's/^v//')
COMMIT="$BUILDKITE_COMMIT"

publish_family() {
  local suffix="$1" arch
  local staging="r"
  local versioned="vllm/vllm-openai:v${RELEASE_VERSION}${suffix}"
  for arch in x86_64 aarch64; do
    docker tag "${staging}:${COMMIT}-${arch}${suffix}" "vllm/vllm-openai:v${RELEASE_VERSION}-${arch}${suffix}"
    docker push "vllm/vllm-openai:v${RELEASE_VERSION}-${arch}${suffix}"
  done
  docker manifest create "${versioned}" \\
    "vllm/vllm-openai:v${RELEASE_VERSION}-x86_64${suffix}" \\
    "vllm/vllm-openai:v${RELEASE_VERSION}-aarch64${suffix}"
  docker manifest push "${versioned}"
}

if [ "${1:-all}" = all ]; then
  publish_family ""
  publish_family "-cu130"
fi
"""


def _files(pipeline: str = STEPS, script: str | None = SCRIPT) -> R.BuildFiles:
    files = build_files(pipeline=pipeline)
    if script is not None:
        files[".buildkite/scripts/publish.sh"] = script
    return R.BuildFiles("0.99.0", R.SdistRef("vllm-0.99.0.tar.gz", "0" * 64), files)


def test_the_plain_tag_is_the_step_the_publish_script_joins_not_the_cuda_13_label():
    pubs = published_images(_files())
    assert [(p.platform, p.step) for p in pubs] == [
        (P.AMD64, "Build release image - x86_64 - CUDA 12.9"),
        (P.ARM64, "Build release image - aarch64 - CUDA 12.9"),
    ]
    # the lines from the tag back: the manifest create, then the per-machine tag (both in the script)
    assert [str(w) for w in pubs[0].where] == [".buildkite/scripts/publish.sh:14", ".buildkite/scripts/publish.sh:11"]
    r = R.derive(_files())
    assert r.pipeline_step.value == "Build release image - x86_64 - CUDA 12.9" and r.cuda.value == "12.9"
    assert r.image == "vllm/vllm-openai:v0.99.0" and r.to_json()["published"]["step"] == r.pipeline_step.value


def test_a_variant_selects_the_step_published_under_its_suffix():
    r = R.derive(_files(), variant="cu130")
    assert (r.image, r.pipeline_step.value, r.cuda.value) == (
        "vllm/vllm-openai:v0.99.0-cu130",
        "Build release image - x86_64 - CUDA 13.0",
        "13.0",
    )
    assert R.derive(_files(), variant="-cu130", platform=P.ARM64).pipeline_step.value.startswith(
        "Build release image - aarch64 - CUDA 13.0"
    )
    with pytest.raises(BadInput, match=r"publishes vllm/vllm-openai:v0.99.0-cu129\. It publishes .*v0.99.0-cu130"):
        R.derive(_files(), variant="cu129")
    with pytest.raises(BadInput, match="is not a tag suffix"):
        normalise_variant("cu 129; rm")


def test_a_push_script_that_joins_only_x86_64_does_not_publish_arm64():
    script = SCRIPT.replace('\\\n    "vllm/vllm-openai:v${RELEASE_VERSION}-aarch64${suffix}"', "")
    assert [p.platform for p in published_images(_files(script=script))] == [P.AMD64]
    with pytest.raises(BadInput, match=r"does not publish vllm/vllm-openai:v0.99.0 for linux/arm64"):
        publishing_step(_files(script=script), P.ARM64)


def test_a_publish_script_the_files_lack_is_named():
    with pytest.raises(BadInput) as exc:
        R.derive(_files(script=None))
    assert "no command in .buildkite/release-pipeline.yaml or the scripts it calls publishes" in exc.value.message
    assert ".buildkite/release-pipeline.yaml:22 calls .buildkite/scripts/publish.sh, which the files lack" in (
        exc.value.message
    )


def test_two_steps_pushing_one_image_or_one_tag_made_two_ways_is_exit_2_naming_the_lines():
    twice = STEPS.replace("--tag r:$BUILDKITE_COMMIT-$(uname -m) --target", "--tag r:$BUILDKITE_COMMIT-x86_64 --target")
    with pytest.raises(BadInput, match=r"r:\{commit\}-x86_64 .* is pushed by 2 build steps: 'Build release image - "):
        R.derive(_files(pipeline=twice))
    other = SCRIPT + 'docker tag r:${COMMIT}-x86_64-cu130 "vllm/vllm-openai:v${RELEASE_VERSION}"\n'
    with pytest.raises(
        BadInput, match=r"make vllm/vllm-openai:v0.99.0 in 2 different ways \(.*publish.sh:14: .*publish.sh:24"
    ):
        R.derive(_files(script=other))


def test_a_step_whose_machine_label_and_queue_disagree_is_undecided():
    wrong = STEPS.replace("queue: arm64_cpu_queue_release", "queue: cpu_queue_release").replace(
        "queue: cpu_queue_release\n    commands:\n      - \"docker build --build-arg CUDA_VERSION=12.9.1",
        "queue: arm64_cpu_queue_release\n    commands:\n      - \"docker build --build-arg CUDA_VERSION=12.9.1",
        1,
    )
    with pytest.raises(BadInput, match=r"release-pipeline.yaml:2: the step 'Build release image - x86_64 - CUDA 12.9'"):
        R.derive(_files(pipeline=wrong))


def test_base_recipe_takes_variant_and_refuses_writing_it_into_the_shipped_file(tmp_path):
    from tests.conftest import run
    from tests.fx_sdist import write_sdist

    sd = write_sdist(tmp_path, "0.99.0", dict(_files().files))
    code, out = run("base", "recipe", "--sdist", str(sd), "--variant", "cu130")
    assert code == 0 and "vllm/vllm-openai:v0.99.0-cu130" in out and "CUDA 13.0" in out
    code, out = run("base", "recipe", "--vllm", "0.99.0", "--variant", "cu130", "--write")
    assert code == 2 and "--write with --variant needs --recipes FILE" in out
    code, out = run("base", "reconstruct", "--vllm", "0.99.0", "--variant", "cu130")
    assert code == 2 and "--variant needs -o FILE" in out
