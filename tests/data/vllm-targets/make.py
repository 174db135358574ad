"""Write <version>.tar.xz: the target files of patches/vllm/<version>/ from its wheel (see README.md)."""

from __future__ import annotations

import io
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from builder.patching import series as P  # noqa: E402
from builder.events import SILENT  # noqa: E402
from builder.fetch import vllm_wheel  # noqa: E402

for v in sys.argv[1:]:
    s = P.load_series(ROOT / "patches" / "vllm" / v, v)
    wheel = vllm_wheel(v, s.wheel_sha256, reporter=SILENT)
    out = Path(__file__).with_name(f"{v}.tar.xz")
    with zipfile.ZipFile(wheel) as z, tarfile.open(out, "w:xz") as tar:
        for rel in sorted(s.originals):
            data = z.read(rel)
            info = tarfile.TarInfo(rel)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    print(f"{out}: {out.stat().st_size} bytes")
