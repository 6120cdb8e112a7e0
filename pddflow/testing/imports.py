"""What importing some code pulls in, measured in a fresh interpreter: the tests that keep a layer
light (no torch, pyarrow or grpc where a command must start at once) share it."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "pyarrow", "grpc")


def heavy_after(code: str, heavy: tuple[str, ...] = HEAVY) -> set[str]:
    """The modules of the `heavy` packages loaded once `code` has run in a new interpreter."""
    probe = code + (
        "\nimport sys\nsys.stderr.write('HEAVY:' + ' '.join(sorted("
        f"m for m in sys.modules if m.split('.')[0] in {heavy!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return set(out.stderr.rsplit("HEAVY:", 1)[1].split())
