"""The commands a RUN line (or a script or shell string it runs) may run without changing what Python's
site-packages holds, each with the reason it is safe and the rule its arguments must keep (data a
reviewer reads; docs/base.md lists it), and the lexical reader that classifies every command of a
shell text it does not interpret (pure).

A command is one of: an install the interpreter understands (``pip``/``uv pip``); a command of
:data:`HARMLESS` whose arguments keep its rule; shell text run as shell (``sh -c``, ``bash -c``, a
script of the build context, a heredoc), read the same way with a depth bound; Python text that holds
no install (:func:`python_text_installs`).  Anything else is :class:`Unknown`: refused, never harmless.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from builder.resolve.recipe.shell import STREAM_JOINS, Unknown, tokenize_lines

# A path under one of Python's site directories (or a .pth/.egg-link file, which Python reads at start):
# a command whose path operand matches is not harmless, whatever the table says of it.
SITE_PATH = re.compile(r"(site|dist)-packages|\.pth\b|\.egg-link\b|purelib|platlib|getsitepackages|PYTHONPATH")


#: installer settings an image may set (ENV, ARG, ``export``, ``VAR=x cmd``) that change nothing about what
#: an install resolves; any other ``UV_*``/``PIP_*`` (an index, a target, a config file …) or a Python path
#: variable makes an install the reader cannot say, and is refused there
INSTALLER_ENV_OK = {
    "UV_CACHE_DIR": "where uv caches downloads",
    "UV_COMPILE_BYTECODE": "uv writes .pyc files",
    "UV_HTTP_TIMEOUT": "uv's network timeout",
    "UV_LINK_MODE": "how uv places files (copy, hardlink)",
    "UV_PYTHON_INSTALL_DIR": "where uv puts Pythons it downloads (none is used with --system)",
    "UV_NO_CACHE": "uv without its cache",
    "UV_CONCURRENT_DOWNLOADS": "uv's parallelism",
    "UV_INDEX_STRATEGY": "read by the reader: the step's index strategy",
    "UV_OVERRIDE": "read by the reader: the image's override pins",
    "UV_SYSTEM_PYTHON": "install into the system Python (the image's site-packages)",
    "PIP_CACHE_DIR": "where pip caches downloads",
    "PIP_NO_CACHE_DIR": "pip without its cache",
    "PIP_DISABLE_PIP_VERSION_CHECK": "pip does not look for a newer pip",
    "PIP_ROOT_USER_ACTION": "pip's warning about running as root",
    "PIP_BREAK_SYSTEM_PACKAGES": "pip ignores EXTERNALLY-MANAGED",
    "PIP_PROGRESS_BAR": "pip's output",
    "PIP_KEYRING_PROVIDER": "how pip asks a keyring for index credentials",
    "UV_KEYRING_PROVIDER": "how uv asks a keyring for index credentials",
    "UV_INSTALL_DIR": "where uv's own installer puts uv",
}


def installer_setting(names) -> str | None:
    """The first variable among ``names`` that changes what pip or uv installs and is not in
    :data:`INSTALLER_ENV_OK` (``UV_INDEX_URL``, ``PIP_EXTRA_INDEX_URL``, ``PYTHONPATH`` …), or None (pure).
    The caller passes the variables set to something (an ARG declared empty changes nothing)."""
    for n in names:
        if re.match(r"^(UV_|PIP_)", n) and n not in INSTALLER_ENV_OK:
            return n
        if n in ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "VIRTUAL_ENV", "CONDA_PREFIX"):
            return n
    return None


def python_tree(path: str) -> bool:
    """Whether a path (as written) may be under one of Python's site directories: it names one
    (:data:`SITE_PATH`), or it is under a ``lib/python…`` folder and holds a glob that may reach one (pure)."""
    return bool(SITE_PATH.search(path)) or ("lib/python" in path and bool(re.search(r"[*?\[]", path)))


#: program -> (rule, reason).  Rules: ``any`` (arguments do not matter), ``paths`` (no operand names a
#: path under a site directory), ``dest`` (the last operand, the one written, is not under one), ``apt``
#: (Debian packages other than Ubuntu's own Python modules), ``wrapper`` (runs the command that follows,
#: which is classified in turn), ``find`` (no -exec/-execdir/-ok; -delete only outside site dirs),
#: ``make`` (no install target), ``trap`` (its command text is read as shell), ``curl`` (its -o file is
#: not under a site directory; what runs or installs the file later is classified where it does).
HARMLESS: dict[str, tuple[str, str]] = {
    # --- the shell's own builtins and control
    ":": ("any", "the null command"),
    "true": ("any", "exits 0"),
    "false": ("any", "exits 1"),
    "set": ("any", "sets shell options (-e, -u, -x, pipefail)"),
    "shopt": ("any", "sets shell options"),
    "exit": ("any", "ends the script (the build fails on a non-zero status)"),
    "return": ("any", "ends a function"),
    "break": ("any", "leaves a loop"),
    "continue": ("any", "goes on with a loop's next round"),
    "shift": ("any", "shifts the positional parameters"),
    "unset": ("any", "removes a shell variable"),
    "readonly": ("any", "marks shell variables read-only (assignments are read as assignments)"),
    "local": ("any", "declares function-local variables"),
    "declare": ("any", "declares shell variables"),
    "umask": ("any", "sets the file-creation mask"),
    "ulimit": ("any", "sets process limits"),
    "wait": ("any", "waits for background jobs"),
    "cd": ("paths", "changes the working folder (not into a site directory)"),
    "pwd": ("any", "prints the working folder"),
    "trap": ("trap", "runs its command text on a signal; that text is read as shell"),
    "sleep": ("any", "waits"),
    "echo": ("any", "prints text (a redirect's target is checked as a written path)"),
    "printf": ("any", "prints text (a redirect's target is checked as a written path)"),
    "test": ("any", "evaluates a condition"),
    "[": ("any", "evaluates a condition"),
    "[[": ("any", "evaluates a condition"),
    "command": ("wrapper", "`command -v X` looks X up; `command X` runs X, classified in turn"),
    "type": ("any", "describes a command name"),
    "which": ("any", "looks a program up on PATH"),
    "hash": ("any", "the shell's program lookup cache"),
    # --- wrappers: the command they run is classified in turn
    "sudo": ("wrapper", "runs the command that follows as root"),
    "env": ("wrapper", "runs the command that follows with variables set"),
    "nohup": ("wrapper", "runs the command that follows"),
    "timeout": ("wrapper", "runs the command that follows with a time limit"),
    "time": ("wrapper", "times the command that follows"),
    "nice": ("wrapper", "runs the command that follows at a priority"),
    "exec": ("wrapper", "replaces the shell with the command that follows"),
    "xargs": ("wrapper", "runs the command that follows (echo without one) with its input as arguments"),
    # --- Debian packages: recorded as the recipe's os_packages; none writes Python's site-packages of the image
    "apt-get": ("apt", "Debian packages (recorded as os_packages); a python3-X module package is refused"),
    "apt": ("apt", "Debian packages (recorded as os_packages); a python3-X module package is refused"),
    "apt-key": ("any", "manages apt's signing keys"),
    "apt-cache": ("any", "queries apt's package lists"),
    "apt-mark": ("any", "marks Debian packages held or manual"),
    "add-apt-repository": ("any", "adds an apt source (a PPA): packages come from apt-get, checked there"),
    "dpkg": ("any", "queries or configures Debian packages (installs go through apt-get)"),
    "dpkg-reconfigure": ("any", "reconfigures a Debian package"),
    "debconf-set-selections": ("any", "presets Debian package questions"),
    "update-alternatives": ("any", "points /usr/bin names at installed programs (which python3 is)"),
    "locale-gen": ("any", "generates locales"),
    "update-ca-certificates": ("any", "refreshes the CA store"),
    "ldconfig": ("any", "refreshes the shared-library cache"),
    "useradd": ("any", "adds an OS user"),
    "groupadd": ("any", "adds an OS group"),
    "usermod": ("any", "changes an OS user"),
    # --- files, outside Python's site directories
    "mkdir": ("paths", "creates folders"),
    "rmdir": ("paths", "removes empty folders"),
    "rm": ("paths", "removes files"),
    "ln": ("dest", "creates a link (the link's own path is checked; its target is only text)"),
    "cp": ("dest", "copies files (the destination is checked)"),
    "mv": ("paths", "moves files (both ends are checked)"),
    "install": ("dest", "copies a file with a mode (the destination is checked)"),
    "touch": ("paths", "creates empty files"),
    "chmod": ("any", "changes permission bits (no content)"),
    "chown": ("any", "changes owners (no content)"),
    "chgrp": ("any", "changes groups (no content)"),
    "tee": ("paths", "copies its input to files"),
    "mktemp": ("any", "creates a scratch file or folder under /tmp"),
    "tar": ("paths", "packs or unpacks archives (its -C folder and files are checked)"),
    "unzip": ("paths", "unpacks a zip (its -d folder is checked)"),
    "gpg": ("any", "verifies or converts keys"),
    "sha256sum": ("any", "checks or prints digests"),
    "sha512sum": ("any", "checks or prints digests"),
    "md5sum": ("any", "checks or prints digests"),
    "curl": ("curl", "downloads to its -o file or to a pipe (what installs or runs the file is classified there)"),
    "wget": ("curl", "downloads to its -O file (what installs or runs the file is classified there)"),
    "find": ("find", "lists files (-exec and site-directory -delete refused)"),
    "make": ("make", "builds a C project in the folder it is given (no install target)"),
    "gcc": ("dest", "compiles C (its output is checked)"),
    # --- text filters and queries
    **{
        name: ("any", "reads files or its input and prints")
        for name in (
            "cat",
            "grep",
            "sed",
            "awk",
            "cut",
            "tr",
            "head",
            "tail",
            "sort",
            "uniq",
            "wc",
            "ls",
            "stat",
            "du",
            "df",
            "basename",
            "dirname",
            "readlink",
            "realpath",
            "date",
            "nproc",
            "id",
            "uname",
            "lsb_release",
            "file",
            "ldd",
            "nvidia-smi",
            "getent",
            "diff",
            "cmp",
        )
    },
}

#: programs a release's image downloads (not files of its build context) whose effect is known: name -> reason.
#: Used only where the build context holds no file of that path.
EXTERNAL_PROGRAMS: dict[str, str] = {
    "efa_installer.sh": "AWS's EFA installer, from the archive whose sha256 the line checks before: installs "
    "libfabric and aws-ofi-nccl under /opt/amazon (rdma-core and MPI skipped by --skip-rdma-core/--skip-mpi) "
    "as Debian packages; it installs no Python distribution",
    "fi_info": "libfabric's query tool (installed by the EFA installer): lists the fabric providers",
}

# ``sed -i`` writes its files: checked as ``paths``.
_SED_INPLACE = re.compile(r"^-[a-zA-Z]*i")
# a query any program answers by printing: `X --version`, `X --help`
VERSION_QUERY = ("--version", "-V", "--help", "version")
VERSION_REASON = "prints its version or usage (`--version`/`--help`, the whole command line)"
# text of a Python program that can install, run a program or write into a site directory
_PY_INSTALLS = re.compile(
    r"\bpip\b|\buv\b|setup\.py|ensurepip|subprocess|os\.system|os\.popen|os\.exec|os\.spawn|\bpty\b|"
    r"shutil|write_text|write_bytes|open\([^)]*['\"][wax+]|runpy|importlib\.util\.spec_from|__import__|"
    r"\beval\(|\bexec\("
)


# what a harmless Python text may not name: modules that run programs, install or write files, and the
# builtins and attributes that reach them indirectly (read by ``ast``, so string tricks need one of these)
_PY_MODULES = {
    "subprocess",
    "shutil",
    "pty",
    "runpy",
    "ctypes",
    "multiprocessing",
    "pip",
    "setuptools",
    "ensurepip",
    "site",
    "importlib.util",
    "importlib.machinery",
    "builtins",
    "socket",
    "urllib",
    "code",
    "codeop",
    "pathlib",
    "tempfile",
    "zipfile",
    "tarfile",
    "distutils",
    "sysconfig_write",
    "uv",
}
_PY_NAMES = {
    "exec",
    "eval",
    "compile",
    "__import__",
    "open",
    "getattr",
    "setattr",
    "delattr",
    "globals",
    "locals",
    "vars",
    "breakpoint",
    "input",
    "__builtins__",
    "__loader__",
    "__spec__",
}
_PY_ATTRS = re.compile(
    r"^(system|popen|spawn\w*|exec\w*|fork\w*|run|call|check_call|check_output|Popen|import_module|"
    r"write\w*|copy\w*|move|rmtree|symlink|link|rename|replace|remove|unlink|mkdir|makedirs|chmod|chown|"
    r"install|putenv|truncate|open\w*|load_module|exec_module|__\w+__)$"
)


def python_text_installs(text: str) -> str | None:
    """The first construct of a Python program's text that can install, run a program or write a file, or
    None (pure): a Python heredoc or ``python3 -c`` is harmless only when this is None.  The text is read by
    :mod:`ast`: an import of a module that runs programs or writes files, a builtin that reaches one
    indirectly (``__import__``, ``getattr``, ``exec``, ``open``), or such an attribute (``.system``,
    ``.run``, ``.write_text``, ``.import_module``, dunders) is named; text that is not Python is too."""
    import ast

    m = _PY_INSTALLS.search(text)
    if m:
        return m.group(0)
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return "text that is not Python the reader can parse"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for mod in mods:
                if mod in _PY_MODULES or mod.split(".")[0] in _PY_MODULES:
                    return f"import {mod}"
            if isinstance(node, ast.ImportFrom):
                for a in node.names:
                    if a.name in _PY_NAMES or _PY_ATTRS.match(a.name) or a.name == "*":
                        return f"from {node.module} import {a.name}"
        elif isinstance(node, ast.Name) and node.id in _PY_NAMES:
            return node.id
        elif isinstance(node, ast.Attribute) and _PY_ATTRS.match(node.attr) and node.attr != "__version__":
            return f".{node.attr}"
    return None


def apt_python(argv: list[str]) -> str | None:
    """A Debian Python module package (``python3-yaml``: Ubuntu's own Python's modules, which the image's
    python3 may read) among an ``apt-get install``'s operands, or None (pure).  The interpreter's own
    packages (``python3.12``, ``python3.12-dev``, ``python3-dev``, ``python3-pip`` …) are allowed."""
    if "install" not in argv:
        return None
    for a in argv[argv.index("install") + 1 :]:
        if re.match(r"^python3-(?!dev$|venv$|pip$|distutils$|minimal$|setuptools$)[a-z]", a):
            return a
    return None


@dataclass
class Verdict:
    """What one command does: ``harmless`` (reason), ``installs``, or ``shell`` (text read as shell)."""

    kind: str
    reason: str
    text: str = ""


def unquote(raw: str) -> str:
    """A word's text with its quotes removed, its expansions left as written (pure)."""
    out, i, n = [], 0, len(raw)
    while i < n:
        c = raw[i]
        if c == "'":
            j = raw.find("'", i + 1)
            j = n if j < 0 else j
            out.append(raw[i + 1 : j])
            i = j + 1
        elif c == '"':
            i += 1
        elif c == "\\" and i + 1 < n:
            out.append(raw[i + 1])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


