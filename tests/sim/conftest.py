"""Shared fixtures of the simulator tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture
def serve_trace(tmp_path: Path) -> Path:
    """A 12-request Mooncake-format trace with growing prompts, enough for `--serve-workload`
    sessions of a few turns."""
    f = tmp_path / "trace.jsonl"
    lines = []
    for i in range(12):
        inp = 512 * (3 + i % 5) - 100
        lines.append(
            json.dumps(
                {
                    "timestamp": i * 100,
                    "input_length": inp,
                    "output_length": 40 + 37 * i,
                    "hash_ids": [0] + [1000 * i + k for k in range(1, -(-inp // 512))],
                }
            )
        )
    f.write_text("\n".join(lines) + "\n")
    return f
