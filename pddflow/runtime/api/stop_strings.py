"""Stop strings over streamed text."""

from __future__ import annotations


class StopStrings:
    """Stop strings over streamed text, at a cost per piece set by the stop strings, not by the
    text so far: text that could be the start of a stop string is held back until it is not."""

    def __init__(self, stops: list[str], include: bool = False):
        self.stops = stops
        self.include = include  # vLLM's include_stop_str_in_output: the text ends with the stop
        self.held = ""
        # every proper prefix of a stop string, longest first, and the characters they end with
        self._starts = sorted({s[:k] for s in stops for k in range(1, len(s))}, key=len)[::-1]
        self._last_chars = {p[-1] for p in self._starts}

    def feed(self, piece: str, final: bool = False) -> tuple[str, bool]:
        """(text to emit, whether a stop string ended the output); `final`: no more text comes."""
        if not self.stops:
            return piece, False
        text = self.held + piece
        # the earliest match (the first stop listed, of those found there)
        found = min(
            ((i, k) for k, i in enumerate(text.find(s) for s in self.stops) if i >= 0), default=None
        )
        if found is not None:
            cut, k = found
            self.held = ""
            return text[: cut + (len(self.stops[k]) if self.include else 0)], True
        keep = 0 if final else self._partial(text)
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], False

    def _partial(self, text: str) -> int:
        """The longest end of `text` that begins some stop string."""
        if not text or text[-1] not in self._last_chars:
            return 0
        return next((len(p) for p in self._starts if text.endswith(p)), 0)
