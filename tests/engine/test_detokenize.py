"""Incremental detokenization (pddflow/operators/detokenize.py): whatever the ids and however they
are chunked, the pieces add up to exactly the full decode, and no piece splits a character."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pddflow.operators.detokenize import ByteDetokenizer, WindowDetokenizer, detokenizer
from pddflow.operators.tokenizer import ByteTokenizer, HFTokenizer

CORPUS = [
    "The relay decodes while the KV crosses the WAN.",
    "naïve café, crème brûlée: déjà vu — 100 € or ¥ or £",
    "中文的句子，日本語の文章、한국어 문장.",
    "emoji 😀😃🚀 and flags 🇫🇷🇯🇵 and math ∑∫√∞ ≠ ≤",
    "Hello, main decode! Hello hello HELLO",
]


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> HFTokenizer:
    """A byte-level BPE trained here on a tiny corpus (merges straddle multi-byte characters)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<eos>"],
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return HFTokenizer(path, eos_token_ids=(tok.token_to_id("<eos>"),))


def _stream(tok, ids: list[int], cuts: list[int], skip: bool = True) -> list[str]:
    """The pieces of `ids` pushed in chunks ending at `cuts`, then the flush."""
    d = detokenizer(tok, skip)
    pieces, at = [], 0
    for cut in sorted({min(c, len(ids)) for c in cuts}) + [len(ids)]:
        pieces.append(d.push(ids[at:cut]))
        at = cut
    pieces.append(d.flush())
    return pieces


def _no_split_characters(tok, ids: list[int], pieces: list[str], skip: bool = True) -> None:
    """A piece never ends in U+FFFD unless the full decode has one there (no character cut)."""
    full = tok.decode(ids, skip_special_tokens=skip)
    at = 0
    for p in pieces:
        at += len(p)
        if p.endswith("\ufffd"):
            assert full[at - 1] == "\ufffd"


def test_kinds():
    assert isinstance(detokenizer(ByteTokenizer()), ByteDetokenizer)


def test_hf_is_windowed(hf):
    assert isinstance(detokenizer(hf), WindowDetokenizer)


@pytest.mark.parametrize("skip", [True, False], ids=["skip_specials", "specials_as_text"])
@settings(max_examples=300, deadline=None)
@given(
    ids=st.lists(st.integers(0, ByteTokenizer.vocab_size - 1), max_size=80),
    cuts=st.lists(st.integers(0, 80), max_size=10),
)
def test_bytes_random_ids_equal_full_decode(skip, ids, cuts):
    """Either way of vLLM's skip_special_tokens: false writes <eos> and the others as text."""
    tok = ByteTokenizer()
    pieces = _stream(tok, ids, cuts, skip=skip)
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=skip)
    _no_split_characters(tok, ids, pieces, skip)


def test_special_tokens_as_text_stand_in_place():
    tok = ByteTokenizer()
    assert tok.decode([104, 105, 257, 0xE2, 257], skip_special_tokens=False) == "hi<eos>\ufffd<eos>"


def test_hf_special_tokens_as_text(hf):
    ids = hf.encode("Hello") + list(hf.eos_token_ids)
    assert "".join(_stream(hf, ids, [1, 2], skip=False)) == "Hello<eos>"
    assert "".join(_stream(hf, ids, [1, 2])) == "Hello"


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=60), cuts=st.lists(st.integers(0, 300), max_size=10))
def test_bytes_text_one_byte_at_a_time(text, cuts):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    pieces = _stream(tok, ids, cuts)
    assert "".join(pieces) == text
    assert "\ufffd" not in "".join(pieces) or "\ufffd" in text


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    cuts=st.lists(st.integers(0, 80), max_size=10),
)
def test_hf_random_ids_equal_full_decode(hf, data, cuts):
    vocab = hf._tok.get_vocab_size()
    # special ids decode to nothing: between the bytes of a character they hide its cut
    some = st.integers(0, vocab - 1) | st.sampled_from(hf.eos_token_ids)
    ids = data.draw(st.lists(some, max_size=120))
    pieces = _stream(hf, ids, cuts)
    assert "".join(pieces) == hf.decode(ids)
    _no_split_characters(hf, ids, pieces)


