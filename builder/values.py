"""Typed values for what reaches a Dockerfile, a requirements/constraints line, a YAML document or a
shell hint: each constructor holds one grammar, and a value that is not in it is
:class:`builder.errors.BadInput` (exit 2) naming where it came from.

Every constructor refuses control characters (``\\n``, ``\\r``, ``\\t``, ESC, DEL, NUL and the Unicode line
separators), so no value can start a new Dockerfile instruction, a new lock line, a new YAML key or a
terminal escape sequence.  The values are ``str`` subclasses: a typed value is used wherever a string is,
and the generators (:func:`guard`, used as the Dockerfile template's ``finalize`` and by the lock writer)
take a typed value as it is and check any other string again, so a raw string that skipped its boundary
cannot carry a line break into a generated file.

* :class:`ImageRef` — ``[registry/]repo[:tag][@sha256:…]`` (the distribution reference grammar), split
  into its parts by :func:`split_ref` and checked by :func:`parse_ref` — the one image-reference parser the
  engine, the snapshot, the registry client and the KubeRay manifests use;
* :class:`Digest` — ``sha256:<64 lowercase hex>``;
* :class:`Registry` — ``host[:port]`` (DNS labels or an IPv4 address, ``localhost``);
* :class:`Repository` — ``[registry/]path`` without a tag or digest (``--tag``);
* :class:`DistName` — a PEP 508 distribution name;
* :class:`Version` — a PEP 440 version (the text as given);
* :class:`Url` — an ``http``/``https``/``file`` URL without spaces;
* :class:`PathText` — a file-system path (no control characters);
* :class:`Line` — one line of free text (a ``# via`` reason, a header value, a label).

Serving settings that the plan, ``smoke`` and the KubeRay manifests all use have one validator here each
(:func:`compile_cache`, :func:`model_cache`); ``kv_cache_dtype`` is checked against the release's facts by
``builder.serving.plan.check_kv_cache_dtype``, the one validator every command calls.

Pure: nothing here reads a file or the environment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from builder.errors import BadInput

#: characters no value may hold: C0 controls (tab, newline, carriage return, ESC, NUL), DEL, C1 controls,
#: and the Unicode line/paragraph separators (a YAML or terminal reader breaks lines on them)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
#: longest value of any kind (a base image reference, a wheel URL, a path)
MAX_LEN = 4096


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "…"


def control_free(value: Any, where: str, *, max_len: int = MAX_LEN) -> str:
    """``value`` when it is a string without control characters or line separators and at most ``max_len``
    characters; else BadInput naming ``where``."""
    if not isinstance(value, str):
        raise BadInput(f"{where} must be a string, got {type(value).__name__} {_show(value)}.")
    m = _CONTROL.search(value)
    if m:
        raise BadInput(
            f"{where} {_show(value)} holds a control character ({m.group(0)!r} at {m.start()}); "
            "a line break or an escape sequence in it would reach a generated file or the terminal."
        )
    if len(value) > max_len:
        raise BadInput(f"{where} is {len(value)} characters long, more than the {max_len} any such value has.")
    return value


class Value(str):
    """A string checked against its kind's grammar (:meth:`check`); construct with ``Kind(value, where)``
    (a value of exactly that kind is taken as it is)."""

    kind: ClassVar[str] = "value"
    pattern: ClassVar[re.Pattern | None] = None
    example: ClassVar[str] = ""
    max_len: ClassVar[int] = MAX_LEN

    def __new__(cls, value: Any, where: str | None = None) -> Value:
        if type(value) is cls:
            return value
        where = where or cls.kind
        text = control_free(value, where, max_len=cls.max_len)
        cls.check(text, where)
        return super().__new__(cls, text)

    @classmethod
    def check(cls, text: str, where: str) -> None:
        if cls.pattern is not None and not cls.pattern.fullmatch(text):
            raise BadInput(
                f"{where} {_show(text)} is not {cls.kind}" + (f" (like {cls.example})." if cls.example else ".")
            )

    @classmethod
    def optional(cls, value: Any, where: str | None = None) -> Value | None:
        """None for None, else the typed value."""
        return None if value is None else cls(value, where)


class Line(Value):
    kind = "one line of text"


class PathText(Value):
    kind = "a path"

    @classmethod
    def check(cls, text: str, where: str) -> None:
        if not text:
            raise BadInput(f"{where} is empty; a path was expected.")


_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*(?::[0-9]{{1,5}})?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_PATH = rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"sha256:[0-9a-f]{64}"


class Digest(Value):
    kind = "a sha256 digest"
    example = "sha256:<64 lowercase hex digits>"
    pattern = re.compile(_DIGEST)


class Registry(Value):
    kind = "a registry host[:port]"
    example = "127.0.0.1:5000 or registry.example.com"
    pattern = re.compile(_DOMAIN)
    max_len = 255


def _is_registry(first: str) -> bool:
    """Whether a reference's first component names a registry (the distribution spec's rule)."""
    return "." in first or ":" in first or first == "localhost"


class Repository(Value):
    """An image repository without a tag or digest (what ``--tag`` names): ``[registry/]path``."""

    kind = "an image repository (registry/path, without a tag or digest)"
    example = "127.0.0.1:5000/serving/vllm"
    rest: ClassVar[re.Pattern] = re.compile(_PATH)
    max_len = 255

    @classmethod
    def check(cls, text: str, where: str) -> None:
        first, sep, rest = text.partition("/")
        if sep and _is_registry(first):
            Registry(first, f"{where}: the registry part")
        else:
            rest = text
        if not cls.rest.fullmatch(rest):
            raise BadInput(
                f"{where} {_show(text)} is not a valid name for {cls.kind} (like {cls.example}; the "
                "path: lowercase letters, digits, '.', '_', '-', '/')."
            )


#: the registry a reference that names none is pulled from, and the host names Docker Hub answers to
DOCKER_HUB = "docker.io"
_DOCKER_HUB_HOSTS = (DOCKER_HUB, "index.docker.io", "registry-1.docker.io")


@dataclass(frozen=True)
class RefParts:
    """An image reference in parts: ``registry`` (``host[:port]``, :data:`DOCKER_HUB` when the reference
    names none), ``repository`` (the path inside the registry; ``library/NAME`` for a one-component Docker
    Hub name), ``tag`` and ``digest`` (None when absent)."""

    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @property
    def reference(self) -> str:
        """What the registry's manifest endpoint is asked for: the digest, else the tag, else ``latest``."""
        return self.digest or self.tag or "latest"

    @property
    def familiar_name(self) -> str:
        """The repository as ``docker images`` shows it: Docker Hub's host and its ``library/`` folded
        (``docker.io/library/ubuntu:22.04`` and ``ubuntu@sha256:…`` are both ``ubuntu``)."""
        if self.registry not in _DOCKER_HUB_HOSTS:
            return f"{self.registry}/{self.repository}"
        path = self.repository
        if path.startswith("library/") and path.count("/") == 1:
            path = path[len("library/") :]
        return path

    def __str__(self) -> str:
        s = f"{self.registry}/{self.repository}"
        if self.tag:
            s += f":{self.tag}"
        if self.digest:
            s += f"@{self.digest}"
        return s


