"""`TokenIds` and control messages <-> protobuf (`channels/proto/pddflow.proto`): their one wire
form."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pddflow.channels.proto import pddflow_pb2 as pb
from pddflow.core.payloads import TokenIds


class ControlKind(enum.StrEnum):
    CANCEL = "cancel"  # stop work on the sequence and free its KV (a failed or moved leg)
    RELEASE = "release"  # the receiver has what it needs; the sender may free the sequence's KV
    LANDED = "landed"  # main holds the prompt's KV: the relay hands the request over


@dataclass(frozen=True)
class Control:
    kind: ControlKind
    seq_id: str
    reason: str = ""


@dataclass(frozen=True)
class Message:
    """What a token_ids endpoint receives: the payload and the peer that sent it."""

    peer: str
    payload: TokenIds | Control


_KIND_TO_PB = {
    ControlKind.CANCEL: pb.Control.CANCEL,
    ControlKind.RELEASE: pb.Control.RELEASE,
    ControlKind.LANDED: pb.Control.LANDED,
}
_PB_TO_KIND = {v: k for k, v in _KIND_TO_PB.items()}


def tokens_to_pb(t: TokenIds) -> pb.TokenIds:
    if t.start < 0:
        raise ValueError(f"TokenIds {t.seq_id!r}: start must be >= 0")
    return pb.TokenIds(seq_id=t.seq_id, start=t.start, ids=t.ids, final=t.final)


def tokens_from_pb(m: pb.TokenIds) -> TokenIds:
    return TokenIds(seq_id=m.seq_id, start=int(m.start), ids=list(m.ids), final=bool(m.final))


def control_to_pb(c: Control) -> pb.Control:
    return pb.Control(kind=_KIND_TO_PB[ControlKind(c.kind)], seq_id=c.seq_id, reason=c.reason)


def control_from_pb(m: pb.Control) -> Control:
    if m.kind not in _PB_TO_KIND:
        raise ValueError(f"unknown control kind {m.kind}")
    return Control(_PB_TO_KIND[m.kind], m.seq_id, m.reason)


def envelope(payload: TokenIds | Control, msg_no: int) -> pb.Envelope:
    if isinstance(payload, TokenIds):
        return pb.Envelope(msg_no=msg_no, tokens=tokens_to_pb(payload))
    if isinstance(payload, Control):
        return pb.Envelope(msg_no=msg_no, control=control_to_pb(payload))
    raise TypeError(f"token_ids carries TokenIds or Control, not {type(payload).__name__}")


def payload_of(env: pb.Envelope) -> TokenIds | Control | None:
    which = env.WhichOneof("body")
    if which == "tokens":
        return tokens_from_pb(env.tokens)
    if which == "control":
        return control_from_pb(env.control)
    return None


def seq_of(env: pb.Envelope) -> str:
    which = env.WhichOneof("body")
    if which == "tokens":
        return env.tokens.seq_id
    if which == "control":
        return env.control.seq_id
    if which == "ack":
        return env.ack.seq_id
    return ""


# gRPC frames each message with a 5-byte prefix (compressed flag + length) inside HTTP/2 DATA
# frames (9-byte header); the bench measures the real TCP bytes instead of trusting this sum.
GRPC_MESSAGE_PREFIX = 5
HTTP2_FRAME_HEADER = 9


def handoff_size(t: TokenIds, msg_no: int = 0) -> int:
    """Serialized envelope bytes of a handoff plus gRPC and HTTP/2 framing (one DATA frame)."""
    return envelope(t, msg_no).ByteSize() + GRPC_MESSAGE_PREFIX + HTTP2_FRAME_HEADER
