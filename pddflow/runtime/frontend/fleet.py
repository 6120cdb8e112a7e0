"""The frontend's view of its workers: a control client to each, the last status each reported,
which are lost, and the restarts and exits the deployer told of."""

from __future__ import annotations

import logging
from typing import Any

from pddflow.graph.plan import Plan
from pddflow.runtime.frontend.flight import Flight
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.runtime.rpc import Credentials, WorkerClient, call_error, grpc_text
from pddflow.runtime.wiring import Wiring

log = logging.getLogger("pddflow.frontend")


class Fleet:
    def __init__(self, plan: Plan, wiring: Wiring, credentials: Credentials):
        self.plan = plan
        self.clients = {
            i: WorkerClient(wiring.control_address(i), credentials) for i in wiring.workers
        }
        self.status: dict[str, pb.WorkerStatus] = {}
        self.lost: set[str] = set()
        # lost because their lease lapsed (a partition, not a death): still called, since a
        # call may get through (an abort after the link heals), and back once the lease is
        self.unreachable: set[str] = set()
        # one more each time a lease lapses: orders carry it, so a worker told its legs were given
        # up drops only those ordered before (leases.py)
        self.lease_epoch = 0
        self.restarting: set[str] = set()  # lost, and not back before the deployer restarts it
        self.restarts: dict[str, int] = {}  # instance -> restarts by the deployer
        self.exits: dict[str, str] = {}  # instance -> why it last died
        # live scaling: wired instances not running (not started yet, or scaled away), and
        # those being drained before they stop; neither gets new work
        self.parked: set[str] = {i.id for i in plan.instances} - set(plan.initial_instances())
        self.draining: set[str] = set()
        self.starting: set[str] = set()  # started by live scaling, not ready yet

    def call(self, inst: str, method: str, msg: Any) -> None:
        """Send and forget (a dead instance is skipped); a failure is logged."""
        if inst in self.lost and inst not in self.unreachable:
            return
        fut = self.clients[inst].send(method, msg)
        fut.add_done_callback(
            lambda f: (
                (exc := call_error(f))
                and log.warning("%s.%s failed: %s", inst, method, grpc_text(exc))
            )
        )

    def abort_leg(self, flight: Flight, inst: str, reason: str) -> None:
        r = flight.route
        r.legs.discard(inst)
        if inst not in self.lost or inst in self.unreachable:
            seq_id = r.resumed_seq if inst in r.resumed_on else flight.request_id
            self.call(inst, "Abort", pb.Cancel(seq_id=seq_id, reason=reason))

    def answers(self, inst: str) -> bool:
        """A broken report stream alone is not a lost worker: it reconnects if it still runs."""
        try:
            self.clients[inst].call("Status", pb.Empty(), timeout_s=2.0)
            return True
        except Exception:  # noqa: BLE001 - any failure to answer counts as gone
            return False

    @property
    def unavailable(self) -> set[str]:
        """Instances new work must not go to: lost, parked, draining or starting."""
        return self.lost | self.parked | self.draining | self.starting

    def up(self) -> dict[str, pb.WorkerStatus]:
        """The last status of every instance not lost."""
        return {i: s for i, s in self.status.items() if i not in self.lost}

    def decoders(self, prefer: tuple[str, ...] = ()) -> list[str]:
        """Live decoding instances, `prefer`red ones first."""
        off = self.unavailable
        alive = [
            i.id
            for i in self.plan.instances
            if i.id not in off and self.plan.operators[i.operator].type.decodes
        ]
        return [i for i in prefer if i in alive] + [i for i in alive if i not in prefer]

    def health(self, inst: str) -> dict[str, Any]:
        s = self.status.get(inst)
        state = "lost" if inst in self.lost else ("up" if s is not None and s.ready else "starting")
        if inst in self.unreachable:
            state = "unreachable"
        for pool_state, members in (
            ("parked", self.parked),
            ("draining", self.draining),
            ("starting", self.starting),
        ):
            if inst in members:
                state = pool_state
        out: dict[str, Any] = {"ready": state == "up", "state": state}
        if state in ("up", "draining") and s is not None:
            # the device cache's blocks (what kv_blocks_used counts); the tiers below in cache_tiers
            device = next((t.blocks for t in s.tiers if t.tier == "device"), s.cached_blocks)
            out.update(
                kv_blocks_used=s.kv_blocks_used,
                cached_blocks=device,
                running=s.running,
                legs=len(s.legs),
            )
            if s.tiers:  # the cache's tiers: where its cached blocks are, hits loaded from each
                out["cache_tiers"] = {
                    t.tier: {
                        "blocks": t.blocks,
                        "capacity_blocks": t.capacity_blocks,
                        "hit_blocks": t.hit_blocks,
                        "load_s": round(t.load_s, 6),
                    }
                    for t in s.tiers
                }
        if inst in self.restarts or inst in self.exits:
            out.update(restarts=self.restarts.get(inst, 0), last_exit=self.exits.get(inst))
        return out

    def close(self) -> None:
        for c in self.clients.values():
            c.close()
