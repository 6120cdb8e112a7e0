"""Prometheus metrics of one deployment (one registry per deployment, so tests can run several)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from pddflow.runtime.proto import runtime_pb2 as pb

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)
FINISH_REASONS = ("stop", "length", "abort", "error")


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
        # read when scraped, not set on every report
        self.relay_share.set_function(
            lambda: self._relay_tokens / self._all_tokens if self._all_tokens else 0.0
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
        self.link_gbps = Gauge(
            "pddflow_link_estimated_gbps",
            "the rate a link carries, measured from its recent KV transfers (decaying to the "
            "graph's link model)",
            ["link"],
            registry=r,
        )
        self.link_p90 = Gauge(
            "pddflow_link_transfer_p90_seconds",
            "P90 of the link's KV transfer times over the last minute",
            ["link"],
            registry=r,
        )
        self.link_active = Gauge(
            "pddflow_link_active_transfers", "KV transfers crossing the link", ["link"], registry=r
        )
        # the control plane's own costs (docs/simulator.md, Fleet scale): what grows with the
        # instance count
        self.reports = Counter(
            "pddflow_reports",
            "reports the frontend received from workers, by kind",
            ["kind"],
            registry=r,
        )
        self.route_s = Histogram(
            "pddflow_route_seconds",
            "the frontend's time to route one request (link estimate, policy, fallbacks)",
            registry=r,
            buckets=(1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.1),
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
        self.lease_lapses = Counter(
            "pddflow_lease_lapses",
            "times the frontend gave an instance's legs up: it did not hear the instance, or the "
            "instance did not answer its grants, for the lease (a partition, not a death)",
            ["instance"],
            registry=r,
        )
        self.partitions = Counter(
            "pddflow_partitions",
            "partitions seen: a link's far side went from reachable to an instance unreachable",
            ["link"],
            registry=r,
        )
        self.fallbacks = Counter(
            "pddflow_fallbacks", "requests finished by a declared fallback", ["kind"], registry=r
        )
        self.handoff = Histogram(
            "pddflow_handoff_seconds",
            "the frontend asking the relay to hand off -> main has extended over the final batch",
            ["mode"],
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.handoff_switches = Counter(
            "pddflow_handoff_switches",
            "adaptive catch-up handoffs the relay turned one-shot between batches (it got busy)",
            registry=r,
        )
        self.vllm = VllmMetrics(r)
        self._relay_tokens = 0
        self._all_tokens = 0
        self._children: dict[tuple[int, str], Any] = {}  # (metric, label) -> its child

    def _child(self, metric: Any, label: str) -> Any:
        """`metric.labels(label)`, looked up once: reports come once per engine step."""
        key = (id(metric), label)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(label)
        return child

    def report_counter(self, kind: str) -> Any:
        return self._child(self.reports, kind)

    def count_tokens(self, operator: str, n: int, relay: bool) -> None:
        """An engine step's new tokens from one operator (one call per report)."""
        self._child(self.tokens, operator).inc(n)
        self._all_tokens += n
        if relay:
            self._relay_tokens += n

    def watch_workers(self, statuses: dict[str, pb.WorkerStatus]) -> None:
        """Export the workers' own cumulative counters from their latest status reports."""
        self.registry.register(_WorkerCounters(statuses))

    def watch_deployment(self, model_name: str, gauges: Callable[[], dict[str, float]]) -> None:
        """The vLLM families are labelled `model_name`; `gauges()` gives the keys of
        VLLM_GAUGES at each scrape (called where /metrics is rendered: the frontend's loop)."""
        self.vllm.label(model_name)
        self.registry.register(_VllmGauges(model_name, gauges))

    def watch_pools(self, pools: Callable[[], dict[str, dict[str, Any]]]) -> None:
        """pddflow_pool_instances{operator, state}: each pool's instances by state at each scrape
        (`Pools.state`)."""
        self.registry.register(_PoolGauges(pools))

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


