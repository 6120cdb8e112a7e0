"""Leases without a deployment: the frontend's grants and their epochs (frontend/leases.py) and
the worker's rules for which legs a lapse gives up (workers/loop.py). The partition drills
(tests/chaos/test_partitions.py, tests/ray/test_ray_deploy.py) run them on live deployments."""

from __future__ import annotations

import time
from concurrent.futures import Future
from types import SimpleNamespace

from pddflow.runtime.frontend.leases import Leases
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.runtime.workers.loop import Leg, not_renewed, revoked_legs

LEASE_S = 4.0


class Client:
    """A worker's control client that records the grants sent to it and answers each."""

    def __init__(self) -> None:
        self.grants: list[pb.LeaseGrant] = []

    def send(self, method: str, msg: pb.LeaseGrant, timeout_s: float) -> Future:
        assert method == "Lease"
        self.grants.append(msg)
        fut: Future = Future()
        fut.set_result(pb.Reply(ok=True))
        return fut


def _fleet() -> SimpleNamespace:
    return SimpleNamespace(
        clients={"main/0": Client(), "relay/0": Client()},
        lost=set(),
        unreachable=set(),
        parked=set(),
        starting=set(),
        status={"main/0": pb.WorkerStatus(), "relay/0": pb.WorkerStatus()},
        lease_epoch=0,
    )


def _leases(fleet) -> tuple[Leases, list[str]]:
    seen: list[str] = []

    def lapsed(inst: str) -> None:
        seen.append(f"lapsed {inst}")
        fleet.unreachable.add(inst)
        fleet.lost.add(inst)

    def renewed(inst: str) -> None:
        seen.append(f"renewed {inst}")
        fleet.unreachable.discard(inst)
        fleet.lost.discard(inst)

    return Leases(fleet, LEASE_S, lambda fn: fn(), lapsed, renewed), seen


def test_a_lapse_starts_a_new_epoch_that_its_revoking_grants_carry():
    fleet = _fleet()
    leases, seen = _leases(fleet)
    leases.tick()  # both answered at once (the fake answers): held, epoch 0
    assert [(g.held, g.epoch) for g in fleet.clients["main/0"].grants] == [(True, 0)]
    # main's answers stop for longer than the lease; the relay's go on
    leases.acked["main/0"] = time.monotonic() - 2 * LEASE_S
    leases._since["main/0"] = time.monotonic() - 3 * LEASE_S
    leases.tick()
    assert seen == ["lapsed main/0"] and fleet.lease_epoch == 1
    last = fleet.clients["main/0"].grants[-1]
    assert (last.held, last.epoch, last.lease_s) == (False, 1, LEASE_S)
    assert fleet.clients["relay/0"].grants[-1].held
    # orders sent now carry epoch 1: a late revoking grant of epoch 1 leaves them alone
    leases.tick()  # the fake answered the last grant: main stands again
    assert seen == ["lapsed main/0", "renewed main/0"] and fleet.lease_epoch == 1
    assert fleet.clients["main/0"].grants[-1].held
    # a second lapse: a later epoch
    leases.acked["main/0"] = time.monotonic() - 2 * LEASE_S
    leases._since["main/0"] = time.monotonic() - 3 * LEASE_S
    leases.tick()
    assert fleet.lease_epoch == 2 and fleet.clients["main/0"].grants[-1].epoch == 2


def _leg(seq_id: str, epoch: int, received: float) -> Leg:
    return Leg(pb.LegOrder(seq_id=seq_id, lease_epoch=epoch), received + 60.0, received)


def test_a_revoking_grant_gives_up_only_the_legs_ordered_before_its_epoch():
    before, since = _leg("before", 0, 10.0), _leg("since", 1, 20.0)
    assert revoked_legs([before, since], 1) == [before]
    assert revoked_legs([before, since], 2) == [before, since]  # a second lapse: both


def test_a_lease_not_renewed_gives_up_the_legs_ordered_before_it_ran_out():
    early, late = _leg("early", 0, 10.0), _leg("late", 0, 30.0)
    assert not_renewed([early, late], now=25.0, lease_until=26.0) == []  # still held
    # ran out at 26: a leg ordered after that came from a frontend that reaches us again
    assert not_renewed([early, late], now=31.0, lease_until=26.0) == [early]
