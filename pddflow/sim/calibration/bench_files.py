"""Reading `pddflow bench engine --json` files into `BenchFacts`, and merging several of them."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any


class CalibrationError(ValueError):
    """The message names the file and what is missing."""


@dataclass(frozen=True)
class BenchFacts:
    source: str
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    prompt_tokens: int
    decode_batch: int
    decode_context: int
    arch: str | None
    devices: int
    # (prompt tokens, tokens/s) for every measured size
    prefill_points: tuple[tuple[int, float], ...] = ()
    decode_points: tuple[tuple[int, float], ...] = ()  # (batch, tokens/s)
    threads: int = 1
    extend: tuple[int, int, float] | None = None  # (tokens, context, seconds) of one extend step
    decode_long: tuple[int, int, float] | None = None  # (batch, context, seconds)
    extend_long: tuple[int, int, float] | None = None  # (tokens, context, seconds)
    # (prefill, decode) slowdown while another core decodes
    corun: tuple[float, float] | None = None
    prefill_grid: tuple[tuple[int, int, float], ...] = ()  # (new, cached tokens, seconds)


def numbers(d: Any, keys: tuple[str, ...], positive: bool = False) -> tuple | None:
    """`d`'s `keys` as a tuple (sizes as ints, `_ms` as seconds); None unless all are numbers."""
    if not isinstance(d, dict) or not all(
        isinstance(d.get(k), (int, float)) and (d[k] > 0 or not positive) for k in keys
    ):
        return None
    return tuple(
        int(d[k])
        if k in ("tokens", "context", "batch", "cached")
        else float(d[k]) / 1e3
        if k.endswith("_ms")
        else float(d[k])
        for k in keys
    )


def _walk(obj: Any, path: tuple[str, ...] = ()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, path + (str(k).lower(),))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _walk(v, path + (str(i),))
    else:
        yield path, obj


_RATE = ("tokens_per_s", "tokens_per_sec", "tok_s", "tok_per_s", "tps", "throughput", "tokens/s")


def _find(flat: list, phase: str, words: tuple[str, ...]) -> float | None:
    for path, v in flat:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        key = "/".join(path)
        if phase in key and any(w in key for w in words):
            return float(v)
    return None


def _keyed_rates(section: dict) -> list[tuple[int, float]]:
    return sorted(
        (int(k), float(v["engine_tok_s"]))
        for k, v in section.items()
        if k.isdigit() and isinstance(v, dict) and isinstance(v.get("engine_tok_s"), (int, float))
    )


def _engine_bench_layout(data: Any, path: Path) -> BenchFacts | None:
    """Prefill entries keyed by prompt length, decode entries by batch, each with `engine_tok_s`."""
    if not isinstance(data, dict):
        return None
    pre, dec = data.get("prefill"), data.get("decode")
    if not isinstance(pre, dict) or not isinstance(dec, dict):
        return None
    p_pts, d_pts = _keyed_rates(pre), _keyed_rates(dec)
    if not p_pts or not d_pts:
        return None
    model = data.get("model")
    builtin = isinstance(model, str) and model.startswith("builtin:")
    arch = "tiny-llama" if builtin else data.get("arch")
    threads = data.get("threads")
    if not isinstance(threads, int) or isinstance(threads, bool) or threads <= 0:
        threads = 1
    raw = data["prefill_grid"].get("points") if isinstance(data.get("prefill_grid"), dict) else None
    grid = (
        numbers(g, ("tokens", "cached", "prefill_ms"))
        for g in (raw if isinstance(raw, list) else ())
    )
    return BenchFacts(
        str(path),
        p_pts[-1][1],
        d_pts[0][1],
        p_pts[-1][0],
        d_pts[0][0],
        int(dec.get("context", p_pts[-1][0])),
        arch if isinstance(arch, str) else None,
        1,
        tuple(p_pts),
        tuple(d_pts),
        threads,
        numbers(data.get("extend"), ("tokens", "context", "extend_ms")),
        numbers(data.get("decode_long"), ("batch", "context", "engine_step_ms"), positive=True),
        numbers(data.get("extend_long"), ("tokens", "context", "extend_ms"), positive=True),
        numbers(data.get("corun"), ("prefill_factor", "decode_factor"), positive=True),
        tuple(sorted(g for g in grid if g is not None and g[0] > 0 and g[2] > 0)),
    )


