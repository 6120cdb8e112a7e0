"""What a KV send reports back: enough for a worker to log it and for the benchmarks to rate it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TransferReport:
    transfer_id: str
    seq_id: str
    num_blocks: int
    bytes: int
    seconds: float
    resent_blocks: int = 0  # blocks sent again after the receiver rejected their checksum
    reconnects: int = 0  # connections re-established mid-transfer (wan_flight)

    @property
    def gbps(self) -> float:
        return self.bytes * 8 / self.seconds / 1e9 if self.seconds > 0 else float("inf")
