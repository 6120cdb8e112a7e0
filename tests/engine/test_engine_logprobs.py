"""Log probabilities in the engine's sampling step: log-softmax of the raw logits the token was
sampled from (temperature 1, before top-p), the top k most likely first, computed only for the
sequences that ask (docs/openai-api.md, logprobs)."""

from __future__ import annotations

import pytest
import torch
from conftest import small_engine

from pddflow.core.payloads import Request, SamplingParams
from pddflow.operators import sampling as sampling_mod
from pddflow.operators.sampling import token_logprobs


def test_token_logprobs_are_log_softmax_and_top_k_ordered():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 50, generator=g) * 4
    tokens, ks = [5, 17, 49], [0, 3, 7]
    got = token_logprobs(logits, tokens, ks)
    want = torch.log_softmax(logits, dim=-1)
    for r, lp in enumerate(got):
        assert lp.logprob == pytest.approx(float(want[r, tokens[r]]), abs=1e-6)
        assert len(lp.top) == ks[r]
        values = [v for _, v in lp.top]
        assert values == sorted(values, reverse=True)  # most likely first
        best = torch.argsort(want[r], descending=True)[: ks[r]].tolist()
        assert [i for i, _ in lp.top] == best
        for i, v in lp.top:
            assert v == pytest.approx(float(want[r, i]), abs=1e-6)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_engine_reports_logprobs_of_the_raw_logits(temperature):
    eng = small_engine()
    prompt = [3, 14, 15, 92, 65, 35]
    params = SamplingParams(max_tokens=6, temperature=temperature, top_p=0.8, seed=5, logprobs=4)
    seq = eng.generate([prompt], params)[0]
    out = seq.output_ids
    assert len(seq.logprobs) == len(out) == 6
    # teacher-forced: row p's logits are the ones the token at p + 1 was sampled from
    logits = eng.score(prompt + out)[len(prompt) - 1 : -1]
    want = torch.log_softmax(logits.float(), dim=-1)
    for p, (tok, lp) in enumerate(zip(out, seq.logprobs)):
        assert lp.logprob == pytest.approx(float(want[p, tok]), abs=1e-4)
        assert [i for i, _ in lp.top] == torch.topk(want[p], 4).indices.tolist()
        if temperature == 0:
            assert lp.top[0][0] == tok  # greedy: the sampled token is the most likely


def test_logprobs_only_computed_when_asked(monkeypatch):
    calls = []
    real = sampling_mod.token_logprobs

    def counting(logits, tokens, ks):
        calls.append(logits.shape[0])
        return real(logits, tokens, ks)

    monkeypatch.setattr(sampling_mod, "token_logprobs", counting)
    eng = small_engine()
    plain = eng.generate([[1, 2, 3]], SamplingParams(max_tokens=4))[0]
    assert calls == [] and plain.logprobs == []
    # in a batch, only the row that asks pays (one row per step)
    asked = SamplingParams(max_tokens=4, logprobs=0)
    reqs = [Request("a", [1, 2, 3], asked), Request("b", [4, 5, 6], SamplingParams(max_tokens=4))]
    a, b = eng.generate(reqs)
    assert len(a.logprobs) == 4 and all(lp.top == () for lp in a.logprobs) and b.logprobs == []
    assert calls == [1, 1, 1, 1]  # a's prefill and 3 decode steps: a's row alone
