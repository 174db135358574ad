#!/usr/bin/env python3
"""The device calls of a layered-bundle proof, in order, and after a lost machine the ones still needed.

    bundle_calls.py calls  --bundle DIR --releases "0.26.0 0.34.0" [--serve-releases "0.34.0"] [--no-launch]
    bundle_calls.py resend REPLY --bundle DIR --releases ... [--serve-releases ...] [--no-launch]

``calls`` prints one line per `run` call: the paths it carries, a tab, then its command (``scripts/gpu-proof.sh
layer LAYER N``).  The first release's engine layers go first, the ray layers (Serve runs only) last; the call
carrying the first release's last part is ``launch LAYER N`` (the run starts while the other layers upload:
proof-run.sh waits for each release's layers), then the other layers' parts, then ``wait``.  With --no-launch
the last part of all is ``run LAYER N`` (the run starts once every layer is installed).  The environment of
the run (RELEASES, UNPATCHED, ...) is the caller's: these lines name only the calls.

``resend`` reads REPLY (the text of the last reply: its output_tail, or the tool's one-line refusal) and prints
the calls still needed.  Every upload call prints an ``INVENTORY boot=ID LAYER=STATE ...`` line
(scripts/gpu/device-calls.sh): STATE is ok, installing, failed or HAVE/WANT:parts held.  A reply without one
(the machine went back, a call failed before receiving) means a bare machine: every call again.  Otherwise the
parts of each needed layer that is neither ok nor installing and that the machine does not hold, a failed
layer's parts all; then the launch (unless the reply shows the run in flight) and ``wait``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

PROOF = "scripts/gpu-proof.sh"


@dataclass(frozen=True)
class Call:
    carry: tuple[str, ...]
    command: str

    def line(self) -> str:
        return " ".join(self.carry) + "\t" + self.command


def needed_layers(manifest: dict, releases: list[str], serve_releases: list[str]) -> list[str]:
    """The layers the releases need, each once, the first release's first; ray layers only for serve_releases."""
    unknown = [v for v in releases + serve_releases if v not in manifest["releases"]]
    if unknown:
        raise SystemExit(
            f"bundle_calls: the bundle's manifest has no release {', '.join(unknown)} "
            f"(it has {', '.join(manifest['releases'])}): build it with make-bundle.sh --vllm ..."
        )
    out: list[str] = []
    for v in releases + serve_releases:
        for layer in manifest["releases"][v]:
            if layer not in out and (manifest["layers"][layer]["kind"] != "ray" or v in serve_releases):
                out.append(layer)
    # the ray layers last: only the Serve runs, after every release's engine runs, import ray
    return sorted(out, key=lambda layer: manifest["layers"][layer]["kind"] == "ray")


def parse_inventory(reply: str) -> tuple[str | None, dict[str, str]]:
    """The boot id and LAYER -> STATE of the reply's last INVENTORY line; (None, {}) when it has none."""
    lines = [ln for ln in reply.splitlines() if ln.startswith("INVENTORY ")]
    if not lines:
        return None, {}
    fields = dict(f.split("=", 1) for f in lines[-1].split()[1:] if "=" in f)
    return fields.pop("boot", None), fields


def held_parts(state: str) -> set[int] | None:
    """None: the whole layer is done (ok, installing); else the part numbers the machine holds."""
    if state in ("ok", "installing"):
        return None
    m = re.fullmatch(r"(\d+)/(\d+)(?::([\d,]+))?", state)
    if not m:  # failed, or anything unreadable: the layer again
        return set()
    return {int(x) for x in m.group(3).split(",")} if m.group(3) else set()


