"""Workers' statuses and cache deltas applied to the router's mirror without a deployment
(frontend/reports.py): a status that disagrees with the mirror is drift, unless it was queued
before its stream's full cache listing (a reopened report stream: not drift); the partition
drills check the same on live deployments."""

from __future__ import annotations

from types import SimpleNamespace

from pddflow.graph import load_plan
from pddflow.graph.shipped import resolve_graph
from pddflow.runtime.frontend.metrics import Metrics
from pddflow.runtime.frontend.reports import StatusReports
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.scheduler import SchedulerState, make_policy

MAIN = "main/0"


class Fallbacks:
    def reap_orphans(self, inst: str, legs) -> None:
        pass

    def worker_back(self, inst: str) -> None:
        pass


def _reports() -> StatusReports:
    plan = load_plan(resolve_graph("pdd"))
    fleet = SimpleNamespace(
        parked=set(), status={}, lost=set(), starting=set(), draining=set(), unreachable=set()
    )
    sched = SchedulerState.for_plan(plan)
    assert sched.mirror(MAIN) is not None
    return StatusReports(plan, make_policy(plan), sched, Metrics(), fleet, Fallbacks())


def _status(blocks: list[int]) -> pb.WorkerStatus:
    digest = 0
    for h in blocks:
        digest ^= h
    return pb.WorkerStatus(
        instance=MAIN,
        ready=True,
        kv_blocks_total=64,
        cached_blocks=len(blocks),
        cache_digest=digest,
    )


def test_a_status_that_disagrees_with_the_mirror_is_drift():
    r = _reports()
    r.on_cache(MAIN, pb.CacheDelta(inserted=[11, 12]))
    r.on_status(MAIN, _status([11, 12]))
    assert r.drift == []
    r.on_status(MAIN, _status([11, 12, 13]))  # a delta the mirror never got
    assert r.drift == [f"{MAIN}: mirror holds 2 blocks, cache 3"]


def test_statuses_before_a_reopened_streams_listing_are_not_drift():
    r = _reports()
    r.on_cache(MAIN, pb.CacheDelta(inserted=[11, 12]))
    # the stream broke and took the delta inserting 13 with it; the statuses queued meanwhile
    # arrive on the new stream before the worker's full listing
    r.on_status(MAIN, _status([11, 12, 13]), listed=False)
    assert r.drift == []
    r.on_cache(MAIN, pb.CacheDelta(inserted=[11, 12, 13], full=True))
    r.on_status(MAIN, _status([11, 12, 13]))
    assert r.drift == []
