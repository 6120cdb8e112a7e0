"""Prometheus metrics of one deployment (one registry per deployment, so tests can run several)."""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily

from pddflow.runtime.proto import runtime_pb2 as pb

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.ttft = Histogram(
            "pddflow_ttft_seconds", "time to first token", registry=r, buckets=_LATENCY_BUCKETS
        )
        self.itl = Histogram(
            "pddflow_inter_token_seconds",
            "time between consecutive streamed tokens",
            registry=r,
            buckets=_ITL_BUCKETS,
        )
        self.e2e = Histogram(
            "pddflow_request_seconds",
            "request latency, arrival to last token",
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.requests = Counter(
            "pddflow_requests",
            "requests by variant, handoff mode and outcome",
            ["variant", "handoff", "outcome"],
            registry=r,
        )
        self.tokens = Counter(
            "pddflow_output_tokens",
            "output tokens by the operator that produced them",
            ["operator"],
            registry=r,
        )
        self.relay_share = Gauge(
            "pddflow_relay_token_share",
            "share of output tokens produced by relay decoders",
            registry=r,
        )
        self.wan_bytes = Counter(
            "pddflow_wan_bytes_sent", "KV bytes sent across cluster links", ["link"], registry=r
        )
        self.wan_saved = Counter(
            "pddflow_wan_bytes_saved",
            "KV bytes not sent because the receiver's radix cache had them (DRC)",
            ["link"],
            registry=r,
        )
        self.kv_transfer = Histogram(
            "pddflow_kv_transfer_seconds",
            "KV transfer time by channel",
            ["channel"],
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.queue_depth = Gauge(
            "pddflow_queue_depth",
            "requests waiting or running per instance",
            ["instance"],
            registry=r,
        )
        self.kv_blocks_used = Gauge(
            "pddflow_kv_blocks_used", "KV blocks in use per instance", ["instance"], registry=r
        )
        self.kv_blocks_total = Gauge(
            "pddflow_kv_blocks_total", "KV blocks per instance", ["instance"], registry=r
        )
        self.worker_up = Gauge(
            "pddflow_worker_up", "1 while a worker reports, 0 once lost", ["instance"], registry=r
        )
        self.worker_restarts = Counter(
            "pddflow_worker_restarts", "workers restarted by the deployer", ["instance"], registry=r
        )
        self.orphans_aborted = Counter(
            "pddflow_orphan_legs_aborted",
            "legs a worker still held after their request ended, aborted by the frontend",
            ["instance"],
            registry=r,
        )
        self.fallbacks = Counter(
            "pddflow_fallbacks", "requests finished by a declared fallback", ["kind"], registry=r
        )
        self._relay_tokens = 0
        self._all_tokens = 0

    def count_tokens(self, operator: str, n: int, relay: bool) -> None:
        self.tokens.labels(operator).inc(n)
        self._all_tokens += n
        if relay:
            self._relay_tokens += n
        self.relay_share.set(self._relay_tokens / self._all_tokens if self._all_tokens else 0.0)

    def watch_workers(self, statuses: dict[str, pb.WorkerStatus]) -> None:
        """Export the workers' own cumulative counters from their latest status reports."""
        self.registry.register(_WorkerCounters(statuses))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


# WorkerStatus field -> (counter, help): each decoder's decode steps since it started
DECODE_COUNTERS = {
    "decode_steps": ("pddflow_decode_steps", "continuous-batching decode steps"),
    "decode_seqs": (
        "pddflow_decode_sequences",
        "sequences in decode steps, summed over the steps (over steps: the mean batch)",
    ),
    "decode_context_tokens": (
        "pddflow_decode_context_tokens",
        "context tokens the stepped sequences held, summed over the steps",
    ),
    "decode_cpu_s": ("pddflow_decode_cpu_seconds", "CPU seconds of the worker loop's decode steps"),
    "decode_wall_s": (
        "pddflow_decode_wall_seconds",
        "wall seconds of the worker loop's iterations that ran a decode step",
    ),
}


class _WorkerCounters:
    def __init__(self, statuses: dict[str, pb.WorkerStatus]):
        self.statuses = statuses

    def collect(self):
        for field, (name, doc) in DECODE_COUNTERS.items():
            family = CounterMetricFamily(name, doc, labels=["instance"])
            for instance, status in sorted(self.statuses.items()):
                family.add_metric([instance], getattr(status, field))
            yield family
