"""What the scheduler sees: one request's features, each instance's load, each link's state."""

from __future__ import annotations

from dataclasses import dataclass

from pddflow.core.link import LinkModel


@dataclass(frozen=True)
class RequestFeatures:
    request_id: str
    prompt_tokens: int
    block_hashes: tuple[int, ...]  # chained, one per `block_tokens` of the prompt
    # the request's max_tokens (runtime); 0 when it has none (a trace replay): the policy's
    # output-length estimate (scheduler/output_lengths.py) says what to expect
    max_output_tokens: int
    block_tokens: int = 16  # tokens one hash covers (512 for Mooncake traces)

    def cached_tokens(self, hit_blocks: int) -> int:
        return min(hit_blocks * self.block_tokens, self.prompt_tokens)


@dataclass(frozen=True)
class InstanceLoad:
    running: int = 0
    queued: int = 0  # requests waiting for admission (KV not landed, no batch slot, no memory)
    max_batch: int = 64
    kv_used: float = 0.0  # share of the instance's KV budget in use by live sequences (0..1)
    queued_tokens: int = 0  # prefill/extend tokens waiting to be computed (prefill instances)

    @property
    def load(self) -> float:
        """One number in [0, inf): 1.0 means a full batch or full KV memory; queues add on top."""
        return max(self.running / max(self.max_batch, 1), self.kv_used) + self.queued / max(
            self.max_batch, 1
        )


# what the scheduler sees of an instance that takes no new work (lost, starting, draining, parked)
UNAVAILABLE = InstanceLoad(
    running=1 << 30, queued=1 << 30, max_batch=1, kv_used=1.0, queued_tokens=1 << 40
)


@dataclass(frozen=True)
class LinkEstimate:
    name: str
    bytes_per_s: float  # bandwidth a new flow would get (the link's share left for it)
    rtt_s: float
    delay_p50_s: float  # extra per-transfer delay (jitter) quantiles, measured or from the model
    delay_p90_s: float
    delay_p99_s: float
    active_flows: int = 0

    def transfer_s(self, nbytes: float, quantile: str = "p90") -> float:
        delay = {"p50": self.delay_p50_s, "p90": self.delay_p90_s, "p99": self.delay_p99_s}[
            quantile
        ]
        return self.rtt_s + delay + nbytes / max(self.bytes_per_s, 1.0)

    @staticmethod
    def from_model(link: LinkModel, active_flows: int = 0) -> LinkEstimate:
        """The model's estimate with `active_flows` in flight (a new flow gets 1/(n+1))."""
        j = link.jitter
        return LinkEstimate(
            link.name,
            link.bytes_per_s / (active_flows + 1),
            link.rtt_ms / 1e3,
            j.quantile_ms(0.5) / 1e3,
            j.quantile_ms(0.9) / 1e3,
            j.quantile_ms(0.99) / 1e3,
            active_flows,
        )
