"""Data shipped inside the package, found from any working directory: the public Mooncake
conversation trace (Apache-2.0; its attribution is README.md here)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

MOONCAKE_TRACE = Path(str(files(__name__) / "mooncake_conversation_trace.jsonl"))
