"""Token sampling, stateless: the draw at position p is a hash of (seed, p), so a sequence split
across workers draws what one colocated run draws. Order: penalties on the logits (repetition, then
frequency and presence: a function of the sequence's tokens, which every worker holds), then greedy
argmax, or temperature, top-k, min-p and top-p over the most likely tokens first."""

from __future__ import annotations

import hashlib

import torch

from pddflow.core.payloads import SamplingParams, TokenLogprob
from pddflow.operators.grammar import GRAMMAR_DEAD_END, Grammars
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
    if params.top_k <= 0 and params.min_p <= 0 and params.top_p >= 1.0:
        # nothing cut: the same distribution walked in token order; sorting the vocabulary was
        # most of a draw's cost (docs/engine.md)
        cum = torch.cumsum(probs, 0)
        u = uniform(seed, position) * float(cum[-1])
        idx = int(torch.searchsorted(cum, torch.tensor([u], dtype=cum.dtype), right=True)[0])
        return min(idx, probs.numel() - 1)
    sorted_p, order = torch.sort(probs, descending=True, stable=True)
    cut = sorted_p.numel()
    if params.top_k > 0:
        cut = min(cut, params.top_k)
    if params.min_p > 0:
        cut = min(cut, int((sorted_p >= params.min_p * sorted_p[0]).sum()))
    cum = torch.cumsum(sorted_p[:cut], 0)
    keep = cut
    if params.top_p < 1.0:  # of what top-k and min-p kept, renormalised
        target = params.top_p * (float(cum[-1]) if cut < sorted_p.numel() else 1.0)
        keep = int(torch.searchsorted(cum, torch.tensor([target], dtype=cum.dtype))[0]) + 1
        keep = min(max(keep, 1), cut)
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


def penalize(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """The logits of the rows whose sampling penalizes repeats, adjusted (a copy; the others as
    they are). Repetition: every token of the prompt and the output; frequency and presence: the
    tokens generated so far (OpenAI's and vLLM's semantics)."""
    rows = [i for i, s in enumerate(seqs) if s.sampling.penalized]
    if not rows:
        return logits
    out = logits.clone()
    for i in rows:
        seq, p, row = seqs[i], seqs[i].sampling, out[i]
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(seq.token_ids)), dtype=torch.long, device=row.device)
            v = row[seen]
            row[seen] = torch.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
        generated = seq.generated_ids
        if generated and (p.frequency_penalty or p.presence_penalty):
            ids = torch.tensor(generated, dtype=torch.long, device=row.device)
            counts = torch.bincount(ids, minlength=row.numel()).to(row.dtype)
            row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)
    return out


def hold_stops(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """The rows of sequences short of their min_tokens with their stop tokens masked (a copy; the
    others as they are). A row whose grammar allows nothing but a stop keeps it: the output must
    follow its grammar first."""
    rows = [
        i
        for i, s in enumerate(seqs)
        if s.sampling.min_tokens and len(s.generated_ids) < s.sampling.min_tokens
    ]
    if not rows:
        return logits
    out = logits.clone()
    width = out.shape[1]
    for i in rows:
        stops = [t for t in seqs[i].sampling.stop_token_ids if 0 <= t < width]
        held = out[i].clone()
        held[stops] = float("-inf")
        if torch.isfinite(held).any():
            out[i] = held
    return out


def constrain(logits: torch.Tensor, seqs: list[Sequence], grammars: Grammars | None):
    """The rows of sequences under a grammar, masked to the tokens it allows next (a copy; the
    others as they are)."""
    rows = [i for i, s in enumerate(seqs) if s.sampling.grammar]
    if not rows:
        return logits
    if grammars is None:
        raise ValueError("structured output needs the model's tokenizer; this engine has none")
    out = logits.clone()
    for i in rows:
        seq = seqs[i]
        if seq.grammar is None:
            seq.grammar = grammars.state(seq.sampling.grammar)
        allowed = torch.from_numpy(grammars.mask(seq.grammar, seq.generated_ids)).to(out.device)
        width = min(allowed.numel(), out.shape[1])
        out[i, :width].masked_fill_(~allowed[:width], float("-inf"))
        out[i, width:] = float("-inf")
    return out


def sample_sequences(
    seqs: list[Sequence], logits: torch.Tensor, grammars: Grammars | None = None
) -> list[int]:
    """Sample row i for seqs[i], append the token (its KV pending), record log probabilities
    (of the raw logits) where asked, update the finish state."""
    toks = sample_batch(
        hold_stops(constrain(penalize(logits, seqs), seqs, grammars), seqs),
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
        if s.grammar is not None and s.grammar.dead:  # the mask left only EOS: end here
            s.finished, s.finish_reason = True, GRAMMAR_DEAD_END
        elif t in s.sampling.stop_token_ids:
            s.finished, s.finish_reason = True, "stop"
        elif len(s.token_ids) - s.num_prompt_tokens >= s.sampling.max_tokens:
            s.finished, s.finish_reason = True, "length"
    return toks
