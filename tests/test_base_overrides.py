"""The override pins of an image's UV_OVERRIDE, as a snapshot reads them: what uv applies to every install in the
image (vllm/vllm-openai pins NCCL so), which the lock must resolve with and the overlay's install must not take
as unhashed requirements."""

import pytest

from builder.errors import BadInput
from builder.resolve.base import override_files, parse_override_pins


def test_override_files_are_uvs_space_separated_list():
    assert override_files({"UV_OVERRIDE": "/etc/uv-overrides.txt"}) == ["/etc/uv-overrides.txt"]
    assert override_files({"UV_OVERRIDE": " /a.txt  /b.txt "}) == ["/a.txt", "/b.txt"]
    assert override_files({"UV_OVERRIDE": ""}) == []
    assert override_files({"PATH": "/usr/bin"}) == []


def test_pins_are_read_with_comments_and_blank_lines_left_out():
    text = "# pinned by the image\nnvidia-nccl-cu13==2.31.2  # NCCL for CUDA 13\n\n"
    text += "torch==2.14.0 ; sys_platform == 'linux'\n"
    assert parse_override_pins(text, "img:/etc/uv-overrides.txt") == [
        "nvidia-nccl-cu13==2.31.2",
        'torch==2.14.0; sys_platform == "linux"',
    ]
    assert parse_override_pins("", "img:/etc/uv-overrides.txt") == []


@pytest.mark.parametrize(
    "line", ["-r other.txt", "--index-url https://example.invalid/simple", "nccl===", "not a req!"]
)
def test_a_line_the_lock_cannot_replay_is_refused_naming_file_and_line(line):
    with pytest.raises(BadInput) as exc:
        parse_override_pins(f"numpy==2.3.5\n{line}\n", "vllm/vllm-openai:v0.34.0:/etc/uv-overrides.txt")
    assert "vllm/vllm-openai:v0.34.0:/etc/uv-overrides.txt:2" in str(exc.value)