@dataclass
class Scope:
    """What the lexical reader knows: which variables may hold a site path (``tainted``), and how to read a
    script of the build context (``script``: path -> (shown name, text) or None)."""

    tainted: set[str] = field(default_factory=set)
    script: Callable[[str], tuple[str, str] | None] = lambda _p: None
    depth: int = 0
    functions: set[str] = field(default_factory=set)

    def site(self, raw: str) -> bool:
        if python_tree(raw):
            return True
        return any(name in self.tainted for name in re.findall(r"\$\{?(\w+)", raw))


def _operands(words: list[str]) -> list[str]:
    return [w for w in words[1:] if not unquote(w).startswith("-")]


def table_verdict(words: list[str], scope: Scope) -> Verdict:
    """The verdict of a command of :data:`HARMLESS` (raw words, quotes kept), or :class:`Unknown` (pure)."""
    prog = unquote(words[0]).rsplit("/", 1)[-1] if words[0].startswith("/") else unquote(words[0])
    rule, reason = HARMLESS.get(prog, (None, ""))
    if rule is None:
        if len(words) == 2 and unquote(words[1]) in VERSION_QUERY:
            return Verdict("harmless", VERSION_REASON)
        raise Unknown(f"the command {prog!r} (not known to leave site-packages alone)")
    ops = _operands(words)
    if prog == "sed" and any(_SED_INPLACE.match(unquote(w)) for w in words[1:]):
        rule = "paths"
    if prog == "cd" and any("lib/python" in w or scope.site(w) for w in ops):
        raise Unknown(f"cd into a Python folder ({' '.join(words)[:120]}): later paths may reach site-packages")
    if rule == "paths" and any(scope.site(w) for w in ops):
        raise Unknown(f"{prog} on a path under a site directory ({' '.join(words)[:120]})")
    if rule == "dest" and ops and scope.site(ops[-1]):
        raise Unknown(f"{prog} writes under a site directory ({' '.join(words)[:120]})")
    if rule == "apt":
        bad = apt_python([unquote(w) for w in words])
        if bad:
            raise Unknown(f"{prog} installs {bad}, a module package of Ubuntu's own Python")
    if rule == "find" and any(unquote(w) in ("-exec", "-execdir", "-ok", "-okdir") for w in words):
        raise Unknown(f"find -exec runs commands ({' '.join(words)[:120]})")
    if rule == "find" and "-delete" in words and any(scope.site(w) for w in ops):
        raise Unknown(f"find -delete under a site directory ({' '.join(words)[:120]})")
    if rule == "make" and any(unquote(w) == "install" or scope.site(w) for w in ops):
        raise Unknown(f"make with an install target ({' '.join(words)[:120]})")
    if rule == "curl":
        for k, w in enumerate(words[:-1]):
            if unquote(w) in ("-o", "-O", "--output", "--output-document") and scope.site(words[k + 1]):
                raise Unknown(f"{prog} writes under a site directory ({' '.join(words)[:120]})")
    if rule == "trap":
        return Verdict("shell", reason, unquote(words[1]) if len(words) > 1 else "")
    return Verdict("harmless", reason)