@settings(max_examples=200, deadline=None)
@given(
    # the API refuses unpaired surrogates before encoding (test_openai_schema): not drawn here
    text=st.text(
        st.sampled_from(sorted(set("".join(CORPUS)))) | st.characters(codec="utf-8"), max_size=60
    ),
    cuts=st.lists(st.integers(0, 80), max_size=10),
)
def test_hf_encoded_text_round_trips(hf, text, cuts):
    ids = hf.encode(text)
    pieces = _stream(hf, ids, cuts)
    assert "".join(pieces) == hf.decode(ids)
    if "\ufffd" not in hf.decode(ids):  # pieces are whole characters
        assert all("\ufffd" not in p for p in pieces)


def test_hf_multibyte_split_across_tokens(hf):
    """One id per byte of an emoji: nothing comes out until its last byte."""
    byte_ids = [hf._tok.token_to_id(c) for c in "ðŁĺĢ"]  # ByteLevel's symbols for F0 9F 98 80
    assert None not in byte_ids and hf.decode(byte_ids) == "😀"
    d = detokenizer(hf)
    assert [d.push([i]) for i in byte_ids] == ["", "", "", "😀"]
    assert d.flush() == ""


def test_window_stays_small_behind_invalid_bytes():
    """Ids that keep decoding to U+FFFD (lone continuation bytes) do not grow the window."""
    d = WindowDetokenizer(ByteTokenizer())
    out = "".join(d.push([0x80]) for _ in range(1000)) + d.flush()
    assert out == "\ufffd" * 1000
    assert len(d._ids) - d._prefix < 16


def test_a_character_cut_behind_ids_that_decode_to_nothing(hf):
    """Found by a random search: E1 B3 | <eos> | A9 is one character (U+1CE9); the boundary before
    <eos> looked clean while nothing followed the cut character."""
    eos = hf.eos_token_ids[0]
    sym = {b: hf._tok.token_to_id(c) for b, c in ((0xE1, "á"), (0xB3, "³"), (0xA9, "©"))}
    ids = [hf._tok.token_to_id("ĸ"), hf._tok.token_to_id("Ľ"), sym[0xE1], sym[0xB3], eos, sym[0xA9]]
    assert None not in ids
    d = WindowDetokenizer(hf)
    out = "".join(d.push([i]) for i in ids) + d.flush()
    assert out == hf.decode(ids) and out.endswith("\u1ce9")


LEADS = [0xC3, 0xE1, 0xF0, 0x9F, 0xB3, 0x80, ByteTokenizer.EOS, ByteTokenizer.PAD]


@settings(max_examples=300, deadline=None)
@given(
    ids=st.lists(
        st.integers(0, ByteTokenizer.vocab_size - 1) | st.sampled_from(LEADS), max_size=120
    ),
    cuts=st.lists(st.integers(0, 120), max_size=10),
)
def test_window_over_bytes_equals_full_decode(ids, cuts):
    """The windowed scheme alone (what a tokenizer without its own detokenizer gets)."""
    tok = ByteTokenizer()
    d = WindowDetokenizer(tok)
    pieces, at = [], 0
    for cut in sorted({min(c, len(ids)) for c in cuts}) + [len(ids)]:
        pieces.append(d.push(ids[at:cut]))
        at = cut
    pieces.append(d.flush())
    assert "".join(pieces) == tok.decode(ids)
    _no_split_characters(tok, ids, pieces)


def test_long_output_drops_old_ids(hf):
    text = " ".join(CORPUS) * 60
    ids = hf.encode(text)
    assert len(ids) > 5000
    d = detokenizer(hf)
    out = "".join(d.push([i]) for i in ids) + d.flush()
    assert out == hf.decode(ids)
    assert len(d._ids) <= 4096 + 16
