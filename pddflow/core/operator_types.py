"""Operator types: typed ports, role and parameters (plugins add more: docs/plugins.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pddflow.core.payloads import Payload
from pddflow.core.registry import Registry


@dataclass(frozen=True)
class Param:
    type: type
    default: Any
    help: str
    choices: tuple[Any, ...] = ()  # when given, the only values a graph may set


@dataclass(frozen=True)
class OperatorType:
    name: str
    help: str
    inputs: dict[str, Payload]
    outputs: dict[str, Payload]
    role: str  # prefill (computes the prompt KV) | decode (can end a pipeline) | both (colocated)
    params: dict[str, Param] = field(default_factory=dict)

    # What the runtime, the scheduler and the simulator ask of a type: read from its role and
    # ports, so a plugin type answers without a list of names to extend.
    @property
    def decodes(self) -> bool:
        """Emits tokens after the first: a pipeline can end here (a relay decodes too)."""
        return self.role in ("decode", "both")

    @property
    def prefills(self) -> bool:
        """Computes the prompt's KV itself (a prefill operator, or one colocated): takes client
        requests, so a variant path starts at one."""
        return self.role in ("prefill", "both")

    @property
    def prefill_only(self) -> bool:
        """Prefills and hands the first token to a decoder (never decodes itself)."""
        return self.role == "prefill"

    @property
    def relays(self) -> bool:
        """Decodes eagerly and hands its token IDs to a main decoder (PDD's RelayDecode)."""
        return self.decodes and Payload.TOKEN_IDS in self.outputs.values()

    @property
    def takes_handoff(self) -> bool:
        """Extends over token IDs a relay hands it (PDD's MainDecode)."""
        return Payload.TOKEN_IDS in self.inputs.values()


OPERATOR_TYPES: Registry[OperatorType] = Registry("operator type", "pddflow.operators")

DEFAULT_MAX_BATCH = 64
DEFAULT_CHUNK_TOKENS = 512
_RADIX = Param(bool, True, "keep a decode-side radix cache (DRC) so only missing KV blocks travel")
_CHUNK = Param(
    int, DEFAULT_CHUNK_TOKENS, "prefill/extend chunk size in tokens (bounds one step's latency)"
)
_BATCH = Param(int, DEFAULT_MAX_BATCH, "most sequences in one decode step (continuous batching)")
_EP = Param(
    bool,
    False,
    "a mixture-of-experts model on several devices per replica: whole experts per rank "
    "(num_experts / ranks each) instead of a slice of every expert; attention stays split by heads",
)

for _t in (
    OperatorType(
        "prefill",
        "computes the prompt's KV (reusing cached prefix blocks) and the first token",
        inputs={"request": Payload.REQUEST},
        outputs={"kv": Payload.KV_BLOCKS, "tokens": Payload.TOKEN_STREAM},
        role="prefill",
        params={
            "prefix_cache": Param(bool, True, "reuse KV of prompt prefixes seen before"),
            "chunk_tokens": _CHUNK,
            "expert_parallel": _EP,
        },
    ),
    OperatorType(
        "relay_decode",
        "decodes as soon as the KV lands (eager tokens) and hands off token IDs",
        inputs={"kv": Payload.KV_BLOCKS},
        outputs={"tokens": Payload.TOKEN_STREAM, "handoff": Payload.TOKEN_IDS},
        role="decode",
        params={
            "max_batch": _BATCH,
            "expert_parallel": _EP,
            "catch_up_tokens": Param(int, 32, "tokens per catch-up handoff batch"),
            "min_extend_tokens": Param(
                int,
                8,
                "no handoff batch smaller than this (a tail chunk costs main a whole step) "
                "unless it ends a finished relay sequence: the relay decodes a few more first",
            ),
        },
    ),
    OperatorType(
        "main_decode",
        "decodes to the end; accepts a token-ID handoff and extends over it",
        inputs={"kv": Payload.KV_BLOCKS, "handoff": Payload.TOKEN_IDS},
        outputs={"tokens": Payload.TOKEN_STREAM},
        role="decode",
        params={
            "radix_cache": _RADIX,
            "max_batch": _BATCH,
            "chunk_tokens": _CHUNK,
            "expert_parallel": _EP,
        },
    ),
    OperatorType(
        "decode",
        "plain PD decode: receives the prompt KV and decodes to the end",
        inputs={"kv": Payload.KV_BLOCKS},
        outputs={"tokens": Payload.TOKEN_STREAM},
        role="decode",
        params={"radix_cache": _RADIX, "max_batch": _BATCH, "expert_parallel": _EP},
    ),
    OperatorType(
        "colocated",
        "one instance prefills and decodes (the reference and the no-PD baseline)",
        inputs={"request": Payload.REQUEST},
        outputs={"tokens": Payload.TOKEN_STREAM},
        role="both",
        params={
            "prefix_cache": Param(bool, True, "reuse KV of prompt prefixes seen before"),
            "max_batch": _BATCH,
            "chunk_tokens": _CHUNK,
            "expert_parallel": _EP,
        },
    ),
):
    OPERATOR_TYPES.register(_t.name, _t)