# --------------------------------------------------------------------------- one command
_WRAPPER_VALUE_OPTS = {"timeout": 1, "nice": 0, "xargs": 0, "env": 0}
OFF_INDEX_COMMANDS = {
    ("flashinfer", "download-kernels"): "FlashInfer's precompiled kernels (flashinfer download-kernels)",
    ("flashinfer", "download-cubin"): "FlashInfer's precompiled cubins (flashinfer download-cubin)",
}
#: subcommands of programs the image's own packages install that only print: (program, subcommand) -> reason
PROGRAM_QUERIES = {
    ("flashinfer", "show-config"): "prints FlashInfer's configuration",
    ("vllm", "--version"): "prints vLLM's version",
}
PIP_QUERIES = ("list", "show", "freeze", "check", "--version", "-V", "config", "cache", "debug", "help")


def install_kind(argv: list[str]) -> str | None:
    """``install``/``uninstall`` for a pip or ``uv pip`` command that changes site-packages, ``query`` for one
    that only reads it, None for a command that is no pip (pure; ``argv`` unquoted)."""
    if len(argv) >= 2 and argv[0] == "uv" and argv[1] == "pip":
        sub = argv[2] if len(argv) > 2 else ""
    elif len(argv) >= 3 and re.fullmatch(r"python[\d.]*", argv[0]) and argv[1:3] == ["-m", "pip"]:
        sub = argv[3] if len(argv) > 3 else ""
    elif argv and re.fullmatch(r"pip[\d.]*", argv[0]):
        sub = argv[1] if len(argv) > 1 else ""
    elif argv and (argv[0] == "easy_install" or "setup.py" in argv[:2]):
        return "install"
    elif argv and argv[0] == "uv" and len(argv) > 1 and argv[1] in ("--version", "-V", "help", "version"):
        return "query"
    elif argv and argv[0] == "uv":
        return "install"  # uv add/sync/run/tool: the reader interprets only `uv pip`
    else:
        return None
    if sub in PIP_QUERIES or sub == "download":
        return "query"
    return "install"