def split_ref(text: str) -> RefParts:
    """Pure, never raises: ``[registry/]path[:tag][@digest]`` split by the distribution spec's rule (the
    first component names a registry when it holds a '.' or a ':' or is ``localhost``, and something
    follows it), unchecked.  A name without a registry is Docker Hub's, a one-component one under
    ``library/``.  :func:`parse_ref` checks the parts."""
    name, at, digest = text.partition("@")
    first, _, rest = name.partition("/")
    if rest and _is_registry(first):
        registry, path = first, rest
    else:
        registry, path = DOCKER_HUB, name if "/" in name else f"library/{name}"
    tag = None
    if ":" in path.rsplit("/", 1)[-1]:
        path, tag = path.rsplit(":", 1)
    return RefParts(registry=registry, repository=path, tag=tag, digest=digest if at else None)


_PATH_RE = re.compile(_PATH)
_TAG_RE = re.compile(_TAG)
_DIGEST_RE = re.compile(_DIGEST)
_DOMAIN_RE = re.compile(_DOMAIN)


def parse_ref(text: str, where: str = "image reference") -> RefParts:
    """:func:`split_ref`'s parts of a reference that is in the grammar, else :class:`BadInput` naming
    ``where``: a registry that is not ``host[:port]``, a path that is not lowercase letters, digits and
    single separators, a tag over 128 characters, a digest that is not ``sha256:<64 hex>``."""
    if not text or any(c.isspace() for c in text):
        raise BadInput(f"{where} {text!r} is not valid.")
    parts = split_ref(text)
    name = text.partition("@")[0]
    if parts.digest is not None and not _DIGEST_RE.fullmatch(parts.digest):
        raise BadInput(f"{where} digest {parts.digest!r} is not sha256:<64 hex>.")
    if not _DOMAIN_RE.fullmatch(parts.registry):
        raise BadInput(
            f"{where} {name!r}: registry {parts.registry!r} is not a host[:port] (DNS labels or an "
            "IPv4 address, an optional port)."
        )
    if not _PATH_RE.fullmatch(parts.repository):
        raise BadInput(
            f"{where} {name!r}: repository {parts.repository!r} is not a valid name (lowercase, digits, . _ - /)."
        )
    if parts.tag is not None and not _TAG_RE.fullmatch(parts.tag):
        raise BadInput(
            f"{where} {name!r}: tag {parts.tag!r} is not a valid tag (letters, digits, '_', '.', "
            "'-'; at most 128, not starting with '.' or '-')."
        )
    return parts


