"""What a router can know of a request's output length before it runs: its max_tokens, and how long
the outputs of recent requests with prompts of about its size were (runtime and simulator feed
this the same way, from finished requests; neither ever reads a request's own true length)."""

from __future__ import annotations

import math
from collections import deque

from pddflow.core.stats import percentile

KEPT = 64  # recent outputs per prompt-size bucket
MIN_SEEN = 8  # fewer outputs than this in a bucket: no estimate yet


class OutputLengths:
    def __init__(self) -> None:
        self.by_size: dict[int, deque[int]] = {}

    @staticmethod
    def _bucket(prompt_tokens: int) -> int:
        """Prompts within a factor of two share a bucket."""
        return int(math.log2(max(prompt_tokens, 1)))

    def finished(self, prompt_tokens: int, output_tokens: int) -> None:
        seen = self.by_size.setdefault(self._bucket(prompt_tokens), deque(maxlen=KEPT))
        seen.append(output_tokens)

    def expected(self, prompt_tokens: int, max_tokens: int = 0) -> int | None:
        """The P90 of recent outputs for this prompt size (a singular request whose answer runs
        long decodes all of it on the relay: only reliably short ones qualify), capped by
        `max_tokens` (0: not given);
        with no estimate yet, `max_tokens` itself, or None when that is not given either."""
        seen = self.by_size.get(self._bucket(prompt_tokens))
        if seen is None or len(seen) < MIN_SEEN:
            return max_tokens or None
        p90 = int(percentile(sorted(seen), 90))
        return min(p90, max_tokens) if max_tokens else p90