def plan_calls(
    manifest: dict,
    bundle: str,
    releases: list[str],
    serve_releases: list[str],
    *,
    launch: bool = True,
    held: dict[str, set[int] | None] | None = None,
    run_in_flight: bool = False,
) -> list[Call]:
    """The calls, in order: every part not in ``held`` (LAYER -> parts held, None: done), the launch, then wait."""
    held = held or {}
    layers = needed_layers(manifest, releases, serve_releases)
    first = [
        lay for lay in layers if lay in manifest["releases"][releases[0]] and manifest["layers"][lay]["kind"] != "ray"
    ]
    uploads: list[tuple[str, int]] = []
    for layer in layers:
        have = held.get(layer, set())
        if have is None:
            continue
        uploads += [(layer, i) for i in range(len(manifest["layers"][layer]["parts"])) if i not in have]
    man = f"{bundle}/manifest.json"
    calls = [Call((man, f"{bundle}/{layer}/p{i:02d}"), f"{PROOF} layer {layer} {i}") for layer, i in uploads]
    if run_in_flight:
        return calls + [Call((), f"{PROOF} wait")]
    if launch:
        # the launch rides on the last upload of the first release's layers (or stands alone when they are there)
        idx = max((k for k, (layer, _) in enumerate(uploads) if layer in first), default=None)
        if idx is None:
            calls.insert(0, Call((man,), f"{PROOF} launch"))
        else:
            layer, i = uploads[idx]
            calls[idx] = Call(calls[idx].carry, f"{PROOF} launch {layer} {i}")
    elif calls:
        layer, i = uploads[-1]
        calls[-1] = Call(calls[-1].carry, f"{PROOF} run {layer} {i}")
    else:
        calls.append(Call((man,), f"{PROOF} run"))
    return calls + [Call((), f"{PROOF} wait")]


def resend(
    manifest: dict, bundle: str, reply: str, releases: list[str], serve_releases: list[str], *, launch: bool = True
) -> tuple[str, list[Call]]:
    boot, inv = parse_inventory(reply)
    if boot is None:
        return (
            "no INVENTORY in the reply: the machine is bare (it went back, or the call failed before receiving); "
            "every call again",
            plan_calls(manifest, bundle, releases, serve_releases, launch=launch),
        )
    held = {layer: held_parts(state) for layer, state in inv.items()}
    in_flight = bool(re.search(r"run in flight \(alive\)|LAUNCHED|STILL RUNNING", reply))
    calls = plan_calls(manifest, bundle, releases, serve_releases, launch=launch, held=held, run_in_flight=in_flight)
    return f"machine boot {boot}: {len(calls) - 1} call(s) before the wait", calls


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="bundle_calls.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("calls", "resend"))
    ap.add_argument("reply", nargs="?", help="resend: a file holding the last reply's text (- for stdin)")
    ap.add_argument("--bundle", default=".bundle", help="the bundle folder, relative to the repo root as carried")
    ap.add_argument("--releases", required=True, help="the releases of the run, space-separated, in run order")
    ap.add_argument("--serve-releases", default="", help="releases whose ray layers travel too (SERVE_RELEASES)")
    ap.add_argument("--no-launch", action="store_true", help="start the run with the last part (run), not early")
    ap.add_argument("--json", action="store_true", help="the calls as JSON: [{carry: [...], command}]")
    a = ap.parse_intermixed_args(argv)
    bundle = a.bundle.rstrip("/")
    path = Path(bundle) / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        print(f"bundle_calls: cannot read the bundle manifest {path}: {e}", file=sys.stderr)
        return 2
    releases, serve = a.releases.split(), a.serve_releases.split()
    if not releases:
        print("bundle_calls: --releases names no release", file=sys.stderr)
        return 2
    if a.mode == "resend":
        if not a.reply:
            print("bundle_calls: resend needs REPLY (a file with the last reply's text, or -)", file=sys.stderr)
            return 2
        text = sys.stdin.read() if a.reply == "-" else Path(a.reply).read_text(errors="replace")
        why, calls = resend(manifest, bundle, text, releases, serve, launch=not a.no_launch)
        print(why, file=sys.stderr)
    else:
        calls = plan_calls(manifest, bundle, releases, serve, launch=not a.no_launch)
    if a.json:
        print(json.dumps([{"carry": list(c.carry), "command": c.command} for c in calls], indent=1))
    else:
        print("\n".join(c.line() for c in calls))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