def classify(words: list[str], scope: Scope) -> Verdict:
    """The verdict of one simple command (raw words, quotes kept; leading ``VAR=x`` dropped) (pure):
    ``installs``, ``shell`` (text to read: ``sh -c``, ``trap``), ``script`` (a file to read as shell),
    ``python`` (a Python file to check), ``stdin-shell``/``stdin-python`` (a shell or Python reading its
    input), ``fetch`` (:data:`OFF_INDEX_COMMANDS`), ``harmless``; :class:`Unknown` otherwise."""
    while len(words) > 1 and re.match(r"^\w+=", words[0]):
        words = words[1:]
    if re.match(r"^\w+=", words[0]):
        name, _, value = words[0].partition("=")
        if scope.site(value):
            scope.tainted.add(name)
        return Verdict("harmless", "sets a shell variable")
    argv = [unquote(w) for w in words]
    prog = argv[0]
    base = prog.rsplit("/", 1)[-1]
    if base in EXTERNAL_PROGRAMS and scope.script(prog) is None:
        return Verdict("harmless", EXTERNAL_PROGRAMS[base])
    kind = install_kind([base, *argv[1:]])
    if kind == "install":
        return Verdict("installs", " ".join(argv))
    if kind == "query":
        return Verdict("harmless", "reads what pip or uv has installed")
    for key, what in OFF_INDEX_COMMANDS.items():
        if tuple(argv[: len(key)]) == key:
            return Verdict("fetch", what)
    if tuple(argv[:2]) in PROGRAM_QUERIES:
        return Verdict("harmless", PROGRAM_QUERIES[tuple(argv[:2])])
    if base in ("sh", "bash", "dash"):
        return _shell_verdict(words, argv)
    if prog in (".", "source"):
        if len(argv) < 2:
            raise Unknown(f"{prog} without a file")
        return Verdict("script", "sourced in this shell", argv[1])
    if re.fullmatch(r"python[\d.]*", base):
        return _python_verdict(argv)
    if prog in ("export", "readonly", "local", "declare", "typeset"):
        for w in words[1:]:
            if "=" in w and scope.site(w.split("=", 1)[1]):
                scope.tainted.add(w.split("=", 1)[0])
        return Verdict("harmless", "sets shell variables")
    if prog in scope.functions:
        return Verdict("harmless", "a function of this script (its body is read where it is defined)")
    if base in HARMLESS and HARMLESS[base][0] == "wrapper":
        return _wrapper_verdict(words, argv, base, scope)
    if ("/" in prog or prog.endswith(".sh")) and base not in HARMLESS:
        if len(argv) == 2 and argv[1] in VERSION_QUERY:
            return Verdict("harmless", VERSION_REASON)
        return Verdict("script", "run as a program", prog)
    return table_verdict(words, scope)


