"""How a handoff is split into batches (the relay worker and the simulator both ask HandoffBatches),
one row per rule."""

from __future__ import annotations

import pytest

from pddflow.core.handoff_batches import HandoffBatches, HandoffStep

BATCHES = HandoffBatches(catch_up_tokens=32, min_extend_tokens=8, catch_up_load=0.7)
W, B, F = HandoffStep.WAIT, HandoffStep.BATCH, HandoffStep.FINAL

# (mode, unsent, finished, main_waiting, relay_load) -> step
TABLE = [
    ("one_shot", 3, False, True, 0.0, W),  # a tail chunk: the relay decodes a few more first
    ("one_shot", 8, False, True, 0.0, F),
    ("one_shot", 3, True, True, 0.0, F),  # the whole remainder of a finished sequence
    ("catch_up", 0, True, False, 0.0, F),
    ("catch_up", 5, False, True, 0.0, W),
    ("catch_up", 20, False, True, 0.0, F),  # main caught up, one batch closes the gap
    ("catch_up", 40, False, True, 0.0, B),  # too far behind: another round
    ("catch_up", 20, False, False, 0.0, W),  # main still extending: gather a full batch
    ("catch_up", 32, False, False, 0.0, B),
    ("catch_up", 12, False, False, 0.9, F),  # the relay got busy: the rest at once
    ("catch_up", 4, False, False, 0.9, W),  # ... but never as a tail chunk
]


@pytest.mark.parametrize(("mode", "unsent", "finished", "waiting", "load", "want"), TABLE)
def test_step(mode, unsent, finished, waiting, load, want):
    got = BATCHES.step(mode, unsent, finished=finished, main_waiting=waiting, relay_load=load)
    assert got is want


def test_a_declared_mode_never_switches():
    fixed = HandoffBatches(32, 8, catch_up_load=0.0)
    assert fixed.step("catch_up", 12, finished=False, main_waiting=False, relay_load=5.0) is W
    assert not fixed.switched("catch_up", 12, main_waiting=False, relay_load=5.0)
    assert BATCHES.switched("catch_up", 12, main_waiting=False, relay_load=0.9)
    assert not BATCHES.switched("catch_up", 12, main_waiting=True, relay_load=0.9)  # closed anyway


def test_min_extend_above_catch_up_is_refused(tmp_path):
    from pathlib import Path

    from pddflow.graph import load_plan
    from pddflow.graph.diagnostics import GraphError

    root = Path(__file__).resolve().parents[2]
    text = (root / "graphs" / "pdd.yaml").read_text()
    relay = "replicas: 2, devices_per_replica: 4}"
    bad = text.replace(relay, relay[:-1] + ", params: {min_extend_tokens: 64}}", 1)
    assert bad != text
    f = tmp_path / "bad.yaml"
    f.write_text(bad)
    with pytest.raises(GraphError, match="min_extend_tokens \\(64\\) must be <= catch_up_tokens"):
        load_plan(str(f))
