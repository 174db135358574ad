#!/usr/bin/env python3
"""The device calls of a content-addressed matrix run (scripts/gpu/cas-proof.sh), and those still needed after a
lost machine.

    cas_calls.py calls  [--bundle .bundle/cas] [--env 'RELEASES="..." ...'] [--releases "0.26.0 0.33.0"]
    cas_calls.py resend REPLY [--bundle .bundle/cas] [--env ...]

``calls`` prints one line per `run` call: the paths it carries, a tab, its command.  Part N is ``recv N``, except
the last part the first release's engine layers need, which is ``ENV launch N`` (the run starts while the rest
upload); ``wait`` calls follow.  ``--releases`` keeps only the parts those releases' engine layers need (the first
named is launched), in part order.  ``resend`` reads the last reply's text: with an
``INVENTORY boot=… cas=H/W[:missing=…]``
line, the parts it lacks (then the launch if the reply shows no run, then wait); without one (the machine went back
or the call failed before receiving), every call again.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

CMD = "scripts/gpu/cas-proof.sh"


def needed(m: dict, releases: list[str]) -> list[int]:
    return sorted(
        {
            p
            for v in releases
            for lay in m["releases"][v]
            if m["layers"][lay]["kind"] != "ray"
            for p in m["layers"][lay]["cas_parts"]
        }
    )


def launch_part(m: dict) -> int:
    first = m["order"][0]
    return max(
        p for lay in m["releases"][first] if m["layers"][lay]["kind"] != "ray" for p in m["layers"][lay]["cas_parts"]
    )


def calls(m: dict, bundle: str, env: str, parts: list[int], launch: bool = True) -> list[tuple[str, str]]:
    man = f"{bundle}/manifest.json"
    # the device side reads the parts where they were carried
    casb = f"CASB={bundle} " if bundle.rstrip("/") != ".bundle/cas" else ""
    run = " ".join(x for x in (casb.strip(), env, CMD) if x)
    out = []
    lp = launch_part(m)
    if launch and lp not in parts:  # its parts are there already: launch on the first call
        out.append((man, f"{run} launch"))
    for i in parts:
        carry = f"{man} {bundle}/{m['cas']['parts'][i]['dir']}"
        out.append((carry, f"{run} launch {i}" if launch and i == lp else f"{casb}{CMD} recv {i}"))
    return out + [("", f"WAIT=560 {CMD} wait")]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="cas_calls.py")
    ap.add_argument("mode", choices=("calls", "resend"))
    ap.add_argument("reply", nargs="?")
    ap.add_argument("--bundle", default=".bundle/cas")
    ap.add_argument("--env", default="", help="the run's environment, put before the launch")
    ap.add_argument("--releases", default="", help="only the parts these releases need (the first is launched)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    m = json.loads((Path(a.bundle) / "manifest.json").read_text())
    n = len(m["cas"]["parts"])
    todo, launch = list(range(n)), True
    if a.releases:
        m["order"] = a.releases.split()
        todo = needed(m, m["order"])
    if a.mode == "resend":
        text = Path(a.reply).read_text(errors="replace") if a.reply and a.reply != "-" else sys.stdin.read()
        inv = [ln for ln in text.splitlines() if ln.startswith("INVENTORY ")]
        if inv:
            f = dict(x.split("=", 1) for x in inv[-1].split()[1:] if "=" in x)
            have, _, rest = f.get("cas", "0/0").partition(":")
            if rest.startswith("missing="):
                todo = [
                    k
                    for r in rest[len("missing=") :].split(",")
                    if r
                    for k in range(int(r.split("-")[0]), int(r.split("-")[-1]) + 1)
                    if not a.releases or k in todo
                ]
            elif have.split("/")[0] == str(n):
                todo = []
            launch = not re.search(r"run in flight \(alive\)|LAUNCHED|STILL RUNNING", text)
            print(f"machine boot {f.get('boot')}: {len(todo)} part(s) to send again", file=sys.stderr)
        else:
            print("no INVENTORY in the reply: the machine is bare; every call again", file=sys.stderr)
    out = calls(m, a.bundle, a.env, todo, launch)
    if a.json:
        print(json.dumps([{"carry": c.split(), "command": cmd} for c, cmd in out], indent=1))
    else:
        print("\n".join(f"{c}\t{cmd}" for c, cmd in out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
