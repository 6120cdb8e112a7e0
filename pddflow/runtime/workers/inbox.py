"""What reaches a worker's loop: one typed message per input, from the RPC and channel threads."""

from __future__ import annotations

from dataclasses import dataclass

from pddflow.core.payloads import KVBlocks, TokenIds
from pddflow.runtime.proto import runtime_pb2 as pb


@dataclass(frozen=True)
class LegOrdered:
    order: pb.LegOrder
    received: float  # monotonic, stamped by the RPC thread: a leg's queue time starts here

    @property
    def seq_id(self) -> str:
        return self.order.seq_id


@dataclass(frozen=True)
class MainLanded:
    """Main, over the token_ids channel: it holds the prompt's KV, hand the request over."""

    seq_id: str


@dataclass(frozen=True)
class Abort:
    seq_id: str
    reason: str


@dataclass(frozen=True)
class KVLost:
    """This leg's KV will not arrive: recompute it from the prompt's token IDs."""

    seq_id: str
    reason: str


@dataclass(frozen=True)
class KVArrived:
    kv: KVBlocks
    arrived: float  # monotonic: when the KV reached this process
    pieces: int = 1  # rank-to-rank KV: the sending ranks' pieces joined into it

    @property
    def seq_id(self) -> str:
        return self.kv.seq_id


@dataclass(frozen=True)
class HandoffTokens:
    """A batch of the relay's generated IDs, for main to extend over."""

    peer: str  # the relay instance that sent them
    ids: TokenIds

    @property
    def seq_id(self) -> str:
        return self.ids.seq_id


@dataclass(frozen=True)
class CaughtUp:
    """Main has extended over every catch-up batch: the relay sends the rest and stops."""

    seq_id: str


@dataclass(frozen=True)
class HandoffDelivered:
    """Main took the final batch: the relay's leg ends."""

    seq_id: str


@dataclass(frozen=True)
class HandoffUndeliverable:
    """Main cannot be reached: the relay finishes the request itself."""

    seq_id: str


InboxItem = (
    LegOrdered
    | MainLanded
    | Abort
    | KVLost
    | KVArrived
    | HandoffTokens
    | CaughtUp
    | HandoffDelivered
    | HandoffUndeliverable
)
