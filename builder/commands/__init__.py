"""One click command (or group) per module; builder.cli registers them.

Each command parses its flags, calls one stage function in ``builder/``, prints and
maps the outcome to an exit code; no command imports or invokes another."""


def stderr_console():
    """The rich console every command reports progress on (stderr; stdout stays for results)."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)
