"""The correctness invariant: with greedy sampling, any split of a request into prefill, extend and
decode (on one engine or across engines, with or without prefix-cache hits, batched with anything)
emits exactly the colocated reference's tokens, for a dense model, a mixture of experts and
DeepSeek-V3's latent attention with its routing.
Property-based over prompts, split points and chunk sizes."""

from __future__ import annotations

import pytest
import torch
from conftest import SMALL, SMALL_MLA, SMALL_MOE, small_engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pddflow.core.payloads import SamplingParams
from pddflow.operators.engine import Engine

SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
prompts = st.lists(st.integers(0, SMALL.vocab_size - 1), min_size=1, max_size=70)


@pytest.fixture(params=["dense", "moe", "mla"])
def engine(request) -> Engine:
    """Every invariant holds for a mixture of experts too (tokens grouped by expert), and for
    latent attention (one plane of the pool, absorbed projections)."""
    return small_engine({"dense": SMALL, "moe": SMALL_MOE, "mla": SMALL_MLA}[request.param])


def fresh(engine: Engine) -> Engine:
    """Engines are cheap to build; each example gets new ones so a failing example cannot leave
    blocks behind for the next (hypothesis replays examples and needs them independent)."""
    return Engine(engine.source, engine.config)


def reference(engine: Engine, prompt: list[int], n: int) -> list[int]:
    """Colocated greedy run on a cold cache."""
    engine.radix.clear()
    out = engine.generate([prompt], SamplingParams(max_tokens=n))[0].output_ids
    engine.radix.clear()
    assert engine.allocator.num_used == 0
    return out


def assert_no_leak(*engines: Engine) -> None:
    for e in engines:
        assert e.allocator.num_used == len(e.radix), (
            "a block is held by neither the cache nor a sequence"
        )
        e.radix.clear()
        assert e.allocator.num_free == e.allocator.num_blocks


def test_engine_is_calibrated_batch_invariant(engine):
    assert engine.numerics.invariant


@pytest.mark.slow
@SETTINGS
@given(prompt=prompts, n=st.integers(2, 16), data=st.data())
def test_prefill_extend_decode_equals_colocated(engine, prompt, n, data):
    engine = fresh(engine)
    ref = reference(engine, prompt, n)
    k = data.draw(st.integers(1, n - 1), label="tokens handed over by extend")
    c1 = data.draw(st.integers(1, 64), label="prefill chunk")
    c2 = data.draw(st.integers(1, 64), label="extend chunk")
    seq = engine.add_sequence(prompt, SamplingParams(max_tokens=n))
    engine.prefill(seq, chunk_size=c1)
    engine.sample(seq, engine.extend(seq, ref[1:k], chunk_size=c2))
    while not seq.finished:
        engine.decode([seq])
    engine.free(seq)
    assert seq.output_ids == ref
    assert_no_leak(engine)