def _shell_verdict(words: list[str], argv: list[str]) -> Verdict:
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-c", "-", "-s"):
        i += 1
    if i < len(argv) and argv[i] == "-c":
        if i + 1 >= len(argv):
            raise Unknown(f"{argv[0]} -c without its text")
        return Verdict("shell", f"{argv[0]} -c", argv[i + 1])
    if i >= len(argv) or argv[i] in ("-", "-s"):
        return Verdict("stdin-shell", f"{argv[0]} reading its input")
    return Verdict("script", f"run by {argv[0]}", argv[i])


def _python_verdict(argv: list[str]) -> Verdict:
    rest = argv[1:]
    while rest and rest[0] in ("-u", "-B", "-E", "-s", "-I", "-O", "-q"):
        rest = rest[1:]
    if rest and rest[0] in VERSION_QUERY:
        return Verdict("harmless", VERSION_REASON)
    if rest and rest[0] == "-c":
        text = rest[1] if len(rest) > 1 else ""
        bad = python_text_installs(text)
        if bad:
            raise Unknown(f"python -c text that may install or write ({bad!r})")
        return Verdict("harmless", "Python text with no install, program run or site-directory write")
    if rest and rest[0] == "-m":
        raise Unknown(f"python -m {rest[1] if len(rest) > 1 else ''} (a module run as a program)")
    if not rest or rest[0] == "-":
        return Verdict("stdin-python", "Python reading its input")
    return Verdict("python", "a Python file run", rest[0])