class ImageRef(Repository):
    """``[registry/]path[:tag][@sha256:…]``, the reference grammar of the distribution spec
    (:func:`parse_ref`); :attr:`parts` are its registry, repository, tag and digest."""

    kind = "an image reference"
    example = "vllm/vllm-openai:v0.26.0 or registry:5000/repo@sha256:…"
    max_len = 512

    @classmethod
    def check(cls, text: str, where: str) -> None:
        parse_ref(text, where)

    @property
    def parts(self) -> RefParts:
        return split_ref(self)


class DistName(Value):
    kind = "a distribution name (PEP 508: letters, digits, '.', '_', '-')"
    pattern = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
    max_len = 200


class Version(Value):
    kind = "a PEP 440 version"
    example = "1.26.4"
    max_len = 200

    @classmethod
    def check(cls, text: str, where: str) -> None:
        from packaging.version import Version as _V

        try:
            _V(text)
        except ValueError:  # InvalidVersion, or a part past int()'s digit limit
            raise BadInput(f"{where} {_show(text)} is not a PEP 440 version (like {cls.example}).") from None


class Glibc(Value):
    kind = "a glibc version"
    example = "2.17"
    pattern = re.compile(r"[0-9]{1,4}(?:\.[0-9]{1,4}){1,2}")  # GLIBC_2.17, GLIBC_2.2.5: ASCII digits only
    max_len = 32


class AbiTag(Value):
    kind = "a Python ABI tag (or several, dot-separated)"
    example = "cp312, cp311.cp312, abi3 or none"
    pattern = re.compile(r"[A-Za-z0-9_]{1,32}(?:\.[A-Za-z0-9_]{1,32}){0,31}")
    max_len = 1024


class Url(Value):
    kind = "an http, https or file URL"
    example = "https://pypi.org/simple"
    schemes: ClassVar[tuple[str, ...]] = ("http", "https", "file")

    @classmethod
    def check(cls, text: str, where: str) -> None:
        import urllib.parse

        if any(c.isspace() for c in text):
            raise BadInput(f"{where} {_show(text)} holds a space; a URL has none (percent-encode it).")
        try:
            parts = urllib.parse.urlsplit(text)
            parts.port  # noqa: B018 - a port that is not a number is refused here, not by the first fetch
        except ValueError as exc:
            raise BadInput(f"{where} {_show(text)} is not a URL ({exc}).") from None
        if parts.scheme.lower() not in cls.schemes or (parts.scheme.lower() != "file" and not parts.hostname):
            raise BadInput(f"{where} {_show(text)} is not {cls.kind} (like {cls.example}).")


# ---------------------------------------------------------------- the generators' guard
def guard(value: Any) -> Any:
    """The last check before a value is written into a generated file (the Dockerfile template's
    ``finalize``, the lock writer): a typed :class:`Value`, a number or None passes as it is; any other
    string must hold no control character (BadInput naming it), so a boundary that was skipped cannot
    put a second line into the file."""
    if isinstance(value, Value) or value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return control_free(value, "a value written into a generated file", max_len=1 << 20)
    return value


# ---------------------------------------------------------------- serving settings
_DNS1123 = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?")


def dns1123_label(value: Any, where: str, *, max_len: int = 63) -> str:
    """A Kubernetes DNS-1123 label (``[a-z0-9]([-a-z0-9]*[a-z0-9])?``, at most ``max_len``), matched whole
    (a trailing newline is not a label's end)."""
    text = control_free(value, where)
    if not _DNS1123.fullmatch(text) or len(text) > max_len:
        raise BadInput(
            f"{where} {_show(text)} must be a DNS-1123 label (lowercase letters, digits, '-'; at most "
            f"{max_len} characters)."
        )
    return text


def compile_cache(value: Any, where: str = "serving.compile_cache") -> str:
    """``node``, ``none`` or ``pvc:CLAIM`` (CLAIM a DNS-1123 subdomain name of at most 253 characters)."""
    text = control_free("none" if value in (None, "") else value, where)
    if text in ("node", "none"):
        return text
    claim = text[4:] if text.startswith("pvc:") else None
    if claim is None or len(claim) > 253 or not re.fullmatch(rf"{_DNS1123.pattern}(?:\.{_DNS1123.pattern})*", claim):
        raise BadInput(
            f"{where} must be node, none or pvc:CLAIM (CLAIM a PersistentVolumeClaim name), got {_show(text)}."
        )
    return text


def model_cache(value: Any, where: str = "serving.model_cache") -> str:
    """``none``, ``node`` or ``object``."""
    text = control_free("none" if value in (None, "") else value, where)
    if text not in ("none", "node", "object"):
        raise BadInput(f"{where} must be none, node or object, got {_show(text)}.")
    return text