# TierStats field -> (family, help, counter?): each tier of a cache that has tiers under it
TIER_METRICS = {
    "blocks": ("pddflow_kv_tier_blocks", "KV blocks the tier holds", False),
    "capacity_blocks": ("pddflow_kv_tier_capacity_blocks", "KV blocks the tier can hold", False),
    "hit_blocks": ("pddflow_kv_tier_hit_blocks", "blocks loaded from the tier on a hit", True),
    "loaded_bytes": ("pddflow_kv_tier_loaded_bytes", "bytes loaded from the tier", True),
    "load_s": ("pddflow_kv_tier_load_seconds", "seconds the tier's loads took", True),
    "stored_blocks": ("pddflow_kv_tier_stored_blocks", "blocks written into the tier", True),
    "evicted_blocks": ("pddflow_kv_tier_evicted_blocks", "blocks the tier dropped for room", True),
    "corrupt_blocks": (
        "pddflow_kv_tier_corrupt_blocks",
        "disk blocks whose checksum failed, dropped",
        True,
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
        family = CounterMetricFamily(
            "pddflow_worker_lease_lapses",
            "times a worker's lease from the frontend lapsed and it dropped its legs",
            labels=["instance"],
        )
        for instance, status in sorted(self.statuses.items()):
            family.add_metric([instance], status.lease_lapses)
        yield family
        for field, (name, doc, counter) in TIER_METRICS.items():
            kind = CounterMetricFamily if counter else GaugeMetricFamily
            family = kind(name, doc, labels=["instance", "tier"])
            for instance, status in sorted(self.statuses.items()):
                for tier in status.tiers:
                    family.add_metric([instance, tier.tier], getattr(tier, field))
            yield family


POOL_STATES = ("up", "starting", "draining", "parked", "lost", "unreachable")


class _PoolGauges:
    def __init__(self, pools: Callable[[], dict[str, dict[str, Any]]]):
        self.pools = pools

    def collect(self):
        family = GaugeMetricFamily(
            "pddflow_pool_instances",
            "a pool's instances by state (live scaling: parked ones are wired, not running)",
            labels=["operator", "state"],
        )
        for operator, pool in sorted(self.pools().items()):
            states = list(pool["instances"].values())
            for state in POOL_STATES:
                family.add_metric([operator, state], states.count(state))
        yield family


class VllmMetrics:
    """The families vLLM exports, under vLLM's names and label (`model_name`), so that dashboards
    built for vLLM chart a deployment as they are (docs/runtime.md, Metrics)."""

    def __init__(self, r: CollectorRegistry):
        self.model_name = ""
        self._per_token: tuple[Any, Any, Any] | None = None  # tokens()'s labelled children
        m = ["model_name"]

        def hist(name: str, doc: str, buckets: tuple) -> Histogram:
            return Histogram(name, doc, m, registry=r, buckets=buckets)

        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "prefill tokens processed", m, registry=r
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "generation tokens processed", m, registry=r
        )
        self.prefix_queries = Counter(
            "vllm:prefix_cache_queries",
            "prompt tokens looked up in prefill's prefix cache",
            m,
            registry=r,
        )
        self.prefix_hits = Counter(
            "vllm:prefix_cache_hits",
            "prompt tokens prefill's prefix cache gave",
            m,
            registry=r,
        )
        self.success = Counter(
            "vllm:request_success",
            "finished requests by finish reason",
            ["model_name", "finished_reason"],
            registry=r,
        )
        self.ttft = hist(
            "vllm:time_to_first_token_seconds", "time to first token", _LATENCY_BUCKETS
        )
        self.itl = hist("vllm:inter_token_latency_seconds", "inter-token latency", _ITL_BUCKETS)
        self.tpot = hist(
            "vllm:time_per_output_token_seconds",
            "inter-token latency (vLLM's older name)",
            _ITL_BUCKETS,
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds", "end to end request latency", _LATENCY_BUCKETS
        )
        self.queue = hist(
            "vllm:request_queue_time_seconds",
            "time waiting for prefill (leg order received -> prefill started)",
            _LATENCY_BUCKETS,
        )
        self.prefill = hist(
            "vllm:request_prefill_time_seconds", "time computing the prefill", _LATENCY_BUCKETS
        )
        self.decode = hist(
            "vllm:request_decode_time_seconds", "first token -> last token", _LATENCY_BUCKETS
        )
        self.request_prompt_tokens = hist(
            "vllm:request_prompt_tokens", "prompt tokens per request", _TOKEN_BUCKETS
        )
        self.request_generation_tokens = hist(
            "vllm:request_generation_tokens", "generated tokens per request", _TOKEN_BUCKETS
        )

    def label(self, model_name: str) -> None:
        self.model_name, self._per_token = model_name, None

    def first_token(self, ttft_s: float, prompt_tokens: int) -> None:
        self.ttft.labels(self.model_name).observe(ttft_s)
        self.prompt_tokens.labels(self.model_name).inc(prompt_tokens)

    def tokens(self, n: int, gap_s: float | None) -> None:
        # per token: the labelled children looked up once, not on every call
        if self._per_token is None:
            name = self.model_name
            self._per_token = tuple(
                m.labels(name) for m in (self.generation_tokens, self.itl, self.tpot)
            )
        generated, itl, tpot = self._per_token
        generated.inc(n)
        if gap_s is not None:
            itl.observe(gap_s)
            tpot.observe(gap_s)

    def prefilled(self, prompt_tokens: int, cached_tokens: int, queue_s: float, run_s: float):
        self.prefix_queries.labels(self.model_name).inc(prompt_tokens)
        self.prefix_hits.labels(self.model_name).inc(cached_tokens)
        self.queue.labels(self.model_name).observe(queue_s)
        self.prefill.labels(self.model_name).observe(run_s)

    def finished(
        self,
        reason: str,
        e2e_s: float,
        decode_s: float | None,
        prompt_tokens: int,
        output_tokens: int,
    ) -> None:
        self.success.labels(self.model_name, reason).inc()
        self.e2e.labels(self.model_name).observe(e2e_s)
        if decode_s is not None:
            self.decode.labels(self.model_name).observe(decode_s)
        self.request_prompt_tokens.labels(self.model_name).observe(prompt_tokens)
        self.request_generation_tokens.labels(self.model_name).observe(output_tokens)


# key of the frontend's gauges() -> (vLLM gauge, help)
VLLM_GAUGES = {
    "running": ("vllm:num_requests_running", "requests in flight past prefill's queue"),
    "waiting": ("vllm:num_requests_waiting", "requests queued for prefill"),
    "kv_usage": (
        "vllm:kv_cache_usage_perc",
        "KV blocks held over all instances' blocks, prefix caches included (1 = 100%)",
    ),
}
# vLLM's older name of a gauge, still charted by older dashboards
VLLM_GAUGE_ALIASES = {"kv_usage": ("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc")}


class _VllmGauges:
    def __init__(self, model_name: str, gauges: Callable[[], dict[str, float]]):
        self.model_name, self.gauges = model_name, gauges

    def collect(self):
        values = self.gauges()
        for key, (name, doc) in VLLM_GAUGES.items():
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([self.model_name], values[key])
            yield family
        for key, (name, same_as) in VLLM_GAUGE_ALIASES.items():
            family = GaugeMetricFamily(name, f"the same as {same_as}", labels=["model_name"])
            family.add_metric([self.model_name], values[key])
            yield family