def load_bench(path: str | Path) -> BenchFacts:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CalibrationError(
            f"{path}: not JSON ({exc}); pass the output of `pddflow bench engine --json`"
        ) from None
    facts = _engine_bench_layout(data, path)
    if facts is not None:
        return facts
    flat = list(_walk(data))
    pre = _find(flat, "prefill", _RATE)
    dec = _find(flat, "decode", _RATE)
    missing = [n for n, v in (("prefill", pre), ("decode", dec)) if v is None]
    if missing:
        raise CalibrationError(
            f"{path}: no {' or '.join(missing)} throughput found; expected numbers under keys like "
            f"`prefill.tokens_per_s` and `decode.tokens_per_s` (or `prefill_tokens_per_s`), as "
            f"`pddflow bench engine --json` writes"
        )
    for name, v in (("prefill", pre), ("decode", dec)):
        if not (v > 0 and math.isfinite(v)):
            raise CalibrationError(
                f"{path}: {name} throughput must be a positive number, got {v!r}"
            )
    prompt = _find(flat, "prefill", ("prompt", "input", "seq_len", "tokens_in")) or 512
    batch = _find(flat, "decode", ("batch",)) or 1
    ctx = _find(flat, "decode", ("context", "ctx", "prompt")) or prompt
    arch = next(
        (v for p, v in flat if p and p[-1] in ("arch", "model_arch") and isinstance(v, str)), None
    )
    devices = _find(flat, "", ("devices",)) or 1
    return BenchFacts(
        str(path), pre, dec, int(prompt), max(1, int(batch)), int(ctx), arch, max(1, int(devices))
    )


def is_serve_report(path: str | Path) -> bool:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(data, dict) and isinstance(data.get("graphs"), list) and "workload" in data


def merge(facts: list[BenchFacts]) -> BenchFacts:
    """The median of every point (on a shared machine one run can be 1.5x off the next)."""
    if len(facts) == 1:
        return facts[0]
    med = statistics.median

    def points(attr: str) -> tuple[tuple[int, float], ...]:
        keys = sorted({k for f in facts for k, _ in getattr(f, attr)})
        return tuple(
            (k, med([v for f in facts for k2, v in getattr(f, attr) if k2 == k])) for k in keys
        )

    def tuples(attr: str, keyed: int) -> tuple | None:
        got = [g for f in facts if (g := getattr(f, attr)) is not None]
        if not got:
            return None
        same = [g for g in got if g[:keyed] == got[0][:keyed]]
        return tuple(got[0][:keyed]) + tuple(
            med([g[i] for g in same]) for i in range(keyed, len(got[0]))
        )

    def grid() -> tuple[tuple[int, int, float], ...]:
        shapes = sorted({g[:2] for f in facts for g in f.prefill_grid})
        return tuple(
            (n, c, med([t for f in facts for n2, c2, t in f.prefill_grid if (n2, c2) == (n, c)]))
            for n, c in shapes
        )

    head = facts[0]
    setup = (head.arch, head.devices, head.threads, head.decode_context)
    for f in facts[1:]:
        if (f.arch, f.devices, f.threads, f.decode_context) != setup:
            raise CalibrationError(
                f"{f.source}: measured a different setup than {head.source} (model, devices, "
                f"threads or decode context); merge only calibrations of one configuration"
            )
    pre, dec = points("prefill_points"), points("decode_points")
    p_main = (
        next(v for k, v in pre if k == head.prompt_tokens)
        if pre
        else med([f.prefill_tokens_per_s for f in facts])
    )
    d_main = (
        next(v for k, v in dec if k == head.decode_batch)
        if dec
        else med([f.decode_tokens_per_s for f in facts])
    )
    return replace(
        head,
        source=" + ".join(f.source for f in facts),
        prefill_tokens_per_s=p_main,
        decode_tokens_per_s=d_main,
        prefill_points=pre,
        decode_points=dec,
        extend=tuples("extend", 2),
        decode_long=tuples("decode_long", 2),
        extend_long=tuples("extend_long", 2),
        corun=tuples("corun", 0),
        prefill_grid=grid(),
    )
