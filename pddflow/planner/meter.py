"""What the planner measures between decisions, fed the same way by the runtime's autoscaler and
the simulator's elastic fleet: the prompts arriving at each prefilling pool (uncached tokens, as
the scheduler predicted them) and the sequences each decoding pool holds, over a sliding window."""

from __future__ import annotations

from collections import deque

from pddflow.graph.plan import AutoscalePlan


class Meter:
    def __init__(self, window_s: float):
        self.window_s = window_s
        self._arrivals: dict[str, deque[tuple[float, float]]] = {}  # pool -> (t, work)
        self._held: dict[str, deque[tuple[float, float, float]]] = {}  # pool -> (t, seqs, ctx)
        self._sent: dict[str, deque[tuple[float, float]]] = {}  # link -> (t, bytes sent so far)
        self.started_at: float | None = None

    @classmethod
    def for_autoscale(cls, a: AutoscalePlan) -> Meter:
        """The window the planner judges by: its down stretch, at least two decisions."""
        return cls(max(2 * a.interval_s, a.scale_down_after_s))

    def arrived(self, now: float, pool: str, work: float) -> None:
        """A prompt came to `pool`: `work` to prefill it (uncached tokens, or modeled seconds)."""
        self._start(now)
        self._arrivals.setdefault(pool, deque()).append((now, work))

    def sent(self, now: float, link: str, total_bytes: float) -> None:
        """A sample of the bytes `link` has carried so far."""
        self._start(now)
        self._sent.setdefault(link, deque()).append((now, total_bytes))

    def held(self, now: float, pool: str, sequences: float, context_tokens: float) -> None:
        """A sample of what `pool`'s serving instances hold: sequences, and their context tokens."""
        self._start(now)
        self._held.setdefault(pool, deque()).append((now, sequences, context_tokens))

    def _start(self, now: float) -> None:
        if self.started_at is None:
            self.started_at = now

    def _trim(self, now: float) -> None:
        cut = now - self.window_s
        for q in (*self._arrivals.values(), *self._held.values(), *self._sent.values()):
            while q and q[0][0] < cut:
                q.popleft()

    def span(self, now: float) -> float:
        """The window's length so far (shorter at the start)."""
        start = now if self.started_at is None else self.started_at
        return max(min(self.window_s, now - start), 1e-9)

    def prompt_rate(self, now: float, pool: str) -> float:
        """Prefill work arriving at `pool` per second."""
        self._trim(now)
        return sum(a[1] for a in self._arrivals.get(pool, ())) / self.span(now)

    def link_rate(self, now: float, link: str) -> float:
        """Bytes per second `link` carried over the window's samples."""
        self._trim(now)
        q = self._sent.get(link, ())
        if len(q) < 2 or q[-1][0] <= q[0][0]:
            return 0.0
        return (q[-1][1] - q[0][1]) / (q[-1][0] - q[0][0])

    def link_share(self, now: float, link: str, gbps: float) -> float:
        """`link_rate` over the link's bandwidth."""
        return self.link_rate(now, link) / (gbps * 1e9 / 8)

    def sequences(self, now: float, pool: str) -> tuple[float, float]:
        """The mean sequences held over the window's samples, and their mean context."""
        self._trim(now)
        q = self._held.get(pool, ())
        if not q:
            return 0.0, 0.0
        seqs = sum(h[1] for h in q) / len(q)
        ctx = sum(h[2] for h in q) / max(sum(h[1] for h in q), 1e-9)
        return seqs, ctx
