"""The admin endpoints' drills on the emulated WAN, on the frontend's side. A cut is the backend's
(its relays carry every cross-cluster connection, where it has them). The emulated WAN is shaped in
the sending processes, so a degrade is a TuneLink call to every worker at either end of an emulated
channel over the link, each with a deadline; the tuning in force is kept so that a worker restarted
later is told again."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import grpc

from pddflow.channels.emulation import degraded
from pddflow.core.link import LinkModel
from pddflow.graph.plan import Plan
from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.runtime.rpc import WorkerClient, grpc_text

log = logging.getLogger("pddflow.link_admin")
TUNE_TIMEOUT_S = 5.0  # per worker; a worker that does not answer in this time is named
RESTARTED_TIMEOUT_S = 180.0  # a restarted worker loads its model before it listens


class LinkNotFound(KeyError):
    pass


class LinkNotEmulated(ValueError):
    """The link exists but no channel over it is emulated: there is nothing to slow down."""


class LinkTuneFailed(RuntimeError):
    """Some workers did not apply the tuning; they are named, the others did."""

    def __init__(self, message: str, failed: dict[str, str], applied: dict[str, int]):
        super().__init__(message)
        self.failed, self.applied = failed, applied


Cutter = Callable[[str, float, int], None]  # (link, seconds, after_bytes); KeyError: no such link
# (link, seconds, loss, from_cluster); KeyError: no such link
Impairer = Callable[[str, float, float, str | None], None]


class LinkAdmin:
    def __init__(
        self,
        plan: Plan,
        clients: dict[str, WorkerClient],
        cutter: Cutter | None = None,
        impairer: Impairer | None = None,
        timeout_s: float = TUNE_TIMEOUT_S,
    ):
        self.plan, self.clients, self.timeout_s = plan, clients, timeout_s
        self.cutter, self.impairer = cutter, impairer
        self.in_force: dict[str, pb.LinkTuning] = {}  # link -> the degrade applied, if any
        self._lock = threading.Lock()

    def can_cut(self) -> bool:
        return self.cutter is not None

    def cut(self, link: str, seconds: float, after_bytes: int = 0) -> dict[str, Any]:
        """The link down for `seconds` (once `after_bytes` more crossed it)."""
        if self.cutter is None:
            raise LinkNotEmulated("this backend cannot cut links")
        try:
            self.cutter(link, seconds, after_bytes)
        except KeyError as exc:
            raise LinkNotFound(exc.args[0]) from None
        return {"link": link, "down_s": seconds, "after_bytes": after_bytes}

    def partition(
        self, link: str, seconds: float, loss: float = 1.0, from_cluster: str | None = None
    ) -> dict[str, Any]:
        """Every connection over `link` (data and control) loses what is sent, both ways or
        from one cluster, for `seconds`: all of it (a partition: held until it heals, as TCP
        retransmits) or a share `loss` of it. Connections are not reset."""
        if self.impairer is None:
            raise LinkNotEmulated("this backend cannot partition links")
        if link in self.plan.links and from_cluster is not None:
            sides = (self.plan.links[link].a, self.plan.links[link].b)
            if from_cluster not in sides:
                raise ValueError(
                    f"from_cluster {from_cluster!r} is not an end of link {link!r} "
                    f"({' or '.join(sides)})"
                )
        try:
            self.impairer(link, seconds, loss, from_cluster)
        except KeyError as exc:
            raise LinkNotFound(exc.args[0]) from None
        return {"link": link, "seconds": seconds, "loss": loss, "from_cluster": from_cluster}

    def shapers(self, link: str) -> list[str]:
        """The instances whose senders (or handoff server's replies) shape `link`."""
        ops = {
            op
            for ch in self.plan.channels
            if ch.link == link and ch.cross_cluster and ch.params.get("emulate")
            for op in (ch.src, ch.dst)
        }
        return [i.id for i in self.plan.instances if i.operator in ops]

    def degrade(self, link: str, gbps: float, jitter_p99_ms: float | None = None) -> dict:
        """ValueError when the numbers cannot shape a link (gbps <= 0, jitter < 0)."""
        model = degraded(self._declared(link), gbps, jitter_p99_ms)
        tuning = pb.LinkTuning(link=link, gbps=gbps)
        if jitter_p99_ms is not None:
            tuning.jitter_p99_ms = jitter_p99_ms
        return self._apply(tuning, model)

    def restore(self, link: str) -> dict:
        return self._apply(pb.LinkTuning(link=link, restore=True), self._declared(link))

    def _declared(self, link: str) -> LinkModel:
        if link not in self.plan.links:
            raise LinkNotFound(f"no link {link!r}; links: {', '.join(self.plan.links) or 'none'}")
        return self.plan.links[link]

    def _apply(self, tuning: pb.LinkTuning, model: LinkModel) -> dict:
        targets = self.shapers(tuning.link)
        if not targets:
            raise LinkNotEmulated(
                f"no channel over link {tuning.link!r} is emulated (channel param emulate: "
                "false, or it joins one cluster): nothing here shapes it"
            )
        with self._lock:  # the record and the calls in one order: concurrent tunings do not mix
            if tuning.restore:
                self.in_force.pop(tuning.link, None)
            else:
                self.in_force[tuning.link] = tuning
            futures = {
                i: self.clients[i].future("TuneLink", tuning, self.timeout_s) for i in targets
            }
            applied: dict[str, int] = {}
            failed: dict[str, str] = {}
            for inst, fut in futures.items():
                try:
                    applied[inst] = fut.result().shaped
                except grpc.RpcError as exc:
                    failed[inst] = grpc_text(exc)
        if failed:
            raise LinkTuneFailed(
                f"link {tuning.link!r}: not applied on "
                + "; ".join(f"{i}: {why}" for i, why in failed.items()),
                failed,
                applied,
            )
        return {
            "link": tuning.link,
            "restored": tuning.restore,
            "emulated": _model_json(model),
            "declared": _model_json(self.plan.links[tuning.link]),
            "workers": applied,  # instance -> its emulated senders of the link retuned
        }

    def restarted(self, instance: str) -> None:
        """A worker came back with the declared links: tell it the degrades in force."""
        with self._lock:
            due = [t for name, t in self.in_force.items() if instance in self.shapers(name)]
        if due:
            threading.Thread(
                target=self._retell, args=(instance, due), daemon=True, name="link-retell"
            ).start()

    def _retell(self, instance: str, due: list[pb.LinkTuning]) -> None:
        for tuning in due:
            try:
                self.clients[instance].call("TuneLink", tuning, RESTARTED_TIMEOUT_S)
            except grpc.RpcError as exc:
                log.error("%s: link %s degrade not re-applied: %s", instance, tuning.link, exc)


def _model_json(link: LinkModel) -> dict[str, Any]:
    return {"gbps": link.gbps, "rtt_ms": link.rtt_ms, "jitter": asdict(link.jitter)}
