"""Streamed detokenization per token over one output of --tokens tokens: the incremental
detokenizer (pddflow/operators/detokenize.py) beside the old `_Utf8Stream`, which re-decoded the
whole output at every token (kept here as the baseline), for the byte tokenizer and a byte-level
BPE `tokenizer.json` trained here on a small multilingual corpus (no download); and both again
with one stop string that never matches (the old check searched the whole text at every token).
Median per-token cost over --reps runs; the runners alternate rep by rep.

    python benchmarks/detokenize.py [--tokens 4096] [--reps 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from pddflow.operators.detokenize import detokenizer
from pddflow.operators.tokenizer import ByteTokenizer, HFTokenizer
from pddflow.runtime.api.stop_strings import StopStrings
from pddflow.testing.tiny_checkpoints import write_tokenizer

CORPUS = [
    "The relay decodes while the KV crosses the WAN; main extends over the handed-off ids.",
    "naïve café, crème brûlée: déjà vu — 100 € or ¥ or £, Größe und Maß.",
    "中文的句子，日本語の文章、한국어 문장. Привет, мир! Γειά σου κόσμε.",
    "emoji 😀😃🚀 and math ∑∫√∞ ≠ ≤, code: def f(x): return x ** 2  # squared",
]
STOP = "<|never|>"


class OldUtf8Stream:
    """api.py's streamed decoder until 2026-12-03: the whole output decoded at every token."""

    def __init__(self, tok):
        self.tok, self.ids, self.sent = tok, [], ""

    def push(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        text = self.tok.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        new, self.sent = text[len(self.sent) :], text
        return new

    def flush(self) -> str:
        text = self.tok.decode(self.ids)
        new, self.sent = text[len(self.sent) :], text
        return new


class OldStop:
    """The old check: the stop strings searched for in the whole text so far, at every piece."""

    def __init__(self, stops: list[str]):
        self.stops, self.text = stops, ""

    def feed(self, piece: str) -> None:
        text = self.text + piece
        min((text.find(s) for s in self.stops if s in text), default=-1)
        self.text = text


def hf_tokenizer(tmp: Path) -> HFTokenizer:
    write_tokenizer(tmp, [], 1000, corpus=CORPUS * 50)
    return HFTokenizer(tmp / "tokenizer.json")


def run(make, ids: list[int], stop: bool, new: bool) -> tuple[float, str]:
    """Seconds per token (the whole stream over its tokens), and the text."""
    d = make()
    pieces = []
    s = (StopStrings([STOP]) if new else OldStop([STOP])) if stop else None
    t = time.perf_counter()
    for i in ids:
        p = d.push([i])
        if s is not None:
            s.feed(p)
        pieces.append(p)
    pieces.append(d.flush())
    return (time.perf_counter() - t) / len(ids), "".join(pieces)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        toks = {"bytes": ByteTokenizer(), "hf byte-level BPE": hf_tokenizer(Path(tmp))}
        rows = []
        for tname, tok in toks.items():
            text, ids = " ".join(CORPUS), []
            while len(ids) < a.tokens:
                ids += [i for i in tok.encode(text) if i not in (ByteTokenizer.BOS,)]
                text += " " + text
            ids = ids[: a.tokens]
            for stop in (False, True):
                runners = {
                    "old": lambda tok=tok: OldUtf8Stream(tok),
                    "new": lambda tok=tok: detokenizer(tok),
                }
                times: dict[str, list[float]] = {k: [] for k in runners}
                texts = {}
                for _ in range(a.reps):
                    for k, make in runners.items():
                        per_token, texts[k] = run(make, ids, stop, new=k == "new")
                        times[k].append(per_token)
                assert texts["old"] == texts["new"] == tok.decode(ids), tname
                old, new = (statistics.median(times[k]) for k in ("old", "new"))
                rows.append(
                    {
                        "tokenizer": tname,
                        "stop_string": stop,
                        "tokens": len(ids),
                        "old_us_per_token": round(old * 1e6, 2),
                        "new_us_per_token": round(new * 1e6, 2),
                        "old_s_per_output": round(old * len(ids), 4),
                        "new_s_per_output": round(new * len(ids), 4),
                        "ratio_old_over_new": round(old / new, 1),
                    }
                )
    if a.json:
        print(json.dumps({"reps": a.reps, "rows": rows}, indent=2))
        return
    print(f"{'tokenizer':<18} {'stop':<5} {'old us/tok':>11} {'new us/tok':>11} {'old/new':>8}")
    for r in rows:
        print(
            f"{r['tokenizer']:<18} {r['stop_string']!s:<5} {r['old_us_per_token']:>11} "
            f"{r['new_us_per_token']:>11} {r['ratio_old_over_new']:>8}"
        )


if __name__ == "__main__":
    main()
