"""Token sampling, greedy or temperature + top-p, stateless: the draw at position p is a hash of
(seed, p), so a sequence split across workers draws what one colocated run draws."""

from __future__ import annotations

import hashlib

import torch

from pddflow.core.payloads import SamplingParams, TokenLogprob
from pddflow.operators.sequence import Sequence


def uniform(seed: int, position: int) -> float:
    h = hashlib.blake2b(
        (seed & (2**64 - 1)).to_bytes(8, "little") + position.to_bytes(8, "little"), digest_size=8
    )
    return (int.from_bytes(h.digest(), "little") >> 11) / float(1 << 53)


def sample_token(logits: torch.Tensor, params: SamplingParams, seed: int, position: int) -> int:
    """logits [V] (fp32). Greedy when temperature <= 0; ties go to the lowest token ID."""
    if params.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.double() / params.temperature, dim=-1)
    sorted_p, order = torch.sort(probs, descending=True, stable=True)
    cum = torch.cumsum(sorted_p, 0)
    if params.top_p < 1.0:
        keep = int(torch.searchsorted(cum, torch.tensor([params.top_p], dtype=cum.dtype))[0]) + 1
        keep = min(max(keep, 1), cum.numel())
    else:
        keep = cum.numel()
    u = uniform(seed, position) * float(cum[keep - 1])
    idx = int(torch.searchsorted(cum[:keep], torch.tensor([u], dtype=cum.dtype), right=True)[0])
    return int(order[min(idx, keep - 1)])


def token_logprobs(logits: torch.Tensor, tokens: list[int], ks: list[int]) -> list[TokenLogprob]:
    """logits [S, V]: log-softmax of each row at temperature 1 over the raw logits (the model's
    distribution before temperature and top-p, what vLLM reports by default), the sampled token's
    entry and the row's top ks[i]."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    k = min(max(ks, default=0), lp.shape[-1])  # the API caps k far below any vocabulary
    top_v, top_i = torch.topk(lp, k, dim=-1) if k else (None, None)
    picked = lp.gather(1, torch.tensor(tokens, device=lp.device).view(-1, 1)).view(-1).tolist()
    tops_v = top_v.tolist() if top_v is not None else [[] for _ in tokens]
    tops_i = top_i.tolist() if top_i is not None else [[] for _ in tokens]
    return [
        TokenLogprob(picked[r], tuple(zip(tops_i[r][: ks[r]], tops_v[r][: ks[r]])))
        for r in range(len(tokens))
    ]


def sample_batch(
    logits: torch.Tensor, params: list[SamplingParams], seeds: list[int], positions: list[int]
) -> list[int]:
    """logits [S, V]: one token per row; greedy rows share one argmax."""
    greedy = [i for i, p in enumerate(params) if p.temperature <= 0]
    out = [0] * len(params)
    if greedy:
        ids = (
            torch.argmax(logits[greedy], dim=-1).tolist()
            if len(greedy) < len(params)
            else torch.argmax(logits, dim=-1).tolist()
        )
        for i, t in zip(greedy, ids):
            out[i] = int(t)
    for i, p in enumerate(params):
        if p.temperature > 0:
            out[i] = sample_token(logits[i].cpu(), p, seeds[i], positions[i])
    return out


def sample_sequences(seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
    """Sample row i for seqs[i], append the token (its KV pending), record log probabilities
    where asked, update the finish state."""
    toks = sample_batch(
        logits,
        [s.sampling for s in seqs],
        [s.seed for s in seqs],
        [len(s.token_ids) for s in seqs],
    )
    # only rows that asked pay for the log-softmax (one batched call for them)
    want = [i for i, s in enumerate(seqs) if s.sampling.logprobs is not None]
    if want:
        rows = logits[want] if len(want) < len(seqs) else logits
        got = token_logprobs(
            rows, [toks[i] for i in want], [seqs[i].sampling.logprobs or 0 for i in want]
        )
        for i, lp in zip(want, got):
            seqs[i].logprobs.append(lp)
    for s, t in zip(seqs, toks):
        s.token_ids.append(t)
        if t in s.sampling.stop_token_ids:
            s.finished, s.finish_reason = True, "stop"
        elif len(s.token_ids) - s.num_prompt_tokens >= s.sampling.max_tokens:
            s.finished, s.finish_reason = True, "length"
    return toks
