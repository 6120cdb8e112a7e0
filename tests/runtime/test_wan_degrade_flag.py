"""`bench serve --wan-degrade AT_S:GBPS[:JITTER_P99_MS]`: what it parses to, and a wrong value
refused with a message naming the flag and its form, before any deployment starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pddflow.bench.wan_degrade import WanDegrade


@pytest.mark.parametrize(
    "text, want",
    [
        ("20:0.01", WanDegrade(20.0, 0.01)),
        ("0:1:500", WanDegrade(0.0, 1.0, 500.0)),
        ("7.5:0.05:0", WanDegrade(7.5, 0.05, 0.0)),
    ],
)
def test_parses(text, want):
    assert WanDegrade.parse(text) == want


@pytest.mark.parametrize(
    "text, words",
    [
        ("20", "expected 2 or 3 numbers"),
        ("1:2:3:4", "expected 2 or 3 numbers"),
        ("soon:0.1", "AT_S 'soon' is not a number"),
        ("-1:0.1", "AT_S must be >= 0"),
        ("5:0", "GBPS must be > 0"),
        ("5:nan", "GBPS must be finite"),
        ("5:0.1:-2", "JITTER_P99_MS must be >= 0"),
    ],
)
def test_refusals_name_the_flag_and_its_form(text, words):
    with pytest.raises(ValueError) as err:
        WanDegrade.parse(text)
    msg = str(err.value)
    assert words in msg and "--wan-degrade" in msg and "AT_S:GBPS[:JITTER_P99_MS]" in msg


def test_the_cli_refuses_before_deploying():
    out = subprocess.run(
        [sys.executable, "-m", "pddflow.cli", "bench", "serve", "--wan-degrade", "5:fast"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert "--wan-degrade '5:fast': GBPS 'fast' is not a number" in out.stderr
    assert "Traceback" not in out.stderr and "serving" not in out.stderr
