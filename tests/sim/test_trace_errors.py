"""Bad trace lines give `FILE:LINE: message`, never a traceback (library and CLI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pddflow.sim.trace import TraceError, load_trace

ROOT = Path(__file__).resolve().parents[2]
GOOD = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}'

CASES = [
    ("not json {", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"timestamp": 5, "input_length": 600, "output_length": 5}', "missing key(s) hash_ids"),
    (
        '{"timestamp": -1, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}',
        "timestamp must be",
    ),
    (
        '{"timestamp": 5, "input_length": "600", "output_length": 5, "hash_ids": [0, 1]}',
        "input_length must be",
    ),
    (
        '{"timestamp": 5, "input_length": 600, "output_length": 0, "hash_ids": [0, 1]}',
        "output_length must be",
    ),
    (
        '{"timestamp": 5, "input_length": 600, "output_length": 5, "hash_ids": [0]}',
        "expected ceil(600/512) = 2",
    ),
    (
        '{"timestamp": 5, "input_length": 600, "output_length": 5, "hash_ids": [0, "x"]}',
        "list of integers",
    ),
]


@pytest.mark.parametrize("line,msg", CASES, ids=[c[1] for c in CASES])
def test_bad_line_names_file_and_line(tmp_path, line, msg):
    f = tmp_path / "t.jsonl"
    f.write_text(GOOD + "\n\n" + line + "\n")
    with pytest.raises(TraceError) as exc:
        load_trace(f)
    assert str(exc.value).startswith(f"{f}:3: ") and msg in str(exc.value)


def test_unsorted_and_empty_and_missing(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(GOOD.replace('"timestamp": 0', '"timestamp": 9') + "\n" + GOOD + "\n")
    with pytest.raises(TraceError, match=r"t.jsonl:2: timestamp 0.0 is earlier"):
        load_trace(f)
    f.write_text("\n")
    with pytest.raises(TraceError, match="no requests"):
        load_trace(f)
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "nope.jsonl")
    f.write_bytes(b"\xff\xfe{}\n")
    with pytest.raises(TraceError, match=r"t.jsonl:1: not UTF-8"):
        load_trace(f)


@pytest.mark.slow
def test_cli_reports_bad_trace_without_traceback(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text(GOOD + "\n" + '{"timestamp": 1}' + "\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pddflow.cli",
            "simulate",
            str(ROOT / "graphs" / "pdd.yaml"),
            "--trace",
            str(f),
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    assert f"error: {f}:2: missing key(s)" in out.stderr
    assert "Traceback" not in out.stderr
