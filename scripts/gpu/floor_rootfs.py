#!/usr/bin/env python3
"""A floor root filesystem made of the packages an Ubuntu/Debian host has installed, for ``base materialize --from``.

    floor_rootfs.py OUT.tar [--with PKG ...] [--report OUT.json]

The release's image is built on ``nvidia/cuda:…-ubuntu24.04`` plus the recipe's apt packages; where neither the
image nor the distribution's archive can be reached, but a host runs the same distribution release (a GPU
machine on Ubuntu 24.04, say), its installed packages are the same files the archive would give.  This writes a
tar of: every package the host marks Essential, the ``--with`` packages (those not installed are named in the
report), and the closure of their Depends/Pre-Depends (the first alternative the host has).  Each package's files
come from ``dpkg -L``'s list, as the host has them; documentation, manuals and translations are left out as the
distribution's minimized container images leave them out; the dpkg database holds exactly these packages, so
``dpkg -l`` inside the image tells what the floor is.  ``/etc/passwd`` and ``/etc/group`` hold root and nobody
only; the host's own users, keys and configuration never travel.

The report (``--report``) names the distribution release, every package with its version, the ``--with``
packages the host lacks, and the tar's sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import stat
import sys
import tarfile
from pathlib import Path

STATUS = Path("/var/lib/dpkg/status")
INFO = Path("/var/lib/dpkg/info")
LEFT_OUT = re.compile(r"^/usr/share/(doc|man|info|locale|lintian|linda|help)/(?!.*copyright$)")
PASSWD = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"


def stanzas(text: str) -> list[dict[str, str]]:
    out = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = None
        for line in block.splitlines():
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields.get("Package"):
            out.append(fields)
    return out


def installed(entries: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    return {e["Package"]: e for e in entries if e.get("Status", "").endswith(" installed")}


def providers(pkgs: dict[str, dict[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, e in sorted(pkgs.items()):
        for alt in e.get("Provides", "").split(","):
            virt = alt.strip().split(" ")[0].split(":")[0]
            if virt:
                out.setdefault(virt, name)
    return out


def closure(pkgs: dict[str, dict[str, str]], roots: list[str]) -> list[str]:
    prov = providers(pkgs)
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        e = pkgs[name]
        for field in ("Pre-Depends", "Depends"):
            for clause in filter(None, (c.strip() for c in e.get(field, "").split(","))):
                for alt in clause.split("|"):
                    dep = alt.strip().split(" ")[0].split(":")[0]
                    got = dep if dep in pkgs else prov.get(dep)
                    if got:
                        todo.append(got)
                        break
    return sorted(seen)


def file_list(name: str, arch: str) -> list[str]:
    for stem in (f"{name}:{arch}", name):
        p = INFO / f"{stem}.list"
        if p.exists():
            return p.read_text().splitlines()
    return []


def add_path(tar: tarfile.TarFile, path: str, done: set[str]) -> None:
    if path in done or path in ("/.", "/") or LEFT_OUT.match(path):
        return
    parent = os.path.dirname(path)
    real_parent = os.path.realpath(parent)
    if real_parent != parent:  # a merged-/usr link such as /lib64 -> usr/lib64: the link, then the real path
        add_path(tar, parent, done)
        add_path(tar, real_parent, done)
        add_path(tar, os.path.join(real_parent, os.path.basename(path)), done)
        return
    if parent not in ("/", ""):
        add_path(tar, parent, done)
    try:
        st = os.lstat(path)
    except OSError:
        return  # diverted or removed by a maintainer script: as the host has it
    done.add(path)
    info = tar.gettarinfo(path, arcname=path.lstrip("/"))
    info.uname = info.gname = ""
    if stat.S_ISREG(st.st_mode):
        with open(path, "rb") as fh:
            tar.addfile(info, fh)
    elif stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode):
        tar.addfile(info)


def add_text(tar: tarfile.TarFile, path: str, text: str, mode: int = 0o644) -> None:
    data = text.encode()
    info = tarfile.TarInfo(path.lstrip("/"))
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def add_dir(tar: tarfile.TarFile, path: str, mode: int) -> None:
    info = tarfile.TarInfo(path.lstrip("/"))
    info.type, info.mode = tarfile.DIRTYPE, mode
    tar.addfile(info)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--with", dest="extra", action="append", default=[])
    ap.add_argument("--report")
    a = ap.parse_args()
    pkgs = installed(stanzas(STATUS.read_text()))
    missing = [p for p in a.extra if p not in pkgs]
    roots = [n for n, e in pkgs.items() if e.get("Essential") == "yes"] + [p for p in a.extra if p in pkgs]
    names = closure(pkgs, roots)
    done: set[str] = set()
    with tarfile.open(a.out, "w", format=tarfile.PAX_FORMAT) as tar:
        for d, mode in (("/tmp", 0o1777), ("/var/tmp", 0o1777), ("/root", 0o700), ("/proc", 0o555), ("/sys", 0o555)):
            add_dir(tar, d, mode)
            done.add(d)
        add_dir(tar, "/dev", 0o755)
        done.add("/dev")
        for name in names:
            for path in file_list(name, pkgs[name].get("Architecture", "")):
                add_path(tar, path, done)
            for info in sorted(INFO.glob(f"{name}.*")) + sorted(INFO.glob(f"{name}:*.*")):
                add_path(tar, str(info), done)
        alternatives = Path("/etc/alternatives")
        for link in sorted(alternatives.iterdir()) if alternatives.is_dir() else []:
            if link.is_symlink() and os.readlink(link) in done:
                add_path(tar, str(link), done)
        status = "\n\n".join("\n".join(f"{k}: {v}" for k, v in pkgs[n].items()) for n in names)
        add_text(tar, "/var/lib/dpkg/status", status + "\n")
        add_text(tar, "/etc/passwd", PASSWD)
        add_text(tar, "/etc/group", GROUP)
    h = hashlib.sha256()
    with open(a.out, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    digest = h.hexdigest()
    os_release = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line)
    report = {
        "os": os_release.get("PRETTY_NAME", "").strip('"'),
        "version_id": os_release.get("VERSION_ID", "").strip('"'),
        "packages": {n: pkgs[n].get("Version", "") for n in names},
        "asked": a.extra,
        "not_installed": missing,
        "files": len(done),
        "tar_sha256": digest,
    }
    if a.report:
        Path(a.report).write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    print(
        f"floor: {report['os']}, {len(names)} packages, {len(done)} paths, tar sha256 {digest}; "
        f"not installed: {', '.join(missing) or 'none'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
