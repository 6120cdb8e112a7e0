"""The frontend's view of its WAN links: every KV transfer over a link feeds that link's monitor
(scheduler/link_monitor.py), and the scheduler's link estimates, /health and /metrics are read
from the monitors."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from pddflow.graph.plan import Plan
from pddflow.runtime.metrics import Metrics
from pddflow.scheduler.link_monitor import LinkMonitor
from pddflow.scheduler.state import SchedulerState


class LinkWatch:
    def __init__(self, plan: Plan, sched: SchedulerState, metrics: Metrics):
        self.sched = sched
        self.monitors = {name: LinkMonitor(link) for name, link in plan.links.items()}
        self.metrics = metrics

    def started(self, link: str, transfer: Hashable) -> None:
        self.monitors[link].started(transfer)
        self.refresh()

    def ended(
        self, link: str, transfer: Hashable, nbytes: float | None, seconds: float | None
    ) -> None:
        self.monitors[link].ended(transfer, nbytes, seconds)
        self.refresh()

    def forget(self, instance: str) -> None:
        """`instance` is lost: the transfers it sent or was receiving will not end."""
        for monitor in self.monitors.values():
            monitor.forget(lambda t: instance in (t[1], t[2]))
        self.refresh()

    def refresh(self) -> None:
        """Estimates decay with time: refreshed before each decision and each scrape, too."""
        for name, monitor in self.monitors.items():
            self.sched.set_link(monitor.estimate())
            r = monitor.report()
            self.metrics.link_gbps.labels(name).set(r["estimated_gbps"])
            self.metrics.link_active.labels(name).set(r["active_transfers"])
            if r["transfer_p90_s"] is not None:
                self.metrics.link_p90.labels(name).set(r["transfer_p90_s"])

    def report(self) -> dict[str, dict[str, Any]]:
        return {name: m.report() for name, m in self.monitors.items()}
