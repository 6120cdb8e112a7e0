"""The `bench serve --json --per-request` figures the deployment calibration uses: `ServeFacts`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path

from pddflow.sim.calibration.bench_files import CalibrationError, numbers


def graph_key(source: str | Path) -> str:
    """A report and a simulated plan name the same graph by its file's stem."""
    return Path(str(source)).stem


@dataclass(frozen=True)
class ServeFacts:
    source: str
    prefills: tuple[tuple[int, int, float], ...] = ()  # (prompt tokens, cached tokens, CPU s)
    # each decoding worker's decode steps: (steps, CPU seconds, sequences, context tokens)
    decode: tuple[tuple[int, float, int, int], ...] = ()
    # seconds per byte a prefill worker spent exporting a prefill's KV before its next prefill
    shipping: tuple[float, ...] = ()
    # (instance, wall seconds, CPU seconds) of each prefill
    prefill_wall: tuple[tuple[str, float, float], ...] = ()

    @staticmethod
    def pooled(facts: list[ServeFacts]) -> ServeFacts:
        merged = {"source": " + ".join(f.source for f in facts)}
        for name in (fld.name for fld in fields(ServeFacts) if fld.name != "source"):
            rows = [x for f in facts for x in getattr(f, name)]
            merged[name] = tuple(sorted(rows) if name == "shipping" else rows)
        return ServeFacts(**merged)

    def prefill_wall_ratios(self) -> dict[str, float]:
        return _wall_over_cpu(self.prefill_wall)


def _wall_over_cpu(rows: tuple[tuple[str, float, float], ...]) -> dict[str, float]:
    """Per instance: the sum of its wall seconds over the sum of its CPU seconds."""
    acc: dict[str, list[float]] = {}
    for inst, w, c in rows:
        a = acc.setdefault(inst, [0.0, 0.0])
        a[0], a[1] = a[0] + w, a[1] + c
    return {i: w / c for i, (w, c) in acc.items() if c > 0 and w > 0}


@dataclass
class _Graph:
    sources: list[str] = field(default_factory=list)
    prefills: list[tuple[int, int, float]] = field(default_factory=list)
    decode: list[tuple[int, float, int, int]] = field(default_factory=list)
    shipping: list[float] = field(default_factory=list)
    prefill_wall: list[tuple[str, float, float]] = field(default_factory=list)

    def facts(self) -> ServeFacts:
        return ServeFacts(
            " + ".join(sorted(set(self.sources))),
            tuple(self.prefills),
            tuple(self.decode),
            tuple(sorted(self.shipping)),
            tuple(self.prefill_wall),
        )


def load_serve(paths: list[Path]) -> dict[str, ServeFacts]:
    graphs: dict[str, _Graph] = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        for g in data["graphs"]:
            if not isinstance(g, dict) or not isinstance(g.get("graph"), str):
                continue
            acc = graphs.setdefault(graph_key(g["graph"]), _Graph())
            acc.sources.append(str(path))
            _read_decode_steps(g.get("decode_steps"), acc)
            rows = g.get("per_request")
            for r in rows if isinstance(rows, list) else ():
                if isinstance(r, dict) and isinstance(r.get("prompt_tokens"), int):
                    _read_request(r, acc)
    if not any(a.prefills for a in graphs.values()):
        raise CalibrationError(
            f"{', '.join(map(str, paths))}: no per-request prefill times; "
            f"pass `pddflow bench serve --json --per-request` output of this version"
        )
    return {k: a.facts() for k, a in graphs.items()}


def _read_decode_steps(steps: object, acc: _Graph) -> None:
    for d in steps.values() if isinstance(steps, dict) else ():
        got = numbers(d, ("steps", "cpu_s", "seqs", "context_tokens"))
        if got is not None:
            acc.decode.append((int(got[0]), got[1], int(got[2]), int(got[3])))


def _read_request(r: dict, acc: _Graph) -> None:
    # the prefill's first send to each receiving instance (a resend after a failure comes later)
    sends: dict[str, dict] = {}
    for e in r.get("events") or ():
        if isinstance(e, dict) and e.get("event") == "kv_send":
            sends.setdefault(str(e.get("peer", "")), e)
    send = next(iter(sends.values()), None)
    got = numbers(send, ("prefill_cpu_ms", "cached_tokens"))
    if got is not None:
        acc.prefills.append((r["prompt_tokens"], got[1], got[0]))
        wall = numbers(send, ("prefill_ms",))
        if wall is not None and isinstance(send.get("instance"), str):
            acc.prefill_wall.append((send["instance"], wall[0], got[0]))
    times = [t for e in sends.values() if (t := numbers(e, ("t_ms", "export_ms", "bytes")))]
    sent = sum(b for _, _, b in times)
    if sent > 0:  # the prefill ended one export before its first send
        t0, export0, _ = min(times)
        acc.shipping.append((max(t for t, _, _ in times) - (t0 - export0)) / sent)
