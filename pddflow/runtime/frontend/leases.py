"""The frontend's leases on its workers' legs (docs/runtime.md, Leases). Every heartbeat the
frontend grants each worker its lease; the answer proves both directions work (a one-way split
loses the grant or the answer). A worker whose answers stop for the lease is unreachable: its legs
are carried on elsewhere, new work goes around it, and its grants say so (`held` false), so that
it drops what it holds. A worker that hears no grant at all drops its legs when its lease runs
out (workers/loop.py). Once it answers again, it is back. Grants and answers are handled on gRPC
threads, not the workers' compute loops: a long step is not a partition.

A partition shorter than the lease costs nothing but the wait: the legs on the far side go on.

A grant that gives a worker's legs up carries the lease epoch of the lapse, and every order the
epoch current when it was sent: the worker drops only the legs ordered before the lapse. Grants
and orders are separate calls that may arrive in either order, so a revoking grant that reaches a
worker after it is back and has taken new work leaves that work alone."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from pddflow.runtime.frontend.fleet import Fleet
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.runtime.rpc import call_error

HEARTBEATS_PER_LEASE = 4
MAX_HEARTBEAT_S = 1.0


class Leases:
    def __init__(
        self,
        fleet: Fleet,
        lease_s: float,
        on_loop: Callable[[Callable[[], None]], None],
        lapsed: Callable[[str], None],
        renewed: Callable[[str], None],
    ):
        self.fleet, self.lease_s = fleet, lease_s
        self.heartbeat_s = min(MAX_HEARTBEAT_S, lease_s / HEARTBEATS_PER_LEASE)
        self._on_loop, self._lapsed, self._renewed = on_loop, lapsed, renewed
        # written on gRPC threads, read on the loop (a float per key: no lock needed)
        self.acked: dict[str, float] = {}  # instance -> its last answered grant
        self._since: dict[str, float] = {}  # instance -> when its lease (this time) began
        self._revoked: dict[str, int] = {}  # instance -> the lease epoch of its last lapse
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="leases")

    def start(self) -> Leases:
        self._thread.start()
        return self

    def _beat(self) -> None:
        # the tick runs on the frontend's loop: a loop stalled past the lease stops renewing, as
        # a frontend that cannot act on its workers' reports should
        while not self._stop.wait(self.heartbeat_s):
            self._on_loop(self.tick)

    def tick(self) -> None:
        now = time.monotonic()
        f = self.fleet
        for inst in f.clients:
            dead = inst in f.lost and inst not in f.unreachable
            if dead or inst in f.parked or inst in f.starting or inst not in f.status:
                self._since.pop(inst, None)  # not running, or not ready yet: no lease
                continue
            since = self._since.setdefault(inst, now)
            standing = self.standing(inst, now, since)
            if not standing and inst not in f.unreachable:
                f.lease_epoch += 1
                self._revoked[inst] = f.lease_epoch
                self._lapsed(inst)
            elif standing and inst in f.unreachable:
                self._renewed(inst)
            self._grant(inst, standing)

    def standing(self, inst: str, now: float, since: float) -> bool:
        """A grant answered within the lease (counted from when this lease began)."""
        return now - max(self.acked.get(inst, since), since) < self.lease_s

    def _grant(self, inst: str, held: bool) -> None:
        epoch = 0 if held else self._revoked.get(inst, 0)
        grant = pb.LeaseGrant(lease_s=self.lease_s, held=held, epoch=epoch)
        fut = self.fleet.clients[inst].send("Lease", grant, timeout_s=self.heartbeat_s)
        fut.add_done_callback(lambda f: self._answered(inst, f))

    def _answered(self, inst: str, fut) -> None:
        if call_error(fut) is None:
            self.acked[inst] = time.monotonic()

    def stop(self) -> None:
        self._stop.set()
