"""Target platforms: the one place that knows how ``linux/arm64`` is spelled by each tool.

An image platform (OCI/Docker: ``linux/amd64``, ``linux/arm64``) is, to the other tools:

* the machine name (``uname -m``, wheel platform tags, the release pipeline's step labels, Debian/Ubuntu
  library folders): ``x86_64`` / ``aarch64``;
* uv's ``--python-platform``: ``x86_64-manylinux_2_39`` / ``aarch64-manylinux_2_39`` (with the base's glibc);
* the ELF header's ``e_machine`` (pyelftools' names): ``EM_X86_64`` / ``EM_AARCH64``;
* Kubernetes' ``kubernetes.io/arch`` node label and BuildKit's ``TARGETARCH``: ``amd64`` / ``arm64``;
* a file-name part for what is kept per platform (``linux-arm64``).

The default stays ``linux/amd64``: its files keep the names they had before any other platform existed
(``lockfiles/base/vllm-openai-vX.json``, ``lockfiles/vllm-X/requirements.lock``, a context without
subfolders); every other platform's files carry :attr:`Platform.slug`.

Only the two platforms the official vLLM CUDA image is published for are known; anything else
(``linux/arm/v7``, ``linux/ppc64le``, ``darwin/arm64``) is refused by :func:`parse` naming them.

Pure: nothing here reads a file or the environment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from builder.errors import BadInput


@dataclass(frozen=True, order=True)
class Platform:
    os: str  # linux
    arch: str  # amd64 | arm64 (OCI / Docker / Kubernetes / BuildKit's TARGETARCH)
    machine: str  # x86_64 | aarch64 (uname -m, wheel tags, the release pipeline's labels)
    elf: str  # EM_X86_64 | EM_AARCH64 (the ELF header's e_machine, as pyelftools names it)

    @property
    def name(self) -> str:
        """``linux/amd64``."""
        return f"{self.os}/{self.arch}"

    @property
    def slug(self) -> str:
        """``linux-amd64``: the platform as a file or folder name part."""
        return f"{self.os}-{self.arch}"

    @property
    def is_default(self) -> bool:
        return self == DEFAULT

    def uv_platform(self, glibc: str) -> str:
        """uv's ``--python-platform`` at a glibc: ``2.39`` -> ``aarch64-manylinux_2_39``."""
        return f"{self.machine}-manylinux_{glibc.replace('.', '_')}"

    def file_suffix(self) -> str:
        """``""`` for the default platform (its files keep their names), else ``-linux-arm64``."""
        return "" if self.is_default else f"-{self.slug}"

    def __str__(self) -> str:
        return self.name


AMD64 = Platform("linux", "amd64", "x86_64", "EM_X86_64")
ARM64 = Platform("linux", "arm64", "aarch64", "EM_AARCH64")
DEFAULT = AMD64
KNOWN: tuple[Platform, ...] = (AMD64, ARM64)

_ALIASES = {
    "linux/amd64": AMD64,
    "linux/x86_64": AMD64,
    "linux/arm64": ARM64,
    "linux/arm64/v8": ARM64,
    "linux/aarch64": ARM64,
}


def known_names() -> str:
    return ", ".join(p.name for p in KNOWN)


def parse(text: str, *, where: str = "--platform") -> Platform:
    """One platform (``linux/amd64``, ``linux/arm64``; ``linux/arm64/v8`` and the machine names are
    accepted as the same) or :class:`BadInput` naming the known ones."""
    key = (text or "").strip().lower()
    if key in _ALIASES:
        return _ALIASES[key]
    shown = re.sub(r"[^\x20-\x7e]", "?", text or "")[:80]
    raise BadInput(
        f"{where}: {shown!r} is not a platform build-image can build: the official vLLM CUDA image is "
        f"published for {known_names()} only (OS/ARCH, e.g. linux/arm64 for GH200 and GB200)."
    )


def parse_list(text: str | None, *, where: str = "--platform") -> tuple[Platform, ...]:
    """``linux/amd64,linux/arm64`` -> both, in the order given, each once; None or empty -> the default."""
    if text is None or not text.strip():
        return (DEFAULT,)
    out: list[Platform] = []
    for part in text.split(","):
        if not part.strip():
            raise BadInput(
                f"{where}: {text!r} holds an empty platform (give OS/ARCH[,OS/ARCH], e.g. linux/amd64,linux/arm64)."
            )
        p = parse(part, where=where)
        if p not in out:
            out.append(p)
    return tuple(out)


def from_machine(machine: str, *, where: str = "machine") -> Platform:
    """``x86_64``/``aarch64`` (and ``amd64``/``arm64``) -> the platform."""
    m = (machine or "").strip().lower()
    for p in KNOWN:
        if m in (p.machine, p.arch):
            return p
    raise BadInput(f"{where}: machine {machine!r} is none of {', '.join(p.machine for p in KNOWN)}.")


def from_uv_platform(platform: str, *, where: str = "platform") -> Platform:
    """``aarch64-manylinux_2_39`` (a base manifest's or a lock header's ``platform``) -> the platform."""
    return from_machine((platform or "").split("-", 1)[0], where=where)


#: uv's ``--python-platform`` as a base manifest and a lock header record it: a known machine, a manylinux glibc.
_PYTHON_PLATFORM = re.compile(r"(x86_64|aarch64)-manylinux_(\d{1,3})_(\d{1,3})")


def parse_python_platform(text: object, *, where: str) -> Platform:
    """``x86_64-manylinux_2_39`` / ``aarch64-manylinux_2_39`` (a base manifest's ``platform``, a lock header's
    ``platform``, ``base snapshot --platform``) -> the platform; anything else (another machine, another libc,
    not text) is :class:`BadInput` naming ``where``."""
    m = _PYTHON_PLATFORM.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        shown = re.sub(r"[^\x20-\x7e]", "?", str(text))[:80]
        raise BadInput(
            f"{where}: {shown!r} is not <machine>-manylinux_<major>_<minor> for a machine build-image builds "
            f"({', '.join(p.machine for p in KNOWN)}), e.g. {DEFAULT.uv_platform('2.35')}."
        )
    return from_machine(m.group(1), where=where)


def snapshot_platform(text: str, glibc: str | None, *, where: str) -> tuple[Platform, str | None]:
    """What ``base snapshot --platform`` may say: an image platform (``linux/arm64``, read by :func:`parse`;
    its uv platform is made at the base's glibc, so None comes back for it) or uv's
    ``aarch64-manylinux_2_39`` (:func:`parse_python_platform`, returned as given).  Anything else: BadInput."""
    if "/" in text:
        p = parse(text, where=where)
        return p, (p.uv_platform(glibc) if glibc else None)
    return parse_python_platform(text.strip(), where=where), text.strip()


def from_elf_machine(e_machine: str) -> Platform | None:
    """pyelftools' ``e_machine`` name -> the platform, None for another machine."""
    for p in KNOWN:
        if p.elf == e_machine:
            return p
    return None


def from_oci(os_name: str, arch: str, variant: str | None = None) -> Platform | None:
    """An image config's or an index entry's ``os``/``architecture``/``variant`` -> the platform, or None
    when it is none build-image builds (``arm``/``v7``, ``windows``)."""
    key = f"{os_name}/{arch}" + (f"/{variant}" if variant else "")
    return _ALIASES.get(key.lower())


def joined(platforms: tuple[Platform, ...] | list[Platform]) -> str:
    return ",".join(p.name for p in platforms)
