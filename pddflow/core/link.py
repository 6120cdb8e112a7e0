"""The link model: `pddflow plan`'s arithmetic, emulated channels' shaping, the simulator's WAN."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

_STD_NORMAL = statistics.NormalDist()
Z99 = _STD_NORMAL.inv_cdf(0.99)


def jitter_stream(seed: int, key: int | str) -> random.Random:
    """The delays one emulated connection draws. The simulator's replay of a deployment draws the
    same sequence, so a few dozen requests see the same delays, not two samples of a heavy tail."""
    return random.Random(f"{seed}:{key}")


def kv_link_seed(deploy_seed: int) -> int:
    return 2 * deploy_seed


@dataclass(frozen=True)
class Jitter:
    """Extra one-way delay per transfer, on top of RTT: `lognormal` through p50 and p99 (the heavy
    tail PDD measured for KV over a busy WAN), `normal` (clipped at 0) or `constant` (p50)."""

    p50_ms: float = 0.0
    p99_ms: float = 0.0
    dist: str = "lognormal"

    def quantile_ms(self, q: float) -> float:
        if self.dist == "constant" or self.p50_ms <= 0 or self.p99_ms <= self.p50_ms:
            return self.p50_ms
        z = _norm_ppf(q)
        if self.dist == "normal":
            sigma = (self.p99_ms - self.p50_ms) / Z99
            return max(0.0, self.p50_ms + z * sigma)
        sigma = (math.log(self.p99_ms) - math.log(self.p50_ms)) / Z99
        return math.exp(math.log(self.p50_ms) + z * sigma)

    def sample_ms(self, rng: random.Random) -> float:
        if self.dist == "constant" or self.p50_ms <= 0 or self.p99_ms <= self.p50_ms:
            return self.p50_ms
        if self.dist == "normal":
            sigma = (self.p99_ms - self.p50_ms) / Z99
            return max(0.0, rng.gauss(self.p50_ms, sigma))
        sigma = (math.log(self.p99_ms) - math.log(self.p50_ms)) / Z99
        return rng.lognormvariate(math.log(self.p50_ms), sigma)


@dataclass(frozen=True)
class LinkModel:
    name: str
    a: str
    b: str
    gbps: float
    rtt_ms: float = 0.0
    jitter: Jitter = Jitter()
    # what one TCP stream sustains (window/RTT unless declared); a transfer over `streams` of them
    # gets at most streams x this (its fair share of `gbps` otherwise); 0: no per-stream limit
    stream_gbps: float = 0.0

    @property
    def bytes_per_s(self) -> float:
        return self.gbps * 1e9 / 8

    def serialization_s(self, nbytes: float, share: float = 1.0) -> float:
        return nbytes / (self.bytes_per_s * max(share, 1e-9))

    def transfer_quantile_s(self, nbytes: float, q: float, share: float = 1.0) -> float:
        return (
            self.rtt_ms / 1e3
            + self.jitter.quantile_ms(q) / 1e3
            + self.serialization_s(nbytes, share)
        )

    def flow_cap_gbps(self, streams: int) -> float:
        """The most one transfer over `streams` parallel streams gets; 0: only the link's rate."""
        return self.stream_gbps * max(streams, 1) if self.stream_gbps > 0 else 0.0

    def flow_bytes_per_s(self, streams: int, share: float = 1.0) -> float:
        """One transfer's rate: its `share` of the link, at most its streams' cap."""
        rate = self.bytes_per_s * max(share, 1e-9)
        cap = self.flow_cap_gbps(streams) * 1e9 / 8
        return min(rate, cap) if cap > 0 else rate

    def connects(self, x: str, y: str) -> bool:
        return {x, y} == {self.a, self.b}


def window_stream_gbps(window_mib: float, rtt_ms: float) -> float:
    """A TCP stream's ceiling over a long fat pipe: one window per round trip; 0 when rtt is 0."""
    if rtt_ms <= 0 or window_mib <= 0:
        return 0.0
    return window_mib * 1024 * 1024 * 8 / (rtt_ms / 1e3) / 1e9


def _norm_ppf(q: float) -> float:
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile must be in (0, 1), got {q}")
    return _STD_NORMAL.inv_cdf(q)
