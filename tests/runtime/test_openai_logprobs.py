"""Log probabilities end to end on a real deployment of graphs/pdd.yaml, with the official `openai`
client: on every route (P-MD; P-RLD-MD one-shot and catch-up) each generated token carries the
logprob of the worker that sampled it (prefill's first token, the relay's eager ones, main's after
the handoff), and the values are those of a colocated reference engine (docs/openai-api.md)."""

from __future__ import annotations

import pytest
import torch

from pddflow.bench.deploy_process import get_json
from pddflow.core.payloads import SamplingParams
from pddflow.operators.engine import Engine
from pddflow.runtime.api.schema import ChatMessage
from pddflow.runtime.frontend.model_info import model_info

pytestmark = pytest.mark.slow  # starts a deployment: worker processes

openai = pytest.importorskip("openai")

SPEC = "builtin:tiny-llama"
ROUTES = [
    {"variant": "p_md"},
    {"variant": "p_rld_md", "handoff": "one_shot"},
    {"variant": "p_rld_md", "handoff": "catch_up"},
]
MAX_TOKENS = 12
TOL = 1e-4


@pytest.fixture(scope="module")
def dep(shipped_pdd):
    return shipped_pdd  # conftest.py: shared with the other request-only modules


@pytest.fixture(scope="module")
def client(dep):
    return openai.OpenAI(base_url=f"{dep.base}/v1", api_key="none", timeout=120, max_retries=0)


@pytest.fixture(scope="module")
def reference():
    """Greedy decoding on one colocated engine: (ids, log_softmax of each step's logits)."""
    engine = Engine.from_spec(SPEC)
    eos = set(model_info(SPEC).eos_token_ids)
    memo: dict[tuple[int, ...], tuple[list[int], list[torch.Tensor]]] = {}

    def run(prompt_ids: list[int]) -> tuple[list[int], list[torch.Tensor]]:
        key = tuple(prompt_ids)
        if key not in memo:
            seq = engine.add_sequence(prompt_ids, SamplingParams(max_tokens=MAX_TOKENS))
            ids, rows = [], []
            logits = engine.extend(seq, [])  # the prompt's forward: the first token's logits
            while True:
                lp = torch.log_softmax(logits.float(), dim=-1)
                tok = int(torch.argmax(lp))
                ids.append(tok)
                rows.append(lp)
                if tok in eos or len(ids) == MAX_TOKENS:
                    break
                logits = engine.extend(seq, [tok])
            engine.free(seq)
            memo[key] = (ids, rows)
        return memo[key]

    return run


def _check(ids, sampled_lps, tops, ref, name) -> None:
    """Against the reference: the same tokens, each with its logprob, and the top alternatives
    (tops: per token [(name, logprob)], most likely first; name: an id's name in the response)."""
    want_ids, rows = ref
    assert ids == want_ids
    assert len(sampled_lps) == len(tops) == len(ids)  # every token has its logprob
    for tok, lp, top, row in zip(ids, sampled_lps, tops, rows):
        assert lp == pytest.approx(float(row[tok]), abs=TOL)
        assert top[0][0] == name(tok)  # temperature 0: the sampled token is the most likely
        want = torch.topk(row, len(top))
        assert [n for n, _ in top] == [name(i) for i in want.indices.tolist()]
        assert [v for _, v in top] == pytest.approx(want.values.tolist(), abs=TOL)


def _ids(choice) -> list[int]:
    return list(choice.model_extra["token_ids"])


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: "-".join(r.values()))
def test_completions_logprobs_on_every_route(client, dep, reference, route):
    prompt = f"Logprobs travel with their tokens ({route['variant']}):"
    prompt_ids = model_info(SPEC).tokenizer.encode(prompt)
    extra = {**route, "return_token_ids": True}
    r = client.completions.create(
        model="pdd", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, logprobs=3,
        extra_body=extra,
    )  # fmt: skip
    c = r.choices[0]
    ids = _ids(c)
    lp = c.logprobs
    assert len(lp.tokens) == len(lp.text_offset) == len(ids)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    ref_ids, rows = reference(prompt_ids)
    decode = model_info(SPEC).tokenizer.decode
    assert ids == ref_ids and lp.tokens == [decode([i]) for i in ids]
    for tok, sampled, top, row in zip(ids, lp.token_logprobs, lp.top_logprobs, rows):
        assert sampled == pytest.approx(float(row[tok]), abs=TOL)
        # the 3 most likely by their strings, and the sampled token (the first of them here)
        want = torch.topk(row, 3)
        assert int(want.indices[0]) == tok
        expect = {decode([i]): v for i, v in zip(want.indices.tolist(), want.values.tolist())}
        assert list(top) == list(expect)
        assert list(top.values()) == pytest.approx(list(expect.values()), abs=TOL)
    timeline = get_json(f"{dep.base}/v1/requests/{r.id}/timeline")[1]
    assert timeline["variant"] == route["variant"]
    # prefill's first token and the relay's eager ones reach the client through the decoders
    by_op = timeline["tokens_by_operator"]
    assert sum(by_op.values()) == len(ids)
    assert set(by_op) <= ({"main"} if route["variant"] == "p_md" else {"relay", "main"})

    # streamed: each chunk carries its tokens' logprobs, text_offset across the whole output
    stream = client.completions.create(
        model="pdd", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, logprobs=3,
        stream=True, extra_body=extra,
    )  # fmt: skip
    s_ids, s_lps, offsets = [], [], []
    for chunk in stream:
        ch = chunk.choices[0]
        got = ch.model_extra.get("token_ids") or []
        if ch.logprobs is None:
            assert got == []
            continue
        assert len(ch.logprobs.tokens) == len(got)
        s_ids += got
        s_lps += ch.logprobs.token_logprobs
        offsets += ch.logprobs.text_offset
    assert s_ids == ids and offsets == lp.text_offset
    assert s_lps == pytest.approx(lp.token_logprobs, abs=TOL)


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: "-".join(r.values()))
def test_chat_logprobs_on_every_route(client, reference, route):
    messages = [{"role": "user", "content": f"Say something ({'/'.join(route.values())})"}]
    info = model_info(SPEC)
    prompt_ids = info.chat_prompt_ids([ChatMessage(**m) for m in messages])
    extra = {**route, "return_token_ids": True}
    kw = dict(
        model="pdd", messages=messages, max_tokens=MAX_TOKENS, temperature=0, logprobs=True,
        top_logprobs=2, extra_body=extra,
    )  # fmt: skip
    r = client.chat.completions.create(**kw)
    c = r.choices[0]
    content = c.logprobs.content
    ids = _ids(c)
    assert [bytes(e.bytes) for e in content] == [info.tokenizer.token_bytes(i) for i in ids]

    name = info.tokenizer.token_bytes

    def tops(entries):
        return [[(bytes(t.bytes), t.logprob) for t in e.top_logprobs] for e in entries]

    assert all(len(e.top_logprobs) == 2 for e in content)
    _check(ids, [e.logprob for e in content], tops(content), reference(prompt_ids), name)

    # streamed
    s_ids, s_entries = [], []
    for chunk in client.chat.completions.create(**kw, stream=True):
        ch = chunk.choices[0]
        got = ch.model_extra.get("token_ids") or []
        if ch.logprobs is not None:
            assert len(ch.logprobs.content) == len(got)
            s_entries += ch.logprobs.content
        s_ids += got
    _check(s_ids, [e.logprob for e in s_entries], tops(s_entries), reference(prompt_ids), name)
