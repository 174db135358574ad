"""One validation layer for values that come from flags, the spec, the environment and files.

Every value a user controls passes one of these before it is used, and a bad one is
:class:`builder.errors.BadInput` (exit 2) naming where it came from (the flag, the spec key,
the environment variable, the file and field), never a crash deeper down:

* releases (:func:`check_release`): a ``--vllm`` value is a version this checkout has a base
  manifest for (``lockfiles/base/vllm-openai-v*.json``); the message names the known releases
  and nothing is derived from the raw string (no path, no command line);
* timestamps (:func:`exclude_newer`): ``YYYY-MM-DD`` or an RFC 3339 date-time, a real instant;
* numbers (:func:`number`, :func:`env_number`): of the right type (a string, a boolean is not a
  number), finite, in range, integral where they count something;
* structured files (:func:`load_json`, :func:`load_toml`): nesting depth bounded
  (:data:`MAX_DEPTH`), so a document nested thousands of levels deep is refused instead of
  exhausting the interpreter's stack;
* files the user names (:func:`read_bounded`): regular files only (a device node, a FIFO or a
  socket is refused before it is read, so ``/dev/zero`` costs nothing) and at most a stated size.

The functions are pure but for :func:`read_bounded` (one ``open``) and :func:`env_number` (one
environment lookup).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import sys
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from builder.errors import BadInput

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: Deepest nesting of arrays/objects/tables any document build-image reads may have; the deepest
#: real one (a CycloneDX SBOM, a safetensors header, a Hugging Face config) is under 10.
MAX_DEPTH = 64
#: Largest structured document (spec, manifest, config, lock, sums list) read whole.
MAX_DOC_BYTES = 64 << 20
_SURROGATE = re.compile("[\ud800-\udfff]")


# ---------------------------------------------------------------- releases
def check_release(vllm: str, known: Iterable[str], *, where: str = "--vllm") -> str:
    """``vllm`` when it is one of ``known``, else BadInput naming the known releases.

    The message quotes the value (``repr``, at most 60 characters) and suggests nothing built
    from it: a value like ``../../etc`` must not turn into a path in a hint."""
    known = list(known)
    if vllm in known:
        return vllm
    shown = repr(vllm) if len(vllm) <= 60 else repr(vllm[:60]) + "…"
    hint = (
        "pick one of the known releases, or pass --base with a manifest or a local image for another one "
        "(`build-image base snapshot --image vllm/vllm-openai:vX.Y.Z -o FILE`)."
    )
    if _is_release_number(vllm):  # a well-formed release: the one command that adds it to this checkout
        hint = (
            f"`build-image upgrade --to {vllm} -o .` adds vllm {vllm} to this checkout (its base manifest "
            f"reconstructed from the release's own build files, its recipes table, the patch series ported, "
            f"the lock and its pylock twin) as one reviewable change; or pass --base with a manifest or a "
            f"local image (`build-image base snapshot --image vllm/vllm-openai:v{vllm} -o FILE`)."
        )
    raise BadInput(
        f"vLLM version {shown} is not supported by this checkout: there is no base manifest for it "
        f"(known: {', '.join(known) or 'none'}; the version came from {where}).",
        hint=hint,
    )


def _is_release_number(value: str) -> bool:
    """A plain release number (``0.34.0``, ``0.35.0rc1``): digits, dots and a pre/post/dev tag only."""
    return len(value) <= 40 and bool(_RELEASE_NUMBER.fullmatch(value))


_RELEASE_NUMBER = re.compile(r"\d{1,4}(\.\d{1,4}){1,3}((a|b|rc)\d{1,3})?(\.post\d{1,3})?(\.dev\d{1,6})?")


def version_string(value: str, *, where: str = "--vllm") -> str:
    """``value`` when it is a PEP 440 version (``0.26.0``, ``0.27.0rc1``), else BadInput: a word like
    ``latest`` or a path like ``../../etc`` is not a release."""
    from packaging.version import Version

    try:
        Version(value)
    except (ValueError, TypeError):  # InvalidVersion, a part past int()'s digit limit
        raise BadInput(f"{where} {value!r:.60} is not a version (like 0.26.0); name a vLLM release.") from None
    return value


def release_direction(
    from_version: str, to_version: str, *, allow_downgrade: bool = False, what: str = "upgrade"
) -> str:
    """``"upgrade"`` when ``to_version`` is newer than ``from_version``, ``"downgrade"`` when older and
    ``allow_downgrade``; BadInput for equal versions, a version that is not one, or a downgrade not
    asked for (``--allow-downgrade``)."""
    from packaging.version import Version

    a = Version(version_string(from_version, where="--from"))
    b = Version(version_string(to_version, where="--to"))
    if a == b:
        raise BadInput(f"--from and --to are both {to_version}: nothing to {what}.")
    if b > a:
        return "upgrade"
    if not allow_downgrade:
        raise BadInput(
            f"--from {from_version} --to {to_version} is a downgrade ({to_version} is older than "
            f"{from_version}); {what} refuses it unless asked.",
            hint=f"swap --from and --to for the {what} to the newer release, or pass --allow-downgrade.",
        )
    return "downgrade"


def same_directory(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether ``a`` and ``b`` name one directory (after symlinks, ``..`` and relative paths)."""
    return os.path.realpath(a) == os.path.realpath(b)


