"""The frontend's view of its WAN links: every KV transfer over a link feeds that link's monitor
(scheduler/link_monitor.py), and the scheduler's link estimates, /health and /metrics are read
from the monitors."""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import Any

from pddflow.graph.plan import Plan
from pddflow.runtime.frontend.metrics import Metrics
from pddflow.scheduler.link_monitor import LinkMonitor
from pddflow.scheduler.state import SchedulerState

# without a transfer event, estimates move only by their decay (a 10 s half-life): re-reading the
# monitors more often than this changes nothing worth the work, and every reader within it (a
# decision, /health, a scrape) sees the same numbers
REFRESH_S = 1.0


class LinkWatch:
    def __init__(self, plan: Plan, sched: SchedulerState, metrics: Metrics):
        self.sched = sched
        self.monitors = {name: LinkMonitor(link) for name, link in plan.links.items()}
        self.metrics = metrics
        self.snapshot: dict[str, dict[str, Any]] = {}
        self._read_at = 0.0  # when the monitors were last read
        self._stale = True  # a transfer event since then

    def started(self, link: str, transfer: Hashable, nbytes: float = 0.0) -> None:
        self.monitors[link].started(transfer, nbytes)
        self._stale = True

    def ended(
        self, link: str, transfer: Hashable, nbytes: float | None, seconds: float | None
    ) -> None:
        self.monitors[link].ended(transfer, nbytes, seconds)
        self._stale = True

    def forget(self, instance: str) -> None:
        """`instance` is lost: the transfers it sent or was receiving will not end."""
        for monitor in self.monitors.values():
            monitor.forget(lambda t: instance in (t[1], t[2]))
        self._stale = True

    def refresh(self) -> None:
        """The scheduler's estimates and the gauges, read from the monitors after a transfer
        event or once REFRESH_S has passed; called before each decision, /health and scrape."""
        now = time.monotonic()
        if not self._stale and now - self._read_at < REFRESH_S:
            return
        self._read_at, self._stale = now, False
        for name, monitor in self.monitors.items():
            self.sched.set_link(monitor.estimate())
            r = self.snapshot[name] = monitor.report()
            self.metrics.link_gbps.labels(name).set(r["estimated_gbps"])
            self.metrics.link_active.labels(name).set(r["active_transfers"])
            if r["transfer_p90_s"] is not None:
                self.metrics.link_p90.labels(name).set(r["transfer_p90_s"])

    def report(self) -> dict[str, dict[str, Any]]:
        self.refresh()
        return dict(self.snapshot)
