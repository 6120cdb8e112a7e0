"""`simulate --planner` and `--arrival-profile` (sim/elastic.py, sim/arrival_profile.py): arrivals
re-timed to a day's shape or piecewise rates, and the simulated pools resized by the planner:
every request served, nothing leaked, counts within the bounds, fewer device-hours than the fixed
fleet on a day whose load varies."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pddflow.data import MOONCAKE_TRACE
from pddflow.graph import load_plan
from pddflow.sim.arrival_profile import ProfileError, parse_profile
from pddflow.sim.metrics import summarize
from pddflow.sim.simulator import Simulation
from pddflow.sim.trace import load_trace
from pddflow.sim.workload import SimRequest, Workload

ROOT = Path(__file__).resolve().parents[2]


def steady(n: int, gap_s: float = 1.0) -> Workload:
    reqs = [SimRequest(i, i * gap_s, 100, 10, ()) for i in range(n)]
    return Workload("steady", reqs, 16)


def test_a_diurnal_day_keeps_the_mean_rate_and_peaks_in_the_middle():
    wl = parse_profile("diurnal:4").apply(steady(3001))
    t = [r.arrival_s for r in wl.requests]
    assert t == sorted(t) and len(t) == 3001
    assert t[-1] == pytest.approx(3000, rel=1e-6)  # the same span: the mean rate is kept

    def count(lo: float, hi: float) -> int:
        return sum(1 for x in t if lo <= x < hi)

    # the multiplier runs 0.4 .. 1.6 around the day: its middle tenth against its first
    assert count(1350, 1650) / count(0, 300) == pytest.approx(1.6 / 0.44, rel=0.1)


def test_piecewise_rates_multiply_from_their_start():
    wl = parse_profile("0:1,100:4").apply(steady(501))
    t = [r.arrival_s for r in wl.requests]
    assert sum(1 for x in t if x < 100) == 100  # the first 100 s as they were
    assert t[-1] == pytest.approx(100 + 400 / 4)  # the rest 4 times as dense


def test_later_turns_keep_following_their_parent():
    reqs = [SimRequest(0, 0.0, 10, 1, ()), SimRequest(1, 0.0, 10, 1, (), parent=0, gap_s=3.0)]
    reqs += [SimRequest(2, 10.0, 10, 1, ())]
    wl = parse_profile("0:2").apply(Workload("s", reqs, 16))
    assert [r.arrival_s for r in wl.requests] == [0.0, 0.0, 5.0]
    assert wl.requests[1].gap_s == 3.0 and wl.meta["arrival_profile"] == "0:2"


@pytest.mark.parametrize(
    "text, fix",
    [
        ("diurnal:0.5", "R >= 1"),
        ("diurnal:x", "R >= 1"),
        ("0:1,fast", "SECONDS:MULTIPLIER"),
        ("5:1", "start at 0"),
        ("0:1,0:2", "increase"),
        ("0:-1", "SECONDS:MULTIPLIER"),
    ],
)
def test_bad_profiles_name_the_fix(text, fix):
    with pytest.raises(ProfileError, match=fix):
        parse_profile(text)


@pytest.fixture(scope="module")
def day():
    plan = load_plan(ROOT / "graphs" / "sim" / "pdd_88.yaml")
    wl = parse_profile("diurnal:4").apply(load_trace(MOONCAKE_TRACE, rate_scale=2, limit=1500))
    fixed = Simulation(plan, wl)
    fixed.run()
    elastic = Simulation(plan, wl, planner=plan.autoscale)
    elastic.run()  # its end checks every flight finished and no KV block leaked
    return plan, summarize(fixed), summarize(elastic), elastic


def test_the_planner_serves_the_day_on_fewer_device_hours(day):
    plan, fixed, elastic, sim = day
    assert elastic["completed"] == fixed["completed"] == 1500
    assert elastic["device_hours"] < 0.9 * fixed["device_hours"]
    assert elastic["sla_attainment"] >= fixed["sla_attainment"] - 0.05
    p = elastic["planner"]
    bounds = plan.pool_bounds()
    for op, timeline in p["timeline"].items():
        lo, hi = bounds[op]
        assert all(lo <= n <= hi for _, n in timeline), (op, timeline)
        assert p["direction_changes"][op] <= 4, (op, timeline)
    assert p["changes"] and all(c["reason"] for c in p["changes"])
    # a parked instance took no work after it was parked: its store is empty and unmirrored
    for iid in sim.elastic.unavailable() - sim.elastic.draining:
        assert sim.stores[iid].locked_or_reserved() == 0
        assert len(sim.state.mirrors.get(iid, ())) == 0


def test_bounds_come_from_autoscale_min_replicas(day):
    plan = day[0]
    a = replace(plan.autoscale, min_replicas={"main": 4})
    assert replace(plan, autoscale=a).pool_bounds()["main"] == (4, plan.operators["main"].replicas)
    assert plan.scaled_to_local().pool_bounds() == {op: (1, 1) for op in plan.operators}


def test_cli_planner_and_profile(tmp_path):
    def simulate(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "pddflow.cli", "simulate", "sim/pdd_88", "--workload"]
        cmd += ["trace", "-n", "400", "--json", "-q", *args]
        return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=120)

    out = simulate("--planner", "--arrival-profile", "0:1,60:3")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["workload"]["arrival_profile"] == "0:1,60:3"
    assert set(result["planner"]["timeline"]) == {"prefill", "relay", "main"}
    assert result["device_hours"] > 0
    bad = simulate("--arrival-profile", "sometimes")
    assert bad.returncode == 2 and "SECONDS:MULTIPLIER" in bad.stderr
    assert "Traceback" not in bad.stderr