# ---------------------------------------------------------------- timestamps
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:Z|[+-]\d{2}:\d{2})")


def exclude_newer(value: str | None, *, where: str = "--exclude-newer") -> str | None:
    """``value`` (``YYYY-MM-DD``, or an RFC 3339 date-time with ``Z`` or an offset) when it names a
    real day or instant, else BadInput; ``None`` passes."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadInput(f"{where} must be a date (YYYY-MM-DD) or an RFC 3339 date-time, got {value!r:.60}.")
    text = value.strip()
    ok = _DATE.fullmatch(text) or _DATETIME.fullmatch(text)
    if ok:
        try:
            parse_instant(text)
        except ValueError as exc:
            raise BadInput(f"{where} {value!r:.60} is not a real date or time ({exc}).") from None
        return text
    raise BadInput(
        f"{where} {value!r:.60} is not a date (YYYY-MM-DD) or an RFC 3339 date-time "
        "(YYYY-MM-DDTHH:MM:SSZ, or with an offset like +02:00).",
    )


def parse_instant(text: str) -> datetime:
    """Pure: the UTC instant of a :func:`exclude_newer`-valid string (a date is its midnight UTC)."""
    if _DATE.fullmatch(text):
        return datetime.fromisoformat(text + "T00:00:00+00:00")
    frac = re.search(r"\.(\d+)", text)
    if frac and len(frac.group(1)) > 6:  # fromisoformat takes at most microseconds
        text = text.replace(frac.group(0), "." + frac.group(1)[:6])
    dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return dt.astimezone(timezone.utc)


# ---------------------------------------------------------------- numbers
def number(
    value: Any,
    where: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    integral: bool = False,
    exclusive_minimum: bool = False,
) -> int | float:
    """``value`` as a number when it is one (not a string, not a boolean), finite, within
    [``minimum``, ``maximum``] (``exclusive_minimum``: strictly above it), and a whole number when
    ``integral`` (returned as int); else BadInput naming ``where`` and the value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if integral and minimum is not None:
            raise BadInput(f"{where} must be an integer >= {minimum:g}, got {value!r:.60}.")
        kind = "string" if isinstance(value, str) else type(value).__name__
        raise BadInput(f"{where} must be a number, got {kind} {value!r:.60}.")
    if isinstance(value, float) and not math.isfinite(value):
        raise BadInput(f"{where} must be a finite number, got {value!r}.")
    if integral:
        if isinstance(value, float) and not value.is_integer():
            raise BadInput(f"{where} must be a whole number, got {value!r}.")
        value = int(value)
    if minimum is not None and (value <= minimum if exclusive_minimum else value < minimum):
        if integral:
            bound = f"an integer > {minimum:g}" if exclusive_minimum else f"an integer >= {minimum:g}"
        else:
            bound = f"greater than {minimum:g}" if exclusive_minimum else f"at least {minimum:g}"
        raise BadInput(f"{where} must be {bound}, got {value!r}.")
    if maximum is not None and value > maximum:
        raise BadInput(f"{where} must be at most {maximum:g}, got {value!r}.")
    return value


