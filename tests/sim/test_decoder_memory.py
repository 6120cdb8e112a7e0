"""Decoder memory as the runtime's decoders manage it (runtime/workers/decoder.py:
`_adopt_prefix` when the job arrives, `_room_for` when the KV lands): the cached prefix is pinned at
once, the rest of the prompt and the whole output are reserved only when the KV is here, and landed
KV that does not fit waits, first come first served. Memory is not held while a KV copy crosses the
WAN."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pddflow.core.link import Jitter
from pddflow.graph import load_plan
from pddflow.sim.kvstore import KVStore
from pddflow.sim.metrics import request_rows
from pddflow.sim.simulator import Simulation
from pddflow.sim.workload import SimRequest, Workload

ROOT = Path(__file__).resolve().parents[2]


def test_pinned_prefix_survives_eviction_and_reserve_waits_for_room():
    store = KVStore("main/0", capacity_blocks=10, cached=True)
    first = store.acquire((1, 2, 3, 4), 0)
    store.commit(first, (1, 2, 3, 4))
    store.release(first)  # cached, evictable
    pinned = store.pin((1, 2, 3, 4, 5, 6))
    assert (pinned.hit, pinned.missing, pinned.reserved) == (4, 2, 0)
    assert store.locked_or_reserved() == 4 and store.reserved == 0
    other = store.acquire((7, 8, 9, 10, 11, 12), 0)  # fits beside the pinned four, evicting nothing
    assert other is not None and store.cache.match_len((1, 2, 3, 4)) == 4
    assert store.reserve(pinned, 1) is False  # 4 + 6 used, 3 more do not fit
    assert store.cache.match_len((1, 2, 3, 4)) == 4  # a failed reserve keeps the pin
    store.release(other)
    assert store.reserve(pinned, 1) is True and pinned.reserved == 3
    with pytest.raises(ValueError, match="budget holds 10"):
        store.reserve(store.pin((1, 2, 3, 4)), 7)  # 4 pinned + 7 can never fit
    store.release(pinned)


def _one_request_fits_main() -> tuple[Simulation, list]:
    """cross_dc_pd on one prefill and one main whose memory holds one request (prompt + output),
    a slow constant-delay WAN, and two requests that arrive together."""
    plan = load_plan(str(ROOT / "graphs" / "cross_dc_pd.yaml")).scaled_to_local()
    link = {
        n: replace(lk, gbps=1.0, jitter=Jitter(dist="constant")) for n, lk in plan.links.items()
    }
    kvb = plan.model.arch.kv_bytes_per_token
    main = replace(plan.operators["main"], kv_budget_bytes=20 * 16 * kvb)  # 20 blocks of 16 tokens
    plan = replace(plan, links=link, operators={**plan.operators, "main": main})
    reqs = [SimRequest(i, 0.0, 160, 32, tuple(range(100 * i + 1, 100 * i + 11))) for i in range(2)]
    sim = Simulation(plan, Workload("two", reqs, block_tokens=16), stream_gbps=0)
    return sim, sim.run()


def test_landed_kv_waits_for_room_but_its_transfer_does_not():
    sim, flights = _one_request_fits_main()
    assert all(r.done and not r.failed for r in flights)
    a, b = sorted(flights, key=lambda r: r.first_token_at)
    assert a.memory_waits == 0 and b.memory_waits == 1
    # b's KV crossed the WAN while a decoded (its memory was not reserved before sending) ...
    landed = b.main.sent_at + b.main.transfer_s
    assert b.main.sent_at < a.finished_at and landed < a.finished_at
    # ... then waited on main until a finished and freed its blocks, and only then decoded
    assert b.first_token_at >= a.finished_at
    assert b.memory_wait_s == pytest.approx(a.finished_at - landed, abs=0.05)
    assert sim.stores["main/0"].peak_used <= sim.stores["main/0"].capacity
    rows = {r["rid"]: r for r in request_rows(sim)}
    assert rows[b.req.rid]["memory_waits"] == 1 and rows[b.req.rid]["memory_wait_s"] > 0


def test_a_request_that_can_never_fit_fails_with_the_budget_named():
    plan = load_plan(str(ROOT / "graphs" / "cross_dc_pd.yaml")).scaled_to_local()
    kvb = plan.model.arch.kv_bytes_per_token
    main = replace(plan.operators["main"], kv_budget_bytes=8 * 16 * kvb)
    plan = replace(plan, operators={**plan.operators, "main": main})
    sim = Simulation(
        plan, Workload("big", [SimRequest(0, 0.0, 160, 32, tuple(range(1, 11)))], block_tokens=16)
    )
    (flight,) = sim.run()
    assert flight.failed and "budget holds 8" in flight.failed
