"""Penalties and filters in the sampler: OpenAI's frequency and presence penalties, vLLM's
repetition penalty, top-k and min-p, each checked against its definition; the output a resumed leg
counts is the request's, not its prompt's; and the wire carries every field exactly."""

from __future__ import annotations

import pytest
import torch
from conftest import small_engine

from pddflow.core.payloads import SamplingParams
from pddflow.operators.sampling import hold_stops, penalize, sample_token
from pddflow.operators.sequence import Sequence
from pddflow.runtime.wire import sampling_from_pb, sampling_to_pb

V = 12


def _seq(prompt, output, output_start=None, **sampling) -> Sequence:
    s = Sequence("s", list(prompt) + list(output), len(prompt), SamplingParams(**sampling), 7)
    s.output_start = output_start
    return s


def test_frequency_and_presence_count_the_output_only():
    logits = torch.linspace(-3, 3, V).view(1, V)
    seq = _seq([1, 2, 3], [3, 3, 5], frequency_penalty=0.5, presence_penalty=0.25)
    got = penalize(logits, [seq])[0]
    want = logits[0].clone()
    want[3] -= 0.5 * 2 + 0.25
    want[5] -= 0.5 * 1 + 0.25
    assert torch.equal(got, want)  # tokens 1 and 2 (prompt only) untouched
    assert torch.equal(logits, torch.linspace(-3, 3, V).view(1, V))  # the input is not changed


def test_repetition_divides_positive_and_multiplies_negative_logits_of_prompt_and_output():
    logits = torch.tensor([[2.0, -2.0, 4.0, -1.0, 3.0]])
    seq = _seq([0, 1], [2, 3], repetition_penalty=2.0)
    assert penalize(logits, [seq]).tolist() == [[1.0, -4.0, 2.0, -2.0, 3.0]]


def test_min_tokens_holds_the_stop_tokens_until_the_output_has_them():
    """vLLM's min_tokens: the output (from the request's first token: a resumed leg's prompt holds
    some of it) cannot end before min_tokens; a grammar that allows only a stop keeps it."""
    logits = torch.linspace(-3, 3, V).view(1, V).repeat(4, 1)
    only_stop = torch.full((V,), float("-inf"))
    only_stop[11] = 0.0
    logits[3] = only_stop
    seqs = [
        _seq([1, 2], [4], min_tokens=3, stop_token_ids=(11, 9)),  # 1 of 3: held
        _seq([1, 2, 4, 5], [6], output_start=2, min_tokens=3, stop_token_ids=(11,)),  # 3 of 3
        _seq([1, 2], [], stop_token_ids=(11,)),  # no min_tokens
        _seq([1, 2], [], min_tokens=3, stop_token_ids=(11,)),  # the grammar's only token
    ]
    got = hold_stops(logits, seqs)
    assert got[0, 11] == float("-inf") and got[0, 9] == float("-inf")
    assert torch.equal(got[0, :9], logits[0, :9]) and got[0, 10] == logits[0, 10]
    assert torch.equal(got[1:], logits[1:])
    assert got.data_ptr() != logits.data_ptr()  # a copy: the input is not changed


def test_unpenalized_rows_are_left_alone_and_the_batch_kept():
    logits = torch.randn(3, V)
    seqs = [_seq([1], [1, 1]), _seq([1], [1, 1], presence_penalty=1.0), _seq([2], [])]
    got = penalize(logits, seqs)
    assert torch.equal(got[0], logits[0]) and torch.equal(got[2], logits[2])
    assert got[1, 1] == logits[1, 1] - 1.0
    assert penalize(logits, [seqs[0], seqs[2], seqs[0]]) is logits  # no copy when none asks


def test_a_resumed_leg_counts_the_requests_output():
    """A leg resumed elsewhere prefills prompt + output so far as its prompt (output_start marks
    where the output began): its penalties equal the original leg's."""
    logits = torch.randn(1, V)
    kw = {"frequency_penalty": 0.7, "presence_penalty": -0.3, "repetition_penalty": 1.3}
    original = _seq([1, 2], [4, 4, 9], **kw)
    resumed = _seq([1, 2, 4, 4, 9], [], output_start=2, **kw)
    assert torch.equal(penalize(logits, [original]), penalize(logits, [resumed]))


def test_top_k_and_min_p_keep_only_the_most_likely():
    logits = torch.tensor([0.0, 3.0, 2.9, 1.0, 2.8, -1.0])
    hot = {"temperature": 5.0}  # nearly uniform: without a cut, every token is drawn
    draws = {
        name: {sample_token(logits, SamplingParams(**hot, **cut), seed, 9) for seed in range(300)}
        for name, cut in {
            "none": {},
            "top_k": {"top_k": 3},
            "min_p": {"min_p": 0.95},
            "top_k 1": {"top_k": 1},
        }.items()
    }
    assert draws["none"] == set(range(6))
    assert draws["top_k"] == {1, 2, 4}
    p = torch.softmax(logits / 5.0, dim=-1)
    assert draws["min_p"] == {i for i in range(6) if p[i] >= 0.95 * p.max()}
    assert draws["top_k 1"] == {1}  # top-k 1 is greedy


def test_penalties_change_the_colocated_output():
    """A large frequency penalty keeps greedy decoding from repeating a token; none, and the
    model (a small random one) repeats."""
    eng = small_engine()
    prompt = [5, 9, 13, 2, 40, 41, 42]
    plain = eng.generate([prompt], SamplingParams(max_tokens=24))[0].output_ids
    strict = SamplingParams(max_tokens=24, frequency_penalty=2.0, presence_penalty=2.0)
    penalized = eng.generate([prompt], strict)[0].output_ids
    assert len(set(plain)) < len(plain)  # the plain output repeats itself
    assert penalized != plain
    assert len(set(penalized)) > len(set(plain))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(),
        SamplingParams(
            max_tokens=9,
            temperature=0.7,
            top_p=0.9,
            seed=3,
            frequency_penalty=0.3,
            presence_penalty=-1.7,
            repetition_penalty=1.15,
            top_k=40,
            min_p=0.05,
            logprobs=2,
            stop_token_ids=(7, 3),
            min_tokens=4,
        ),
    ],
)
def test_the_wire_carries_every_sampling_field_exactly(params):
    back = sampling_from_pb(sampling_to_pb(params))
    fields = ("frequency_penalty", "presence_penalty", "repetition_penalty", "top_k", "min_p")
    for name in (*fields, "stop_token_ids", "min_tokens"):
        assert getattr(back, name) == getattr(params, name), name
    assert back.logprobs == params.logprobs and back.max_tokens == params.max_tokens


def test_an_uncut_draw_follows_the_distribution_and_repeats():
    """Temperature alone (no top-k, min-p or top-p): the draw walks the vocabulary without
    sorting it; its frequencies are the softmax's, and a (seed, position) draws one token."""
    logits = torch.tensor([0.0, 1.0, 2.0, -1.0, 0.5])
    params = SamplingParams(temperature=0.7)
    draws = [sample_token(logits, params, 11, pos) for pos in range(6000)]
    want = torch.softmax(logits.double() / 0.7, dim=-1)
    for t in range(5):
        assert abs(draws.count(t) / len(draws) - float(want[t])) < 0.02, t
    assert draws[:50] == [sample_token(logits, params, 11, pos) for pos in range(50)]