def env_number(
    name: str,
    default: float,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    integral: bool = False,
    exclusive_minimum: bool = False,
) -> int | float:
    """The environment variable ``name`` as a validated number (:func:`number`); ``default`` when unset."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value: Any = float(raw)
    except ValueError:
        raise BadInput(f"{name}={raw!r:.60} is not a number.") from None
    return number(
        value,
        f"{name}={raw.strip()}",
        minimum=minimum,
        maximum=maximum,
        integral=integral,
        exclusive_minimum=exclusive_minimum,
    )


# ---------------------------------------------------------------- structured documents
def nesting_depth(doc: Any, limit: int = MAX_DEPTH) -> int:
    """Pure: how deep ``doc``'s lists/dicts nest (a scalar is 0), counting no further than ``limit + 1``.
    Iterative, so it cannot itself run out of stack."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(doc, 0)]
    while stack:
        obj, d = stack.pop()
        if isinstance(obj, dict):
            children: Iterable[Any] = obj.values()
        elif isinstance(obj, (list, tuple)):
            children = obj
        else:
            continue
        d += 1
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        stack.extend((c, d) for c in children)
    return deepest


def _too_deep(what: str, limit: int, error: type[Exception]) -> Exception:
    return error(
        f"{what} nests deeper than {limit} levels of arrays/objects; no document build-image reads "
        "is shaped like that (a damaged or hostile file)."
    )


def _unreadable(what: str, exc: ValueError, error: type[Exception]) -> Exception:
    reason = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else f"{str(exc).split(';')[0]}"
    return error(
        f"{what} cannot be read: {reason}; no document build-image reads holds that (a damaged or hostile file)."
    )


def check_text(doc: Any, what: str, *, error: type[Exception] = BadInput) -> Any:
    """``doc`` when every key and string in it is Unicode text, else ``error`` naming ``what``: JSON's
    ``\\ud800`` escape decodes to a lone surrogate, which no file, terminal or label can hold (writing it
    fails wherever it reaches). Iterative, like :func:`nesting_depth`."""
    stack: list[Any] = [doc]
    while stack:
        obj = stack.pop()
        if isinstance(obj, str):
            if not obj.isascii() and _SURROGATE.search(obj):
                raise error(
                    f"{what} holds {obj[:40]!r}: a \\u escape of a lone UTF-16 surrogate is not text; no document "
                    "build-image reads holds one (a damaged or hostile file)."
                )
        elif isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
    return doc


def check_depth(doc: Any, what: str, *, limit: int = MAX_DEPTH, error: type[Exception] = BadInput) -> Any:
    """``doc`` when it nests at most ``limit`` levels deep, else ``error`` naming ``what``."""
    if nesting_depth(doc, limit) > limit:
        raise _too_deep(what, limit, error)
    return doc


def load_json(
    text: str | bytes, what: str, *, limit: int = MAX_DEPTH, error: type[Exception] = BadInput, **kwargs: Any
) -> Any:
    """``json.loads(text, **kwargs)`` with the nesting bounded: a document deeper than ``limit`` is
    ``error`` naming ``what`` (:class:`json.JSONDecodeError` still propagates for the caller's own message)."""
    try:
        doc = json.loads(text, **kwargs)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise _too_deep(what, limit, error) from None
    except ValueError as exc:  # bytes not UTF-8, an integer of more digits than Python converts
        raise _unreadable(what, exc, error) from None
    return check_text(check_depth(doc, what, limit=limit, error=error), what, error=error)


