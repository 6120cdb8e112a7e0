"""Grammar engines for structured output, side by side on one tokenizer and one JSON schema: the
one pddflow uses (llguidance) against xgrammar and outlines-core, each where it is installed
(`pip install xgrammar outlines-core`; neither is a pddflow dependency). Per engine: building its
view of the tokenizer, compiling a schema it has not seen (what a request with a new schema
waits for), and the per-token cost of a mask plus advancing by the sampled token along a valid
document. The tokenizer is a byte-level BPE trained here on this Python's standard library
sources (no download), at --vocab tokens, so the masks run over a realistic vocabulary.

    python benchmarks/grammar_engines.py [--vocab 32000] [--reps 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pddflow.testing.tiny_checkpoints import write_tokenizer

SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "units": {"enum": ["metric", "imperial"]},
        },
        "required": ["city", "days", "units"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"}},
                    "required": ["id", "ok"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["items"],
        "additionalProperties": False,
    },
]
DOCUMENT = {"name": "Ada Lovelace, analyst", "age": 36, "tags": ["math", "engines", "notes"]}


def train_tokenizer(vocab: int, into: Path) -> Path:
    """A byte-level BPE over the standard library's sources: tokenizer.json in `into`."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:400]
    corpus = (f.read_text(errors="replace") for f in files)
    write_tokenizer(into, ["<|endoftext|>"], vocab, corpus=corpus)
    return into / "tokenizer.json"


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1e3, out


def llguidance_engine(path: Path, vocab: int):
    import llguidance as lg
    import numpy as np

    tok = lg.LLTokenizer(str(path), n_vocab=vocab, eos_token=[0])

    def compile_(schema: dict) -> Any:
        g = lg.grammar_from("json_schema", json.dumps(schema))
        m = lg.LLMatcher(tok, g, log_level=0)
        m.compute_bitmask()  # the first mask is where llguidance does its work
        return m

    def step(m: Any, token: int) -> None:
        np.frombuffer(m.compute_bitmask(), dtype=np.uint8)
        m.consume_token(token)

    return compile_, step


def xgrammar_engine(path: Path, vocab: int):
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token="<|endoftext|>")
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab)
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    bitmask = xgr.allocate_token_bitmask(1, vocab)

    def compile_(schema: dict) -> Any:
        return xgr.GrammarMatcher(compiler.compile_json_schema(json.dumps(schema)))

    def step(m: Any, token: int) -> None:
        m.fill_next_token_bitmask(bitmask)
        m.accept_token(token)

    return compile_, step


def outlines_engine(path: Path, vocab: int):
    import numpy as np
    import outlines_core as oc
    from outlines_core.json_schema import build_regex_from_schema
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    table: dict[str, list[int]] = {}
    for token, i in tok.get_vocab().items():
        if token != "<|endoftext|>":
            table.setdefault(token, []).append(i)
    vocabulary = oc.Vocabulary(0, table)
    mask = np.zeros((vocab + 31) // 32, dtype=np.int32)  # a bitmask, as the others fill

    def compile_(schema: dict) -> Any:
        return oc.Guide(oc.Index(build_regex_from_schema(json.dumps(schema)), vocabulary))

    def step(g: Any, token: int) -> None:
        g.write_mask_into(mask.ctypes.data, mask.size, 4)
        g.advance(token)

    return compile_, step


ENGINES = {
    "llguidance": llguidance_engine,
    "xgrammar": xgrammar_engine,
    "outlines-core": outlines_engine,
}


def measure(name: str, path: Path, vocab: int, doc: list[int], reps: int) -> dict[str, Any]:
    try:
        setup_ms, (compile_, step) = timed(lambda: ENGINES[name](path, vocab))
    except ImportError as exc:
        return {"engine": name, "skipped": f"not installed ({exc.name})"}
    compiles = []
    for _ in range(reps):
        for schema in SCHEMAS:
            ms, _ = timed(lambda s=schema: compile_(s))
            compiles.append(ms)
    per_token = []
    for _ in range(reps):
        matcher = compile_(SCHEMAS[0])
        for token in doc:
            ms, _ = timed(lambda m=matcher, t=token: step(m, t))
            per_token.append(ms)
    return {
        "engine": name,
        "tokenizer_ms": round(setup_ms, 1),
        "compile_ms_p50": round(statistics.median(compiles), 3),
        "compile_ms_max": round(max(compiles), 3),
        "token_ms_p50": round(statistics.median(per_token), 4),
        "token_ms_p90": round(statistics.quantiles(per_token, n=10)[-1], 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from tokenizers import Tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        path = train_tokenizer(args.vocab, Path(tmp))
        tok = Tokenizer.from_file(str(path))
        vocab = tok.get_vocab_size()
        doc = tok.encode(json.dumps(DOCUMENT, separators=(",", ":"))).ids
        rows = [measure(name, path, vocab, doc, args.reps) for name in ENGINES]
    out = {"vocab": vocab, "document_tokens": len(doc), "engines": rows}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"byte-level BPE of {vocab} tokens; a {len(doc)}-token document; ms:")
    for r in rows:
        if "skipped" in r:
            print(f"  {r['engine']:14s} skipped: {r['skipped']}")
            continue
        print(
            f"  {r['engine']:14s} tokenizer {r['tokenizer_ms']:8.1f}  compile P50 "
            f"{r['compile_ms_p50']:8.3f} (max {r['compile_ms_max']:.3f})  per token P50 "
            f"{r['token_ms_p50']:.4f} P90 {r['token_ms_p90']:.4f}"
        )


if __name__ == "__main__":
    sys.exit(main())
