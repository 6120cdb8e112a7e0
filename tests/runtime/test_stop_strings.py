"""Stop strings over streamed pieces (api.py's StopStrings): wherever the pieces split the text,
what is emitted is the text up to the first stop string, and nothing past it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pddflow.runtime.api.stop_strings import StopStrings

ALPHABET = "ab€😀\n"


def _run(stops: list[str], pieces: list[str]) -> tuple[list[str], bool]:
    s, out = StopStrings(stops), []
    for p in pieces:
        text, hit = s.feed(p)
        out.append(text)
        if hit:
            return out, True
    text, hit = s.feed("", final=True)
    return [*out, text], hit


@settings(max_examples=500, deadline=None)
@given(
    pieces=st.lists(st.text(ALPHABET, max_size=4), max_size=12),
    stops=st.lists(st.text(ALPHABET, min_size=1, max_size=4), max_size=3),
)
def test_emits_the_text_up_to_the_first_stop(pieces, stops):
    out, hit = _run(stops, pieces)
    assert ("".join(out), hit) == _reference(stops, pieces)


def _reference(stops: list[str], pieces: list[str]) -> tuple[str, bool]:
    """The output ends at the first piece whose text completes a stop string, cut where the
    earliest stop string in it begins (overlapping stops: one that completes later does not
    reach back, as in vLLM)."""
    text = ""
    for p in pieces:
        text += p
        cuts = [text.find(s) for s in stops if s in text]
        if cuts:
            return text[: min(cuts)], True
    return text, False


def test_a_stop_split_across_pieces_is_held_back():
    s = StopStrings(["STOP"])
    assert s.feed("abc S") == ("abc ", False)  # "S" may begin the stop string
    assert s.feed("T") == ("", False)
    assert s.feed("OP and more") == ("", True)


def test_held_text_that_is_no_stop_comes_out():
    s = StopStrings(["STOP"])
    assert s.feed("ST") == ("", False)
    assert s.feed("ART") == ("START", False)
    assert s.feed("S") == ("", False)
    assert s.feed("", final=True) == ("S", False)


def test_no_stops_pass_through():
    assert StopStrings([]).feed("anything") == ("anything", False)


def test_include_stop_str_keeps_the_stop_that_ended_the_output():
    """vLLM's include_stop_str_in_output: the earliest stop, and of two found at one place the
    first listed."""
    s = StopStrings(["STOP"], include=True)
    assert s.feed("abc ST") == ("abc ", False)
    assert s.feed("OP more") == ("STOP", True)
    assert StopStrings(["cd", "c"], include=True).feed("abcde") == ("abcd", True)
    assert StopStrings(["c", "cd"], include=True).feed("abcde") == ("abc", True)