def load_toml(text: str, what: str, *, limit: int = MAX_DEPTH, error: type[Exception] = BadInput) -> dict:
    """``tomllib.loads(text)`` with the nesting bounded (see :func:`load_json`);
    :class:`tomllib.TOMLDecodeError` propagates."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        raise
    except RecursionError:
        raise _too_deep(what, limit, error) from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise _unreadable(what, exc, error) from None
    return check_depth(doc, what, limit=limit, error=error)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is out of range for a number")
    return value


#: Most schema errors one refusal lists (the first by position in the document).
MAX_SCHEMA_ERRORS = 5


def schema_errors(doc: Any, schema: dict[str, Any]) -> list[str]:
    """Pure: where ``doc`` breaks the JSON Schema (draft 2020-12) ``schema``, each as ``$.path: why`` (at
    most :data:`MAX_SCHEMA_ERRORS`, each at most 240 characters); [] when it conforms.  ``doc`` must
    already be depth-bounded (:func:`check_depth`): the validator recurses."""
    import itertools

    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    found = itertools.islice(validator.iter_errors(doc), 50)
    errs = sorted(found, key=lambda e: [str(p) for p in e.absolute_path])[:MAX_SCHEMA_ERRORS]
    return [f"{e.json_path}: {e.message}"[:240] for e in errs]


def load_typed_json(
    text: str | bytes,
    what: str,
    schema: dict[str, Any],
    *,
    limit: int = MAX_DEPTH,
    error: type[Exception] = BadInput,
) -> Any:
    """The one typed reader of a JSON document from outside (a file, a registry blob): JSON (NaN,
    Infinity and numbers past a double refused), nested at most ``limit`` deep, and conforming to
    ``schema`` (every field's type, range and shape).  Anything else is ``error`` naming ``what`` and
    the first places it goes wrong, so no reader after it meets a value of a type it does not expect."""
    try:
        doc = load_json(
            text, what, limit=limit, error=error, parse_constant=_refuse_constant, parse_float=_finite_float
        )
    except (ValueError, UnicodeDecodeError) as exc:
        raise error(f"{what} is not JSON ({str(exc)[:200]}; truncated?)") from None
    errs = schema_errors(doc, schema)
    if errs:
        raise error(f"{what} is not in the expected form: " + "; ".join(errs))
    return doc


def load_yaml(text: str, what: str, *, limit: int = MAX_DEPTH, error: type[Exception] = BadInput) -> Any:
    """``yaml.safe_load(text)`` with the nesting bounded (a document deeper than ``limit``, or one PyYAML
    cannot compose within the stack, is ``error`` naming ``what``) and its aliases counted once (a shared
    node is not walked again, so an alias bomb costs its size, not its expansion); a YAML error is ``error``
    naming ``what``."""
    import yaml

    try:
        doc = yaml.safe_load(text)
    except RecursionError:
        raise _too_deep(what, limit, error) from None
    except yaml.YAMLError as exc:
        raise error(f"{what} is not valid YAML: {exc}.") from None
    for _node, d in nodes_once(doc):
        if d + 1 > limit:
            raise _too_deep(what, limit, error)
    return doc


def nodes_once(doc: Any) -> Iterator[tuple[Any, int]]:
    """Each mapping and list of a parsed document with its depth, depth first in document order, each node
    once: a node shared through YAML aliases is not walked again (an alias bomb costs its size) (pure)."""
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(doc, 0)]
    while stack:
        obj, d = stack.pop()
        if not isinstance(obj, (dict, list)) or id(obj) in seen:
            continue
        seen.add(id(obj))
        yield obj, d
        stack.extend((c, d + 1) for c in reversed(list(obj.values()) if isinstance(obj, dict) else obj))


# ---------------------------------------------------------------- files the user names
def read_bounded(path: str | os.PathLike, what: str, *, max_bytes: int = MAX_DOC_BYTES) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes``; BadInput naming ``what`` and the
    path for a missing file, a directory, a device node, a FIFO, a socket, or a file over the bound.
    Opened non-blocking, so a FIFO without a writer does not hang the command."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise BadInput(f"{what} {p}: no such file.") from None
    except OSError as exc:
        raise BadInput(f"{what} {p} cannot be read: {exc.strerror or exc}.") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # before fdopen, which refuses a directory with an OSError of its own
        os.close(fd)
        raise BadInput(f"{what} {p}: {describe_kind(st.st_mode)}, not a regular file; only a file is read.")
    with os.fdopen(fd, "rb") as fh:
        if st.st_size > max_bytes:
            raise BadInput(f"{what} {p}: {st.st_size} bytes, more than the {max_bytes}-byte bound for this input.")
        try:
            data = fh.read(max_bytes + 1)
        except OSError as exc:
            raise BadInput(f"{what} {p} cannot be read: {exc.strerror or exc}.") from None
    if len(data) > max_bytes:
        raise BadInput(f"{what} {p}: more than the {max_bytes}-byte bound for this input.")
    return data


def read_bounded_text(path: str | os.PathLike, what: str, *, max_bytes: int = MAX_DOC_BYTES) -> str:
    """:func:`read_bounded`, decoded as UTF-8 (BadInput naming the byte where it is not)."""
    data = read_bounded(path, what, max_bytes=max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{what} {path} cannot be read: not UTF-8 text ({exc.reason} at byte {exc.start}).") from None


def describe_kind(mode: int) -> str:
    """Pure: what a non-regular file is, in words."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symlink"),
    ):
        if test(mode):
            return name
    return "not a regular file"
