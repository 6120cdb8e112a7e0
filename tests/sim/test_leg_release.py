"""A decode leg's release wakes memory waiters at once, its own landing among them: the leg must
already read as released then. Before it did, a takeover (main landed while the relay's copy still
waited for memory) let the relay's own landing reserve and start a relay for a request main had
taken over, and the reservation leaked (`relay/0: 50 reserved ... KV blocks leaked` at the end of
`pddflow size`'s replays of pdd_88 near its capacity)."""

from __future__ import annotations

from pathlib import Path

from pddflow.graph import load_plan
from pddflow.sim.agentic import generate, pdd_conditions
from pddflow.sim.metrics import summarize
from pddflow.sim.simulator import Simulation
from pddflow.sim.sizing.space import with_replicas

ROOT = Path(__file__).resolve().parents[2]


def test_takeovers_near_capacity_leave_no_kv_reserved():
    plan = with_replicas(
        load_plan(str(ROOT / "graphs" / "sim" / "pdd_88.yaml")),
        {"prefill": 11, "relay": 1, "main": 10},
    )
    wl = generate(pdd_conditions(requests=800, rps=16.9154, seed=0, block_tokens=512))
    sim = Simulation(plan, wl, seed=0)
    sim.run()  # its end check raises on leaked KV
    m = summarize(sim)
    assert m["handoffs"].get("takeover", 0) > 0  # the path this guards was taken
    assert m["completed"] == m["requests"]
