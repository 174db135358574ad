"""The one image-reference parser (builder.values.split_ref / parse_ref / ImageRef) and its users: the engine's
registry_of, the snapshot's repository match, the registry client and the KubeRay manifests."""

from __future__ import annotations

import pytest

from builder import values
from builder.errors import BadInput

D = "sha256:" + "a" * 64


@pytest.mark.parametrize(
    "ref, parts",
    [
        ("127.0.0.1:5000/serving/vllm:vllm0.26.0-abc", ("127.0.0.1:5000", "serving/vllm", "vllm0.26.0-abc", None)),
        ("registry.example.com:443/team/img", ("registry.example.com:443", "team/img", None, None)),
        ("localhost/x", ("localhost", "x", None, None)),
        ("localhost:5000/a/b:1", ("localhost:5000", "a/b", "1", None)),
        (f"127.0.0.1:5000/a/b@{D}", ("127.0.0.1:5000", "a/b", None, D)),
        (f"vllm/vllm-openai:v0.26.0@{D}", ("docker.io", "vllm/vllm-openai", "v0.26.0", D)),
        (f"ubuntu@{D}", ("docker.io", "library/ubuntu", None, D)),
        ("ubuntu", ("docker.io", "library/ubuntu", None, None)),
        ("ubuntu:22.04", ("docker.io", "library/ubuntu", "22.04", None)),
        # the first component names a registry only with a '.', a ':' or as localhost, and only before a '/'
        ("team/img", ("docker.io", "team/img", None, None)),
        ("docker.io/library/ubuntu", ("docker.io", "library/ubuntu", None, None)),
        # Docker Hub named explicitly keeps the path as written (the registry client's rule since its first day)
        ("docker.io/ubuntu", ("docker.io", "ubuntu", None, None)),
    ],
)
def test_parts(ref, parts):
    for r in (values.split_ref(ref), values.parse_ref(ref), values.ImageRef(ref, "f").parts):
        assert (r.registry, r.repository, r.tag, r.digest) == parts
    assert values.ImageRef(ref, "f") == ref  # the value is the text as given


def test_reference_and_canonical_form():
    assert values.parse_ref("ubuntu").reference == "latest"
    assert values.parse_ref("ubuntu:22.04").reference == "22.04"
    assert values.parse_ref(f"a:1@{D}").reference == D
    assert str(values.parse_ref("ubuntu:22.04")) == "docker.io/library/ubuntu:22.04"
    assert str(values.parse_ref(f"127.0.0.1:5000/a:1@{D}")) == f"127.0.0.1:5000/a:1@{D}"


@pytest.mark.parametrize(
    "ref, name",
    [
        ("docker.io/library/ubuntu:22.04", "ubuntu"),
        (f"ubuntu@{D}", "ubuntu"),
        ("index.docker.io/library/ubuntu", "ubuntu"),
        ("registry-1.docker.io/team/img", "team/img"),
        ("library/ubuntu", "ubuntu"),
        ("docker.io/library/a/b", "library/a/b"),
        ("127.0.0.1:5000/team/img:1", "127.0.0.1:5000/team/img"),
        ("127.0.0.1:5000/team/img", "127.0.0.1:5000/team/img"),
        ("localhost/library/x", "localhost/library/x"),
        ("vllm/vllm-openai:v0.26.0", "vllm/vllm-openai"),
    ],
)
def test_familiar_name_folds_docker_hub_defaults(ref, name):
    assert values.split_ref(ref).familiar_name == name


@pytest.mark.parametrize(
    "bad, why",
    [
        ("", "is not valid"),
        ("a b", "is not valid"),
        ("Upper/Case:x", "repository 'Upper/Case' is not a valid name"),
        ("127.0.0.1:5000/Serving/vllm", "repository 'Serving/vllm' is not a valid name"),
        ("UBUNTU", "repository 'library/UBUNTU' is not a valid name"),
        ("x@sha256:123", r"digest 'sha256:123' is not sha256:<64 hex>"),
        ("x@", r"digest '' is not sha256:<64 hex>"),
        (f"x@sha256:{'A' * 64}", "is not sha256:<64 hex>"),
        ("ev$(id).io:5000/x", r"registry 'ev\$\(id\).io:5000' is not a host\[:port\]"),
        ("reg.io:port/x", r"registry 'reg.io:port' is not a host"),
        ("x:", "tag '' is not a valid tag"),
        ("reg.io/x:" + "t" * 200, "is not a valid tag"),
        ("reg.io/x:.t", "is not a valid tag"),
        ("/x", "repository '/x' is not a valid name"),
        ("a//b", "is not a valid name"),
    ],
)
def test_refused(bad, why):
    with pytest.raises(BadInput, match=why) as exc:
        values.parse_ref(bad)
    assert exc.value.message.startswith("image reference ")
    with pytest.raises(BadInput, match="^the field "):
        values.ImageRef(bad, "the field")


def test_split_never_raises():
    for text in ("", "@", "/", ":", "a b", "x@y@z", "Upper:5000/X:Y@Z"):
        values.split_ref(text)


def test_engine_registry_of():
    from builder.engine import registry_of

    assert registry_of("127.0.0.1:5000/a/b:1") == "127.0.0.1:5000"
    assert registry_of("localhost/x") == "localhost"
    assert registry_of("vllm/vllm-openai:v0.26.0") == "docker.io"
    assert registry_of(f"host:5000@{D}") == "docker.io"  # no '/': a name with a tag, not a registry


def test_kuberay_check_image_ref():
    from builder.serving.kuberay import check_image_ref

    assert check_image_ref(f" 127.0.0.1:5000/a/b@{D} ") == f"127.0.0.1:5000/a/b@{D}"
    assert check_image_ref(f"127.0.0.1:5000/a/b:1@{D}") == f"127.0.0.1:5000/a/b:1@{D}"
    assert check_image_ref("127.0.0.1:5000/a/b:1", allow_tag=True) == "127.0.0.1:5000/a/b:1"
    with pytest.raises(BadInput, match="is not pinned by digest"):
        check_image_ref("127.0.0.1:5000/a/b:1")
    for bad in ("", "Upper/x@" + D, "a b", "x@sha256:1"):
        with pytest.raises(BadInput, match="is not a valid image reference"):
            check_image_ref(bad, allow_tag=True)