@pytest.mark.slow
@SETTINGS
@given(prompt=prompts, n=st.integers(2, 16), data=st.data())
def test_p_rld_md_across_engines_equals_colocated(engine, prompt, n, data):
    """P prefills and exports; RLD imports and decodes k tokens; MD imports the prompt KV (part of
    it already in its own prefix cache) and extends by RLD's token IDs, then decodes the rest."""
    engine, other = fresh(engine), fresh(engine)
    ref = reference(engine, prompt, n)
    k = data.draw(st.integers(1, n - 1), label="tokens decoded on the relay")
    params = SamplingParams(max_tokens=n)
    # MD (the `other` engine) may hold a prefix of this prompt from an earlier turn.
    warm = data.draw(st.integers(0, len(prompt)), label="MD cached prefix tokens")
    if warm:
        s = other.add_sequence(prompt[:warm], SamplingParams(max_tokens=1))
        other.prefill(s)
        other.free(s)
    p = engine.add_sequence(prompt, params, "req")
    first = engine.prefill(p, chunk_size=data.draw(st.integers(1, 64), label="P chunk"))

    rld = engine.add_sequence(prompt, params, "req-rld")  # relay: same cluster, full KV over RDMA
    engine.import_kv(rld, engine.export_kv(p), cache=False)
    engine.append_tokens(rld, [first])
    while len(rld.output_ids) < k:
        engine.decode([rld])
    handoff = rld.output_ids[:k]

    md = other.add_sequence(prompt, params, "req")
    hit = other.reuse_prefix(md, keep_last=False)
    assert hit == min(warm, len(prompt)) // other.block_size * other.block_size
    # only what MD lacks
    other.import_kv(md, engine.export_kv(p, start_block=hit // engine.block_size))
    engine.free(p)
    engine.free(rld)
    other.sample(
        md, other.extend(md, handoff, chunk_size=data.draw(st.integers(1, 64), label="MD chunk"))
    )
    while not md.finished:
        other.decode([md])
    other.free(md)
    assert md.output_ids == ref
    assert_no_leak(engine, other)


@pytest.mark.slow
@SETTINGS
@given(prefix=prompts, a=prompts, b=prompts, n=st.integers(1, 12))
def test_prefix_hit_reuses_blocks_and_matches_cold_run(engine, prefix, a, b, n):
    engine = fresh(engine)
    pa, pb = prefix + a, prefix + b
    cold = reference(engine, pb, n)
    engine.generate([pa], SamplingParams(max_tokens=n))  # warms the cache with prefix + a
    bs = engine.block_size
    expect = min(len(prefix) // bs, (len(pb) - 1) // bs)
    assert engine.match(engine.add_sequence(pb).block_hashes(bs)) >= expect
    seq = engine.add_sequence(pb, SamplingParams(max_tokens=n))
    reused = engine.reuse_prefix(seq)
    assert reused >= expect * bs
    engine.prefill(seq)
    while not seq.finished:
        engine.decode([seq])
    engine.free(seq)
    assert seq.output_ids == cold
    assert_no_leak(engine)


@pytest.mark.slow
@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batch=st.lists(st.tuples(prompts, st.integers(1, 12)), min_size=2, max_size=6),
    max_batch=st.integers(1, 4),
)
def test_continuous_batching_equals_one_at_a_time(engine, batch, max_batch):
    engine = fresh(engine)
    refs = [reference(engine, p, n) for p, n in batch]
    from pddflow.core.payloads import Request

    reqs = [Request(f"r{i}", p, SamplingParams(max_tokens=n)) for i, (p, n) in enumerate(batch)]
    outs = engine.generate(reqs, max_batch=max_batch)
    assert [s.output_ids for s in outs] == refs
    assert_no_leak(engine)


def test_extend_logits_are_bit_identical_to_decode_logits(engine):
    """Stronger than equal tokens: feeding known tokens one row at a time (the decode path), all at
    once, or in chunks of 3 gives the same logits bit for bit."""
    engine.radix.clear()
    prompt = list(range(3, 40))
    known = [5, 9, 11, 2, 60, 61, 7, 7, 30, 44, 1]

    def run(chunk: int | None, one_by_one: bool) -> torch.Tensor:
        seq = engine.add_sequence(prompt, SamplingParams(max_tokens=100))
        engine.prefill(seq)
        seq.token_ids.pop()  # drop the sampled token: we feed our own
        if one_by_one:
            for t in known:
                logits = engine.extend(seq, [t])  # a 1-row forward: the decode path
        else:
            logits = engine.extend(seq, known, chunk_size=chunk)
        engine.free(seq)
        engine.radix.clear()
        return logits

    ref = run(None, True)
    assert torch.equal(run(None, False), ref)
    assert torch.equal(run(3, False), ref)


@SETTINGS
@given(
    prompt=prompts,
    other=prompts,
    split=st.integers(1, 12),
    n=st.integers(3, 16),
)
def test_extend_batched_with_a_decode_step_matches_reference(engine, prompt, other, split, n):
    """Main's handoff extend riding along with another sequence's decode step (one forward)
    changes neither sequence's tokens."""
    eng = fresh(engine)
    want = reference(eng, prompt, n)
    want_other = reference(eng, other, n)
    split = min(split, n - 2)
    greedy = SamplingParams(max_tokens=n)
    seq = eng.add_sequence(prompt, greedy)
    eng.prefill(seq)  # the prompt and first token; the relay's next `split` IDs come as a handoff
    ids = want[1 : 1 + split]
    dec = eng.add_sequence(other, greedy)
    eng.prefill(dec)
    logits, toks = eng.extend_and_decode([(seq, ids)], [dec])
    eng.sample(seq, logits[0])
    assert seq.output_ids == want[: split + 2] and toks == want_other[1:2]
    while not seq.finished or not dec.finished:
        live = [s for s in (seq, dec) if not s.finished]
        eng.decode(live)
    assert seq.output_ids == want and dec.output_ids == want_other
    eng.free(seq)
    eng.free(dec)
