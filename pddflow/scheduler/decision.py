"""What a policy returns for one request."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Decision:
    variant: str
    targets: tuple[
        tuple[str, str], ...
    ]  # (operator, instance id) for every operator of the path, in path order
    # adaptive resolved to one_shot | catch_up; None without a relay handoff
    handoff: str | None = None
    singular: bool = False  # the relay finishes the request; its WAN leg is cancelled
    predicted_hit: float = 0.0  # share of prompt tokens the finishing decoder's cache holds
    predicted_hit_tokens: int = 0
    transfer_bytes: float = 0.0  # KV bytes predicted to cross to the finishing decoder
    predicted_transfer_s: float = 0.0  # P90, current link estimate; 0 inside a cluster
    reason: str = ""

    def target(self, operator: str) -> str:
        for op, inst in self.targets:
            if op == operator:
                return inst
        raise KeyError(
            f"decision for variant {self.variant} has no target for operator {operator!r}"
        )

    @property
    def instances(self) -> tuple[str, ...]:
        return tuple(inst for _, inst in self.targets)
