#!/usr/bin/env python3
"""OCI createContainer hook of cdi_spec.py's spec: ``ldconfig`` over the container's root, so the driver
libraries bound into /usr/lib/x86_64-linux-gnu are in its cache (what ``nvidia-cdi-hook update-ldcache`` does).

The runtime passes the container's state on stdin; its bundle's config.json names the root."""

import json
import os
import subprocess
import sys

state = json.load(sys.stdin)
bundle = state["bundle"]
with open(os.path.join(bundle, "config.json")) as fh:
    root = json.load(fh)["root"]["path"]
root = root if os.path.isabs(root) else os.path.join(bundle, root)
ldconfig = next(p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "/sbin/ldconfig.real") if os.path.exists(p))
sys.exit(subprocess.run([ldconfig, "-r", root], check=False).returncode)
