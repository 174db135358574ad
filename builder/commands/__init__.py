"""One click command (or group) per module; builder.cli registers them.

Each command parses its flags, calls one stage function in ``builder/``, prints and
maps the outcome to an exit code; no command imports or invokes another.  A command imports
its stage inside its function: ``build-image --help`` imports every command module to list it,
and a stage (with its dependencies) loads only when its command runs."""


def stderr_console(**kw):
    """The rich console every command reports progress on (stderr; stdout stays for results).
    Not a terminal (a CI log, a pipe): no wrapping at 80 columns, so a wheel name or a suggested
    command stays on one line, copy-pasteable."""
    from rich.console import Console

    kw.setdefault("highlight", False)
    console = Console(stderr=True, **kw)
    if not console.is_terminal:
        console.soft_wrap = True
    return console


def mark_direction(text: str, fmt: str, direction: str, from_version: str, to_version: str) -> str:
    """A report (``upgrade``, ``patch port``) of a downgrade says so first (text, markdown) or carries
    ``"direction": "downgrade"`` (json); an upgrade's report is unchanged."""
    if direction != "downgrade":
        return text
    if fmt == "json":
        import json

        from builder.report import render_json  # the one JSON writer (redacted); this module loads for --help

        doc = json.loads(text)
        if isinstance(doc, dict):
            doc = {"direction": "downgrade", **doc}
        return render_json(doc, ensure_ascii=True)
    line = f"DOWNGRADE: vllm {from_version} -> {to_version} ({to_version} is the older release)"
    return (f"**{line}**\n\n" if fmt == "markdown" else f"{line}\n") + text


def platform_option(*, several: bool = True, help_extra: str = ""):
    """The ``--platform`` option of a command: OS/ARCH (``linux/amd64``, ``linux/arm64``), several
    comma-separated where the command makes one result per platform; parsed by the command with
    ``builder.platforms.parse_list``/``parse`` (exit 2 naming the known platforms)."""
    import click

    what = "OS/ARCH[,OS/ARCH]" if several else "OS/ARCH"
    text = (
        "Target platform" + ("s, comma-separated" if several else "") + ": linux/amd64 (default) or "
        "linux/arm64 (GH200, GB200/GB300)" + (", or both" if several else "") + "." + help_extra
    )
    return click.option("--platform", "platform", default=None, metavar=what, help=text)
