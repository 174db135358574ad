"""Every git command build-image runs goes through :func:`git` (ground floor; subprocess only).

A repository can carry configuration that makes git run programs: ``core.fsmonitor``, hooks,
``core.sshCommand``, pagers, ``diff.external``, textconv and ``filter.*`` drivers (selected by
``.gitattributes``), credential helpers.  A checkout unpacked from an archive carries any of
them, so :func:`git` never lets git reach one:

* only read-only plumbing runs (:data:`COMMANDS`): nothing that reads or refreshes the index or the
  work tree (``status``, ``describe --dirty``, ``checkout``), nothing that fetches;
* arguments that would call a configured program (``--textconv``, ``--filters``, ``--ext-diff``,
  ``--dirty``, ``--output``) are refused, and ``diff`` always gets ``--no-ext-diff --no-textconv``;
* the system and user configuration are not read (``GIT_CONFIG_NOSYSTEM``,
  ``GIT_CONFIG_GLOBAL=/dev/null``, ``HOME``/``XDG_CONFIG_HOME`` pointing nowhere), and
  :data:`SAFE_CONFIG` is given on the command line, which outranks the repository's own file and
  anything it includes (fsmonitor off, hooks path ``/dev/null``, pager ``cat``, no transports,
  no credential helper, no automatic gc);
* the environment is built, not inherited: no ``GIT_*`` variable of the caller's reaches git, no
  pager, no terminal prompt, no optional locks, no replace objects, no lazy fetch.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from builder.errors import BadInput, ExternalToolError

# The git subcommands build-image runs: they read objects and refs only.
COMMANDS = frozenset({"rev-parse", "ls-tree", "cat-file", "describe", "merge-base", "diff"})

# Arguments that make one of those run a configured program or touch the work tree / index.
REFUSED_ARGS = ("--textconv", "--filters", "--ext-diff", "--dirty", "--broken", "--output", "--exec", "--upload-pack")

# Given as `-c` (highest precedence): every configured program off, whatever the repository's config says.
SAFE_CONFIG = (
    "core.fsmonitor=false",
    "core.hooksPath=/dev/null",
    "core.pager=cat",
    "core.editor=false",
    "core.askPass=false",
    "core.sshCommand=false",
    "core.attributesFile=/dev/null",
    "core.untrackedCache=false",
    "credential.helper=",
    "protocol.allow=never",
    "submodule.recurse=false",
    "gc.auto=0",
    "maintenance.auto=false",
    "log.showSignature=false",
    "color.ui=false",
)

# The caller's variables git may see (locale and PATH to find git itself); every other one is dropped.
_KEPT_ENV = ("PATH", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT")

ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_SYSTEM": "/dev/null",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "HOME": "/nonexistent",
    "XDG_CONFIG_HOME": "/nonexistent",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_NO_REPLACE_OBJECTS": "1",
    "GIT_NO_LAZY_FETCH": "1",
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
    "GIT_ALLOW_PROTOCOL": "none",
    "GIT_PROTOCOL_FROM_USER": "0",
}


def environment() -> dict[str, str]:
    """The environment git runs with (see the module doc)."""
    env = {k: os.environ[k] for k in _KEPT_ENV if k in os.environ}
    env.update(ENV)
    return env


def command_line(args: list[str] | tuple[str, ...], git_dir: Path | None = None) -> list[str]:
    """The full argv for ``git ARGS`` (pure): a subcommand outside :data:`COMMANDS` is a programming error
    (ValueError); an argument of :data:`REFUSED_ARGS` (a revision a user named, say) is BadInput."""
    if not args or args[0] not in COMMANDS:
        raise ValueError(f"git {args[:1]} is not a read-only plumbing command build-image runs")
    head = args[: args.index("--")] if "--" in args else args
    for a in head:
        if a.startswith(REFUSED_ARGS):
            raise BadInput(f"git argument {a[:100]!r} is refused: it would run a program the repository configures.")
    argv = ["git", "--no-pager", "--no-replace-objects"]
    for c in SAFE_CONFIG:
        argv += ["-c", c]
    if git_dir is not None:
        argv.append(f"--git-dir={git_dir}")
    argv.append(args[0])
    if args[0] == "diff":
        argv += ["--no-ext-diff", "--no-textconv"]
    return [*argv, *args[1:]]


def git(
    args: list[str] | tuple[str, ...],
    *,
    git_dir: Path | None = None,
    cwd: Path | None = None,
    stdin: bytes | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess:
    """Run ``git ARGS`` under the rules of the module doc; the finished process (bytes out and err).
    ``git_dir``: the repository (``--git-dir``), else the one git finds from ``cwd``.  git missing is
    ExternalToolError (exit 12); git taking longer than ``timeout`` seconds is BadInput (the repository
    is what git is reading)."""
    argv = command_line(args, git_dir)
    try:
        return subprocess.run(
            argv,
            cwd=cwd,
            input=stdin,
            capture_output=True,
            env=environment(),
            timeout=timeout,
            stdin=None if stdin is not None else subprocess.DEVNULL,
        )
    except FileNotFoundError:
        raise ExternalToolError("git is not installed (build-image reads repositories with it).") from None
    except subprocess.TimeoutExpired:
        where = git_dir or cwd or Path.cwd()
        raise BadInput(f"git did not finish reading {where} within {timeout:.0f} s (`git {args[0]}`).") from None
