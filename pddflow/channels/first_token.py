"""Prefill's first token <-> the `FirstToken` of a KV transfer's header (`channels/proto`): the
token travels with the KV it belongs to, on every KV channel kind."""

from __future__ import annotations

from pddflow.channels.proto import pddflow_pb2 as pb
from pddflow.core.payloads import FirstToken, TokenLogprob


def first_to_pb(header: pb.KVTransfer, first: FirstToken | None) -> pb.KVTransfer:
    """Set header.first (nothing when there is no first token: a rank's other pieces)."""
    if first is None:
        return header
    m = header.first
    m.token, m.cached_tokens = first.token, first.cached_tokens
    if first.logprob is not None:
        m.has_logprob, m.logprob = True, first.logprob.logprob
        m.top_ids.extend(i for i, _ in first.logprob.top)
        m.top_logprobs.extend(v for _, v in first.logprob.top)
    return header


def first_from_pb(header: pb.KVTransfer) -> FirstToken | None:
    if not header.HasField("first"):
        return None
    m = header.first
    lp = None
    if m.has_logprob:
        top = tuple(zip(map(int, m.top_ids), map(float, m.top_logprobs)))
        lp = TokenLogprob(float(m.logprob), top)
    return FirstToken(int(m.token), lp, int(m.cached_tokens))


def first_to_meta(first: FirstToken | None) -> dict | None:
    """The same as JSON, for an Arrow stream's schema metadata (`codec_kv.py`)."""
    if first is None:
        return None
    out: dict = {"token": first.token, "cached_tokens": first.cached_tokens}
    if first.logprob is not None:
        out["logprob"] = first.logprob.logprob
        out["top"] = [list(t) for t in first.logprob.top]
    return out


def first_from_meta(meta: dict | None) -> FirstToken | None:
    if not meta:
        return None
    lp = None
    if "logprob" in meta:
        lp = TokenLogprob(float(meta["logprob"]), tuple((int(i), float(v)) for i, v in meta["top"]))
    return FirstToken(int(meta["token"]), lp, int(meta.get("cached_tokens", 0)))