def _wrapper_verdict(words: list[str], argv: list[str], base: str, scope: Scope) -> Verdict:
    i = 1
    skip_values = _WRAPPER_VALUE_OPTS.get(base, 0)
    while i < len(argv) and (argv[i].startswith("-") or (base == "env" and "=" in argv[i])):
        i += 1
    i += skip_values if i < len(argv) else 0
    if base == "command" and len(argv) > 1 and argv[1] in ("-v", "-V"):
        return Verdict("harmless", "looks a program up")
    if i >= len(argv):
        return Verdict("harmless", HARMLESS[base][1])
    return classify(words[i:], scope)


# --------------------------------------------------------------------------- heredocs
_HEREDOC = re.compile(r"<<(-?)[ \t]*([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
HEREDOC_PATH = "/dev/heredoc/"


def lift_heredocs(text: str, where: str) -> tuple[str, dict[str, str]]:
    """Shell text with each ``<<WORD`` / ``<<-WORD`` / ``<<'WORD'`` body lifted out (its lines left blank so
    every later line keeps its number) and the marker replaced by the redirect ``< /dev/heredoc/…``; returns
    (text, {that path: body}).  A body whose end word never comes is :class:`Unknown` naming ``where`` and
    the line (pure)."""
    lines = text.split("\n")
    bodies: dict[str, str] = {}
    i = 0
    while i < len(lines):
        end, found = lift_line(lines, i, where)
        bodies.update(found)
        i = end
    return "\n".join(lines), bodies


def heredoc_marks(line: str) -> list[re.Match]:
    """The heredoc markers of one line (``<<<`` here-strings are not heredocs) (pure)."""
    return [m for m in _HEREDOC.finditer(line) if not (m.start() > 0 and line[m.start() - 1] == "<")]


def lift_line(lines: list[str], i: int, where: str) -> tuple[int, dict[str, str]]:
    """Lift the heredoc bodies that line ``i`` opens (in place, see :func:`lift_heredocs`); returns the index
    of the line after the last body and {path: body}."""
    marks = heredoc_marks(lines[i])
    if not marks or lines[i].rstrip().endswith("\\"):
        return i + 1, {}
    tag = re.sub(r"[^\w./:-]", "_", where)
    pending = [(f"{HEREDOC_PATH}{tag}:{i + 1}:{k}", m) for k, m in enumerate(marks)]
    head, end, bodies = lines[i], i + 1, {}
    for path, m in reversed(pending):
        head = head[: m.start()] + f"< {path}" + head[m.end() :]
    for path, m in pending:
        strip, word, start = m.group(1) == "-", m.group(3), end
        while end < len(lines) and (lines[end].lstrip("\t") if strip else lines[end]).rstrip() != word:
            end += 1
        if end >= len(lines):
            raise Unknown(f"the heredoc <<{word} opened at {where}:{i + 1} is never closed")
        bodies[path] = "\n".join(ln.lstrip("\t") if strip else ln for ln in lines[start:end]) + "\n"
        end += 1
    lines[i] = head
    for j in range(i + 1, end):
        lines[j] = ""
    return end, bodies


# --------------------------------------------------------------------------- the lexical reader
#: how many shell texts deep (``sh -c`` in a script run by a script …) the readers follow
MAX_DEPTH = 8
#: the largest script or shell text read (a build script is kilobytes)
MAX_TEXT = 1 << 20
_SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", "{", "}", "!", ";;"}
_OPENERS = {"then", "do", "else", "elif", "if", "while", "until", "fi", "done", "esac"}
_REDIRECTS = {">", ">>", "<", "2>", "&>"}


@dataclass
class Row:
    """One command the readers classified: where (``file:line``), its text, and the conclusion."""

    where: str
    command: str
    conclusion: str


def lexical_read(text: str, where: str, scope: Scope, rows: list[Row]) -> None:
    """Classify every command of shell text the interpreter does not run (a script with arrays or ``[[``, a
    loop's body, a branch not decided): each must be harmless (:data:`HARMLESS`) or shell text read the same
    way; an install or an unknown command is :class:`Unknown` naming ``where`` and the line (pure apart
    from ``rows``)."""
    if len(text) > MAX_TEXT:
        raise Unknown(f"{where} is {len(text)} bytes, more than a build script holds ({MAX_TEXT} at most)")
    if scope.depth > MAX_DEPTH:
        raise Unknown(f"{where}: shell texts nested more than {MAX_DEPTH} deep")
    text, bodies = lift_heredocs(text, where)
    try:
        toks, lines = tokenize_lines(text)
    except (ValueError, IndexError, Unknown) as exc:
        raise Unknown(f"{where}: the shell text cannot be split into words ({exc or 'an unclosed quote'})") from None
    i, n, case_arms = 0, len(toks), []
    while i < n:
        t = toks[i]
        if t in _SEPARATORS or t in _OPENERS:
            if t == ";;" and case_arms:
                i = _skip_pattern(toks, i + 1, f"{where}:{lines[i]}")
                continue
            if t == "esac" and case_arms:
                case_arms.pop()
            i += 1
            continue
        at = f"{where}:{lines[i]}"
        i = _lexical_unit(toks, lines, i, at, scope, rows, bodies, case_arms)


def _skip_pattern(toks: list[str], i: int, at: str) -> int:
    """Past a case arm's patterns (``a|b)``), or at ``esac``; anything but words and ``|`` before the ``)``
    is Unknown (a command is never skipped as a pattern)."""
    while i < len(toks) and toks[i] == ";":
        i += 1
    if i < len(toks) and toks[i] == "esac":
        return i
    if i < len(toks) and toks[i] == "(":
        i += 1
    while i < len(toks) and toks[i] != ")":
        if toks[i] in _SEPARATORS and toks[i] != "|" or toks[i] in _OPENERS:
            raise Unknown(f"{at}: a case arm whose pattern has no ')'")
        i += 1
    return i + 1


def _lexical_unit(toks, lines, i, at, scope, rows, bodies, case_arms) -> int:
    t, n = toks[i], len(toks)
    if t == "case":
        _substitutions(toks[i + 1] if i + 1 < n else "", at, scope, rows)
        if i + 2 >= n or toks[i + 2] != "in":
            raise Unknown(f"{at}: a case without its 'in'")
        case_arms.append(i)
        return _skip_pattern(toks, i + 3, at)
    if t in ("for", "select"):
        j = i + 2
        while j < n and toks[j] not in (";", "do"):
            _substitutions(toks[j], at, scope, rows)
            j += 1
        return j
    if t == "[[":
        j = i + 1
        while j < n and toks[j] != "]]":
            _substitutions(toks[j], at, scope, rows)
            j += 1
        return j + 1
    if t == "function" or (i + 2 < n and toks[i + 1] == "(" and toks[i + 2] == ")"):
        scope.functions.add(toks[i + 1] if t == "function" else t)
        return i + (2 if t == "function" else 3)
    if re.match(r"^\w+(\[[^]]*\])?\+?=", t):
        _substitutions(t, at, scope, rows)
        name = re.match(r"^\w+", t).group(0)
        if scope.site(t.split("=", 1)[1]):
            scope.tainted.add(name)
        if t.endswith("=") and i + 1 < n and toks[i + 1] == "(":  # an array: its words up to ')'
            j = i + 2
            while j < n and toks[j] != ")":
                _substitutions(toks[j], at, scope, rows)
                scope.tainted.update([name] if scope.site(toks[j]) else [])
                j += 1
            return j + 1
        return i + 1
    words, stdin, j = [], None, i
    while j < n and toks[j] not in _SEPARATORS:
        if toks[j] in _REDIRECTS and j + 1 < n:
            target = toks[j + 1]
            if target == "(":
                raise Unknown(f"{at}: a process substitution ({toks[j]}( … )), which the reader does not follow")
            _substitutions(target, at, scope, rows)
            if toks[j] == "<":
                stdin = bodies.get(unquote(target), stdin)
            elif scope.site(target):
                raise Unknown(f"{at}: a redirect writes under a site directory ({target})")
            j += 2
            continue
        if toks[j] not in STREAM_JOINS:
            words.append(toks[j])
        j += 1
    for w in words:
        _substitutions(w, at, scope, rows)
    if words:
        lexical_command(words, stdin, at, scope, rows)
    return j


def _substitutions(word: str, at: str, scope: Scope, rows: list[Row]) -> None:
    """Every ``$(…)`` and backquoted command inside one word, read as shell text."""
    for inner in command_substitutions(word):
        lexical_read(inner, at, Scope(scope.tainted, scope.script, scope.depth + 1, scope.functions), rows)


def command_substitutions(word: str) -> list[str]:
    """The texts of the ``$(…)`` (not ``$((…))`` arithmetic, whose own ``$(…)`` are found) and backquoted
    commands inside a raw word, outermost first (pure)."""
    out, i, n = [], 0, len(word)
    while i < n:
        if word.startswith("$((", i):
            i += 3
            continue
        if word.startswith("$(", i):
            depth, j = 0, i + 1
            while j < n:
                depth += {"(": 1, ")": -1}.get(word[j], 0)
                if depth == 0:
                    break
                j += 1
            out.append(word[i + 2 : j])
            i = j + 1
            continue
        if word[i] == "`":
            j = word.find("`", i + 1)
            j = n if j < 0 else j
            out.append(word[i + 1 : j])
            i = j + 1
            continue
        i += 1
    return out


def lexical_command(words: list[str], stdin: str | None, at: str, scope: Scope, rows: list[Row]) -> None:
    """Classify one command for :func:`lexical_read`: shell text and scripts are read in turn."""
    try:
        v = classify(words, scope)
    except Unknown as exc:
        raise Unknown(f"{at}: {exc}") from None
    text = " ".join(words)[:160]
    deeper = Scope(scope.tainted, scope.script, scope.depth + 1, scope.functions)
    if stdin is not None and v.kind != "stdin-shell":
        _substitutions(stdin, at, scope, rows)  # an unquoted heredoc runs its $(…) before the command reads it
    if v.kind == "installs":
        raise Unknown(f"{at}: {v.reason[:160]} installs, in text the reader does not interpret")
    if v.kind == "shell":
        rows.append(Row(at, text, f"shell text ({v.reason}), read"))
        lexical_read(v.text, at, deeper, rows)
    elif v.kind in ("script", "python"):
        found = scope.script(v.text)
        if found is None:
            raise Unknown(f"{at}: {v.text} ({v.reason}) is not a file of the build context the reader has")
        name, body = found
        rows.append(Row(at, text, f"{name} ({v.reason}), read"))
        if v.kind == "python":
            bad = python_text_installs(body)
            if bad:
                raise Unknown(f"{at}: the Python file {name} may install or write ({bad!r})")
        else:
            lexical_read(body, name, deeper, rows)
    elif v.kind in ("stdin-shell", "stdin-python"):
        if stdin is None:
            raise Unknown(f"{at}: {v.reason}, which the reader cannot see ({text})")
        bad = python_text_installs(stdin) if v.kind == "stdin-python" else None
        if bad:
            raise Unknown(f"{at}: the Python heredoc may install or write ({bad!r})")
        rows.append(Row(at, text, f"{v.reason} (a heredoc), read"))
        if v.kind == "stdin-shell":
            lexical_read(stdin, at, deeper, rows)
    else:
        rows.append(Row(at, text, f"{'fetches' if v.kind == 'fetch' else 'harmless'}: {v.reason}"))
