"""The one conversion between the control plane's protobuf messages and the in-process types: a
request's sampling parameters and the log probabilities that travel with its tokens."""

from __future__ import annotations

from collections.abc import Sequence

from pddflow.core.payloads import SamplingParams, TokenLogprob
from pddflow.runtime.proto import runtime_pb2 as pb


def sampling_to_pb(s: SamplingParams, max_tokens: int | None = None) -> pb.Sampling:
    """`max_tokens` overrides the request's (a resumed leg has fewer left to generate)."""
    return pb.Sampling(
        max_tokens=s.max_tokens if max_tokens is None else max_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        seed=s.seed,
        stop_token_ids=list(s.stop_token_ids),
        min_tokens=s.min_tokens,
        logprobs=s.logprobs is not None,
        top_logprobs=s.logprobs or 0,
        frequency_penalty=s.frequency_penalty,
        presence_penalty=s.presence_penalty,
        repetition_penalty=s.repetition_penalty,
        top_k=s.top_k,
        min_p=s.min_p,
        grammar=s.grammar or "",
    )


def sampling_from_pb(s: pb.Sampling) -> SamplingParams:
    return SamplingParams(
        max_tokens=s.max_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        seed=s.seed,
        stop_token_ids=tuple(s.stop_token_ids),
        min_tokens=s.min_tokens,
        logprobs=s.top_logprobs if s.logprobs else None,
        frequency_penalty=s.frequency_penalty,
        presence_penalty=s.presence_penalty,
        repetition_penalty=s.repetition_penalty or 1.0,
        top_k=s.top_k,
        min_p=s.min_p,
        grammar=s.grammar or None,
    )


def logprobs_to_pb(msg: pb.Tokens, lps: Sequence[TokenLogprob] | None) -> pb.Tokens:
    """Set msg's logprobs and top (parallel to its ids)."""
    for lp in lps or ():
        msg.logprobs.append(lp.logprob)
        msg.top.append(pb.TopLogprobs(ids=[i for i, _ in lp.top], logprobs=[v for _, v in lp.top]))
    return msg


def logprobs_from_pb(msg: pb.Tokens) -> list[TokenLogprob] | None:
    """msg's log probabilities, one per id, or None when it carries none."""
    if not msg.logprobs:
        return None
    return [
        TokenLogprob(float(v), tuple(zip(map(int, t.ids), map(float, t.logprobs))))
        for v, t in zip(msg.logprobs, msg.top)
    ]
