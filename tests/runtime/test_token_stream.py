"""Merging token runs from several workers into one stream."""

from __future__ import annotations

import pytest

from pddflow.runtime.frontend.token_stream import StreamConflict, TokenRun, TokenStream


def _stream(max_tokens: int = 10) -> TokenStream:
    return TokenStream(
        "r", prompt_len=5, max_tokens=max_tokens, variant="p_rld_md", handoff="one_shot"
    )


def test_handoff_overlap_merges_without_repeat_or_gap():
    s = _stream()
    s.add(TokenRun(0, [7], "prefill"))
    s.add(TokenRun(1, [8, 9, 10], "relay"))
    s.add(TokenRun(6, [13, 14], "main"))  # arrives before the gap is filled
    assert s.tokens == [7, 8, 9, 10]
    s.add(TokenRun(3, [10, 11, 12], "main"))  # overlaps the relay's last token, agrees
    assert s.tokens == [7, 8, 9, 10, 11, 12, 13, 14]
    assert s.sources == ["prefill", "relay", "relay", "relay", "main", "main", "main", "main"]
    assert s.take_new() == [7, 8, 9, 10, 11, 12, 13, 14] and s.take_new() == []
    s.add(TokenRun(8, [15], "main", final=True))
    assert s.finished and s.tokens[-1] == 15


def test_disagreement_is_an_error():
    s = _stream()
    s.add(TokenRun(0, [1, 2, 3], "relay"))
    with pytest.raises(StreamConflict, match="position 2 is 3 from relay but 4 from main"):
        s.add(TokenRun(2, [4], "main"))


def test_max_tokens_and_final_end_the_stream():
    s = _stream(max_tokens=3)
    s.add(TokenRun(0, [1, 2, 3, 4], "main"))
    assert s.finished and s.tokens == [1, 2, 3]
    t = _stream()
    t.add(TokenRun(0, [1, 2], "main", final=True))
    assert t.finished and t.timeline()["tokens_by_operator"] == {"main": 2}


def test_logprobs_merge_by_position_first_writer_wins():
    from pddflow.core.payloads import TokenLogprob

    def lp(v: float) -> TokenLogprob:
        return TokenLogprob(v, ((1, v),))

    s = _stream(4)
    s.add(TokenRun(2, [3], "main", logprobs=[lp(-3.0)]))  # beyond the gap: kept with its logprob
    s.add(TokenRun(0, [1, 2], "relay", logprobs=[lp(-1.0), lp(-2.0)]))
    s.add(TokenRun(2, [3, 4], "relay", logprobs=[lp(-9.0), lp(-4.0)]))  # position 2 seen: main's
    chunk = s.take_new()
    assert chunk == [1, 2, 3, 4]
    assert [x.logprob for x in chunk.logprobs] == [-1.0, -2.0, -3.0, -4.0]
    t = _stream(2)
    t.add(TokenRun(0, [1, 2], "main"))  # a request that did not ask: None per token
    assert t.take_new().logprobs == [None, None]


def test_the_final_runs_reason_rides_the_last_chunk_once():
    """The worker that ended the output says why (the relay's run that ends it earliest wins
    over main's later final); the chunk taking the last token carries it, and only that one."""
    s = _stream()
    s.add(TokenRun(0, [1, 2], "relay"))
    assert s.take_new().finish_reason is None
    s.add(TokenRun(2, [3], "relay", final=True, finish_reason="grammar_dead_end"))
    s.add(TokenRun(2, [3, 4], "main", final=True, finish_reason="stop"))  # after the end
    last = s.take_new()
    assert last == [3] and last.finish_reason == "grammar_dead_end"
    again = s.take_new()
    assert again == [] and again.finish_reason is None
    t = _stream()
    t.add(TokenRun(0, [1, 2], "main", final=True, finish_reason="stop"))
    t.take_new()
    assert t.take_new().finish_reason is None  # told once


def test_a_stream_interval_wakes_the_reader_only_when_a_chunk_is_due():
    """The first token goes alone, then every `interval` tokens, then the rest with the finish
    reason; the chunks join to the same tokens in the same order."""
    s = _stream(max_tokens=8)
    s.interval = 3
    chunks = []

    def feed(pos: int, tok: int, final: bool = False) -> None:
        s.add(TokenRun(pos, [tok], "relay", final=final))
        if s.wakeup.is_set():
            assert s.ready()
            s.wakeup.clear()
            chunks.append(s.take_new())
        else:
            assert not s.ready()

    for pos in range(6):
        feed(pos, 100 + pos)
    feed(6, 106, final=True)
    assert [list(c) for c in chunks] == [[100], [101, 102, 103], [104, 105, 106]]
    assert chunks[-1].finish_reason is None and s.finished  # no stop token: the caller decides
    assert [t for c in chunks for t in c] == s.tokens


def test_tokens_that_come_while_the_reader_holds_a_chunk_are_not_lost():
    """Tokens added while the consumer still has the last chunk (its await ran the loop) set
    the wakeup before the reader waits again: it must look before clearing it, or the chunk
    waits for the deadline's wakeup (an hour here: the read would hang past wait_for's bound)."""
    import asyncio
    import time

    from pddflow.runtime.frontend.token_stream import stream_chunks

    async def read() -> list[list[int]]:
        s = _stream(max_tokens=3)
        s.add(TokenRun(0, [1], "prefill"))
        got = []
        async for chunk in stream_chunks(s, time.monotonic() + 3600):
            got.append(list(chunk))
            if len(got) == 1:  # the rest lands while this reader holds the first chunk
                s.add(TokenRun(1, [2, 3], "main", final=True))
        return got

    assert asyncio.run(asyncio.wait_for(read(), 30)) == [[1], [2, 3]]


def test_a_stream_that_gets_nothing_ends_at_its_deadline():
    import asyncio
    import time

    from pddflow.runtime.frontend.rejection import RequestRejected
    from pddflow.runtime.frontend.token_stream import stream_chunks

    async def read() -> None:
        async for _ in stream_chunks(_stream(), time.monotonic() + 0.05):
            pass

    with pytest.raises(RequestRejected, match="passed its deadline"):
        asyncio.run(read())
