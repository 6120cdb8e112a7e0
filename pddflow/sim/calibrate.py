"""Calibration: fit `pddflow bench engine --json` measurements into a device class.

The benchmark reports prefill and decode throughput (tokens/s) of the engine on this machine. The
fit finds the *achieved* FLOP/s that reproduces the prefill figure and the *achieved* memory
bandwidth that reproduces the decode figure under the roofline of device.py, and writes them as a
DeviceClass to be used with unit efficiencies (no MFU/MBU discount: they are already achieved). A
simulated embedded deployment (the graph's `local` profile, every device class replaced) can then
be compared with `pddflow bench serve` on the real one.

A `pddflow bench serve --json --per-request` report adds what only the deployment itself shows
(`load_serve`, `Calibration.for_graph`): its prefills' CPU time against this fit, and the frontend's
and client's CPU per streamed token.

Key names are matched loosely so the benchmark's exact layout can evolve: a number whose key path
mentions `prefill` and tokens per second (`tokens_per_s`, `tok_s`, `tps`, `throughput`), and the
same for `decode`. Optional context: prompt length (`prompt`/`input` tokens) for prefill, `batch`
and `context` for decode, `arch` naming a model-architecture preset, `devices`.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from pddflow.core.arch import ARCHS, ModelArch
from pddflow.core.device import LOCAL_KV_CACHE_MIB, DeviceClass
from pddflow.core.stats import percentile
from pddflow.graph.plan import Plan, _instances
from pddflow.sim.device import DeviceModel, Efficiency
from pddflow.sim.simulator import QUEUED_S

UNIT = Efficiency(prefill_mfu=1.0, decode_mbu=1.0, step_overhead_s=0.0)
MIN_SERVE_PREFILLS = 5  # fewer prefills in a bench serve file: its host factor is not used


class CalibrationError(ValueError):
    """A benchmark file that cannot be fitted; the message names the file and what is missing."""


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
    prefill_points: tuple[
        tuple[int, float], ...
    ] = ()  # (prompt tokens, tokens/s) for every measured size
    decode_points: tuple[tuple[int, float], ...] = ()  # (batch, tokens/s)
    threads: int = 1  # CPU threads the benchmark ran with (`threads`)
    extend: tuple[int, int, float] | None = None  # (tokens, context, seconds) of one extend step
    # (batch, context, seconds) of one long-context decode step
    decode_long: tuple[int, int, float] | None = None
    # (tokens, context, seconds): new tokens over a long cached context
    extend_long: tuple[int, int, float] | None = None
    # (prefill, decode) slowdown while another core decodes
    corun: tuple[float, float] | None = None
    prefill_grid: tuple[
        tuple[int, int, float], ...
    ] = ()  # (new tokens, cached tokens, seconds) of prompts over a cached prefix


@dataclass(frozen=True)
class ServeFacts:
    """What `pddflow bench serve --json --per-request` measured of one graph's embedded deployment:
    the serving path's CPU besides the workers (frontend process and client) per streamed token,
    and every prefill's CPU time with its prompt and cached tokens."""

    source: str
    cpu_per_token_s: float | None  # frontend + client CPU seconds per output token
    prefills: tuple[tuple[int, int, float], ...] = ()  # (prompt tokens, cached tokens, CPU seconds)
    # seconds from a prefill's end to its KV delivered to a same-host decoder (export, then the
    # rdma_tensor send to the relay): the KV copy and both processes' threads on busy cores
    handovers: tuple[float, ...] = ()
    # each decoding worker's decode steps over the run: (steps, CPU seconds, sequences, context tokens)
    decode: tuple[tuple[int, float, int, int], ...] = ()
    # seconds per byte the prefill worker spent shipping each prefill's KV (exporting every copy)
    # before its loop could start the next prefill: from the prefill's end to its last kv_send, over
    # the bytes of its sends (a 180 MB prompt took 0.8 s here, a 7 MB one 1-90 ms)
    shipping: tuple[float, ...] = ()
    # per decoding worker: (instance, wall seconds of the loop iterations that ran decode steps, their
    # CPU seconds); wall over CPU is what the host and the worker's other threads add to a step
    decode_wall: tuple[tuple[str, float, float], ...] = ()
    # the handovers of prefills that had queued (waited QUEUED_S or more): on a busy host the copy
    # to the relay is slower (median 17 against 11 ms here, P90 130 against 77 ms)
    handovers_queued: tuple[float, ...] = ()
    # per prefill: (instance, its wall seconds, its CPU seconds); wall over CPU is what the host
    # (the relay decoding beside it, the frontend, the channels' threads) adds to a prefill
    prefill_wall: tuple[tuple[str, float, float], ...] = ()
    # per request, seconds the serving path adds outside the workers: the client's request to the
    # frontend and on to the prefill worker (frontend arrival to the job at the worker: the
    # prefill's start less its queued_ms), and the first token from the frontend to the client
    serving_latency: tuple[float, ...] = ()

    def decode_wall_ratios(self) -> dict[str, float]:
        """Each decoding instance's decode wall time over its CPU time, over every run measured."""
        return _wall_over_cpu(self.decode_wall)

    def prefill_wall_ratios(self) -> dict[str, float]:
        """Each prefilling instance's prefill wall time over its CPU time, over every prefill measured."""
        return _wall_over_cpu(self.prefill_wall)


def _wall_over_cpu(rows: tuple[tuple[str, float, float], ...]) -> dict[str, float]:
    """Per instance: the sum of its wall seconds over the sum of its CPU seconds."""
    acc: dict[str, list[float]] = {}
    for inst, w, c in rows:
        a = acc.setdefault(inst, [0.0, 0.0])
        a[0], a[1] = a[0] + w, a[1] + c
    return {i: w / c for i, (w, c) in acc.items() if c > 0 and w > 0}


SIZE_TREND_SPAN = 8  # new-token sizes spanning less than this factor: no size trend
SIZE_TREND_BOUNDS = (-0.3, 0.3)


def _size_trend(shapes: list[tuple[float, float]]) -> tuple[float, float]:
    """How a deployment's measured prefills drift from the fitted model with their size: the
    least-squares slope of log(measured / model) on log(new tokens), and the geometric mean size
    it pivots on. The engine benchmark fits prompts up to 512 tokens; here the 2,708-token prompt
    of the serve workload measured 0.87x the median ratio in every run: a third longer prefill in
    the replay without it (and the P90 of a closed loop waits behind it)."""
    pts = [(math.log(n), math.log(r)) for n, r in shapes if n > 0 and r > 0]
    xs = [x for x, _ in pts]
    if len(pts) < MIN_SERVE_PREFILLS or max(xs) - min(xs) < math.log(SIZE_TREND_SPAN):
        return 0.0, 1.0
    mx, my = statistics.fmean(xs), statistics.fmean(y for _, y in pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x in xs)
    lo, hi = SIZE_TREND_BOUNDS
    return min(hi, max(lo, slope)), math.exp(mx)


def graph_key(source: str | Path) -> str:
    """How a bench serve report and a simulated plan name the same graph: its file's stem."""
    return Path(str(source)).stem


@dataclass(frozen=True)
class Calibration:
    facts: BenchFacts
    device: DeviceClass
    arch: ModelArch
    efficiency: Efficiency = UNIT
    serve: ServeFacts | None = None
    # deployment prefill CPU / the engine benchmark's (from `serve`)
    prefill_host_factor: float = 1.0
    prefill_spread: tuple[float, ...] = ()  # each measured prefill over the scaled model (median 1)
    # deployment decode-step CPU / the engine benchmark's (from `serve`)
    decode_host_factor: float = 1.0
    # (exponent, reference new tokens): a deployment prefill of n new tokens costs (n / ref) **
    # exponent times the scaled model besides its drawn spread (`_size_trend`)
    prefill_size_trend: tuple[float, float] = (0.0, 1.0)

    @property
    def relay_handovers(self) -> tuple[float, ...]:
        return self.serve.handovers if self.serve is not None else ()

    @property
    def relay_handovers_queued(self) -> tuple[float, ...]:
        return self.serve.handovers_queued if self.serve is not None else ()

    @property
    def prefill_shipping(self) -> tuple[float, ...]:
        return self.serve.shipping if self.serve is not None else ()

    @property
    def decode_wall_ratios(self) -> dict[str, float]:
        return self.serve.decode_wall_ratios() if self.serve is not None else {}

    @property
    def prefill_wall_ratios(self) -> dict[str, float]:
        return self.serve.prefill_wall_ratios() if self.serve is not None else {}

    @property
    def serving_latency_s(self) -> float:
        """The median measured serving-path latency (a few ms; its median, as reports from before
        queued_ms counted from the job's arrival overstate it for queued prefills)."""
        lat = self.serve.serving_latency if self.serve is not None else ()
        return statistics.median(lat) if lat else 0.0

    @property
    def serving_cpu_per_token_s(self) -> float:
        return (self.serve.cpu_per_token_s or 0.0) if self.serve is not None else 0.0

    def for_graph(self, serve: dict[str, ServeFacts] | None, graph: str | Path) -> Calibration:
        """This calibration inside `graph`'s deployment: its own bench serve facts when `serve`
        measured that graph, else every measured graph's pooled."""
        if not serve:
            return self
        mine = serve.get(graph_key(graph))
        if mine is None:
            tokens = [f.cpu_per_token_s for f in serve.values() if f.cpu_per_token_s is not None]
            mine = ServeFacts(
                " + ".join(f.source for f in serve.values()),
                statistics.median(tokens) if tokens else None,
                tuple(p for f in serve.values() for p in f.prefills),
                tuple(sorted(h for f in serve.values() for h in f.handovers)),
                tuple(d for f in serve.values() for d in f.decode),
                tuple(sorted(x for f in serve.values() for x in f.shipping)),
                tuple(d for f in serve.values() for d in f.decode_wall),
                tuple(sorted(h for f in serve.values() for h in f.handovers_queued)),
                tuple(p for f in serve.values() for p in f.prefill_wall),
                tuple(sorted(x for f in serve.values() for x in f.serving_latency)),
            )
        return self.with_serve(mine)

    def with_serve(self, serve: ServeFacts) -> Calibration:
        """This calibration inside the deployment: every prefill-like cost (FLOP/s, the prefill and
        extend calls' fixed costs) scaled by the median of the deployment's prefill CPU over what
        this fit predicts for the same prompt and cached tokens. The engine benchmark runs alone;
        in the deployment the same prefill also shares caches and memory with the other workers,
        the frontend and the KV channels' threads (1.04-1.28x here, docs/simulator.md). Decode
        steps (bandwidth, per-sequence cost) scale by the decoders' measured step CPU over what
        the fit predicts for the same steps. The measured spread around the prefill median and the
        relay handovers stay in `serve` for the replay."""
        m = DeviceModel(self.device, self.facts.devices, self.arch, self.efficiency)
        shapes = [(p - c, cpu / m.prefill_s(p - c, c)) for p, c, cpu in serve.prefills if p > c]
        enough = len(shapes) >= MIN_SERVE_PREFILLS
        exponent, ref = _size_trend(shapes)  # (none from fewer than MIN_SERVE_PREFILLS)
        ratios = [r / (n / ref) ** exponent for n, r in shapes]  # the size trend taken out
        f = statistics.median(ratios) if enough else 1.0
        spread = tuple(sorted(round(r / f, 4) for r in ratios)) if enough else ()
        # decode steps, memory-bound on these engines: weights + the context's KV at the fitted
        # bandwidth, plus the per-sequence cost; their CPU in the deployment over that
        model_s = sum(
            n * (m.wt / m.bytes_s + m.ovh) + ctx * m.kvb / m.bytes_s + seqs * m.seq_ovh
            for n, _, seqs, ctx in serve.decode
        )
        fd = sum(cpu for _, cpu, _, _ in serve.decode) / model_s if model_s > 0 else 1.0
        eff = self.efficiency
        eff = replace(
            eff,
            job_overhead_s=eff.job_overhead_s * f,
            seq_overhead_s=eff.seq_overhead_s * fd,
            extend_overhead_s=None if eff.extend_overhead_s is None else eff.extend_overhead_s * f,
        )
        device = replace(
            self.device, tflops=self.device.tflops / f, hbm_tbps=self.device.hbm_tbps / fd
        )
        return replace(
            self,
            device=device,
            efficiency=eff,
            serve=serve,
            prefill_host_factor=f,
            prefill_spread=spread,
            decode_host_factor=fd,
            prefill_size_trend=(exponent, ref),
        )

    def to_dict(self) -> dict:
        d, f = self.device, self.facts
        m = DeviceModel(d, f.devices, self.arch, self.efficiency)
        return {
            "source": f.source,
            "arch": self.arch.name,
            "prefill_tokens_per_s": f.prefill_tokens_per_s,
            "decode_tokens_per_s": f.decode_tokens_per_s,
            "achieved_tflops": round(d.tflops * f.devices, 6),
            "achieved_hbm_tbps": round(d.hbm_tbps * f.devices, 6),
            "step_overhead_ms": round(self.efficiency.step_overhead_s * 1e3, 3),
            "seq_overhead_ms": round(self.efficiency.seq_overhead_s * 1e3, 3),
            "prefill_overhead_ms": round(self.efficiency.job_overhead_s * 1e3, 3),
            "extend_overhead_ms": None
            if self.efficiency.extend_overhead_s is None
            else round(self.efficiency.extend_overhead_s * 1e3, 3),
            # every measured point against the fitted model: how well two numbers explain them
            "prefill_check": {
                str(n): {"measured": v, "model": round(m.prefill_tokens_per_s(n), 1)}
                for n, v in f.prefill_points
            },
            "prefill_grid_check": [
                {
                    "tokens": n,
                    "cached": c,
                    "measured_ms": round(t * 1e3, 2),
                    "model_ms": round(m.prefill_s(n, c) * 1e3, 2),
                }
                for n, c, t in f.prefill_grid
            ],
            "attn_factor": round(self.efficiency.attn_factor, 3),
            "extend_long_check": None
            if f.extend_long is None
            else {
                "tokens": f.extend_long[0],
                "context": f.extend_long[1],
                "measured_ms": round(f.extend_long[2] * 1e3, 2),
                "model_ms": round(m.extend_s(f.extend_long[0], f.extend_long[1]) * 1e3, 2),
            },
            "kv_read_factor": round(self.efficiency.kv_read_factor, 3),
            "deployment": None
            if self.serve is None
            else {
                "source": self.serve.source,
                "prefills": len(self.serve.prefills),
                "prefill_host_factor": round(self.prefill_host_factor, 4),
                "decode_host_factor": round(self.decode_host_factor, 4),
                "decode_steps": sum(d[0] for d in self.serve.decode),
                "prefill_size_trend": {
                    "exponent": round(self.prefill_size_trend[0], 4),
                    "ref_new_tokens": round(self.prefill_size_trend[1], 1),
                },
                "prefill_spread": {
                    q: round(percentile(list(self.prefill_spread), q * 100), 3)
                    for q in (0.1, 0.5, 0.9)
                }
                if self.prefill_spread
                else None,
                "relay_handover_ms": {
                    q: round(percentile(list(self.serve.handovers), q * 100) * 1e3, 1)
                    for q in (0.1, 0.5, 0.9)
                }
                if self.serve.handovers
                else None,
                "relay_handover_queued_ms": {
                    q: round(percentile(list(self.serve.handovers_queued), q * 100) * 1e3, 1)
                    for q in (0.1, 0.5, 0.9)
                }
                if self.serve.handovers_queued
                else None,
                "prefill_shipping_ms_per_mb": {
                    q: round(percentile(list(self.serve.shipping), q * 100) * 1e9, 3)
                    for q in (0.1, 0.5, 0.9)
                }
                if self.serve.shipping
                else None,
                "decode_wall_over_cpu": {
                    i: round(r, 4) for i, r in sorted(self.decode_wall_ratios.items())
                }
                or None,
                "prefill_wall_over_cpu": {
                    i: round(r, 4) for i, r in sorted(self.prefill_wall_ratios.items())
                }
                or None,
                "serving_latency_ms": {
                    q: round(percentile(list(self.serve.serving_latency), q * 100) * 1e3, 2)
                    for q in (0.1, 0.5, 0.9)
                }
                if self.serve.serving_latency
                else None,
                "serving_cpu_ms_per_token": None
                if self.serve.cpu_per_token_s is None
                else round(self.serve.cpu_per_token_s * 1e3, 4),
            },
            "corun": None
            if f.corun is None
            else {"prefill_factor": f.corun[0], "decode_factor": f.corun[1]},
            "decode_check": {
                str(b): {
                    "measured": v,
                    "model": round(m.decode_tokens_per_s(b, f.decode_context), 1),
                }
                for b, v in f.decode_points
            },
            "decode_long_check": None
            if f.decode_long is None
            else {
                "batch": f.decode_long[0],
                "context": f.decode_long[1],
                "measured_step_ms": round(f.decode_long[2] * 1e3, 2),
                "model_step_ms": round(
                    m.decode_step_s(f.decode_long[0], f.decode_long[0] * f.decode_long[1]) * 1e3, 2
                ),
            },
        }


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


def _engine_bench_layout(data: Any, path: Path) -> BenchFacts | None:
    """The layout `pddflow bench engine --json` writes: prefill entries keyed by prompt length and
    decode entries keyed by batch, each with `engine_tok_s`; decode has its `context`. The longest
    prompt (most compute-bound) and the smallest batch (memory-bound) are fitted; the others are
    reported as checks."""
    if not isinstance(data, dict):
        return None
    pre, dec = data.get("prefill"), data.get("decode")
    if not isinstance(pre, dict) or not isinstance(dec, dict):
        return None
    p_pts = sorted(
        (int(k), float(v["engine_tok_s"]))
        for k, v in pre.items()
        if k.isdigit() and isinstance(v, dict) and isinstance(v.get("engine_tok_s"), (int, float))
    )
    d_pts = sorted(
        (int(k), float(v["engine_tok_s"]))
        for k, v in dec.items()
        if k.isdigit() and isinstance(v, dict) and isinstance(v.get("engine_tok_s"), (int, float))
    )
    if not p_pts or not d_pts:
        return None
    model = data.get("model")
    arch = (
        "tiny-llama"
        if isinstance(model, str) and model.startswith("builtin:")
        else data.get("arch")
    )
    ctx = dec.get("context", p_pts[-1][0])
    threads = data.get("threads")
    threads = (
        int(threads)
        if isinstance(threads, int) and not isinstance(threads, bool) and threads > 0
        else 1
    )
    extend = _entry(data, "extend", ("tokens", "context", "extend_ms"), positive=False)
    long_pt = _entry(data, "decode_long", ("batch", "context", "engine_step_ms"))
    ext_long = _entry(data, "extend_long", ("tokens", "context", "extend_ms"))
    corun = _entry(data, "corun", ("prefill_factor", "decode_factor"))
    raw = data["prefill_grid"].get("points") if isinstance(data.get("prefill_grid"), dict) else None
    grid = (
        (_fields(g, ("tokens", "cached", "prefill_ms")) for g in raw)
        if isinstance(raw, list)
        else ()
    )
    grid_pts = tuple(sorted(g for g in grid if g is not None and g[0] > 0 and g[2] > 0))
    return BenchFacts(
        str(path),
        p_pts[-1][1],
        d_pts[0][1],
        p_pts[-1][0],
        d_pts[0][0],
        int(ctx),
        arch if isinstance(arch, str) else None,
        1,
        tuple(p_pts),
        tuple(d_pts),
        threads,
        extend,
        long_pt,
        ext_long,
        corun,
        grid_pts,
    )


def _entry(data: dict, key: str, fields: tuple[str, ...], positive: bool = True) -> tuple | None:
    """`data[key]`'s `fields` (`_fields`)."""
    return _fields(data.get(key), fields, positive)


def _fields(d: Any, fields: tuple[str, ...], positive: bool = False) -> tuple | None:
    """`d`'s `fields` as a tuple: sizes (`tokens`, `context`, `batch`, `cached`) as ints, times in
    `_ms` as seconds, the rest as floats; None unless every field is a number (and > 0 if `positive`)."""
    if not isinstance(d, dict) or not all(
        isinstance(d.get(k), (int, float)) and (d[k] > 0 or not positive) for k in fields
    ):
        return None
    return tuple(
        int(d[k])
        if k in ("tokens", "context", "batch", "cached")
        else float(d[k]) / 1e3
        if k.endswith("_ms")
        else float(d[k])
        for k in fields
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
    """Whether `path` holds `pddflow bench serve --json` output (else: an engine benchmark)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(data, dict) and isinstance(data.get("graphs"), list) and "workload" in data


def load_serve(paths: list[Path]) -> dict[str, ServeFacts]:
    """The deployment facts in one or more `pddflow bench serve --json --per-request` files, per
    graph (`graph_key`): the median serving CPU per token over the files and every prefill."""
    per_token: dict[str, list[float]] = {}
    prefills: dict[str, list[tuple[int, int, float]]] = {}
    handovers: dict[str, list[float]] = {}
    queued: dict[str, list[float]] = {}
    decode: dict[str, list[tuple[int, float, int, int]]] = {}
    decode_wall: dict[str, list[tuple[str, float, float]]] = {}
    shipping: dict[str, list[float]] = {}
    prefill_wall: dict[str, list[tuple[str, float, float]]] = {}
    latency: dict[str, list[float]] = {}
    sources: dict[str, list[str]] = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        for g in data["graphs"]:
            if not isinstance(g, dict) or not isinstance(g.get("graph"), str):
                continue
            key = graph_key(g["graph"])
            sources.setdefault(key, []).append(str(path))
            steps = g.get("decode_steps")
            for inst, d in steps.items() if isinstance(steps, dict) else ():
                got = _fields(d, ("steps", "cpu_s", "seqs", "context_tokens"))
                if got is not None:
                    decode.setdefault(key, []).append(
                        (int(got[0]), got[1], int(got[2]), int(got[3]))
                    )
                    wall = _fields(d, ("wall_s",))  # (older reports have none)
                    if wall is not None:
                        decode_wall.setdefault(key, []).append((str(inst), wall[0], got[1]))
            host = g.get("host_cpu")
            if isinstance(host, dict) and isinstance(host.get("ms_per_token"), (int, float)):
                per_token.setdefault(key, []).append(host["ms_per_token"] / 1e3)
            rows = g.get("per_request")
            for r in rows if isinstance(rows, list) else ():
                if not isinstance(r, dict) or not isinstance(r.get("prompt_tokens"), int):
                    continue
                first = {}  # each event's first occurrence, by name
                for e in r.get("events") or ():
                    if isinstance(e, dict):
                        first.setdefault(str(e.get("event", "")), e)
                send = next((e for name, e in first.items() if name.startswith("kv_send")), None)
                got = _fields(send, ("prefill_cpu_ms", "cached_tokens"))
                if got is not None:
                    prefills.setdefault(key, []).append((r["prompt_tokens"], got[1], got[0]))
                    wall = _fields(send, ("prefill_ms",))
                    if wall is not None and isinstance(send.get("instance"), str):
                        prefill_wall.setdefault(key, []).append((send["instance"], wall[0], got[0]))
                dispatch = _fields(send, ("t_ms", "export_ms", "prefill_ms", "queued_ms"))
                first_token = _fields(first.get("first_token"), ("t_ms",))
                if (
                    dispatch is not None
                    and first_token is not None
                    and isinstance(r.get("ttft_s"), (int, float))
                ):
                    sent_at, export, prefill, waited = dispatch
                    latency.setdefault(key, []).append(
                        max(0.0, sent_at - export - prefill - waited)
                        + max(0.0, r["ttft_s"] - first_token[0])
                    )
                sends = [
                    t
                    for name, e in first.items()
                    if name.startswith("kv_send")
                    if (t := _fields(e, ("t_ms", "export_ms", "bytes"))) is not None
                ]
                if (
                    sends and sum(b for _, _, b in sends) > 0
                ):  # the prefill ended one export before its first send
                    t0, export0, _ = min(sends)
                    shipping.setdefault(key, []).append(
                        (max(t for t, _, _ in sends) - (t0 - export0)) / sum(b for _, _, b in sends)
                    )
                for name, e in first.items():  # the relay's copy: export, send, the receiver's ack
                    if not name.startswith("kv_send:rdma_tensor:"):
                        continue
                    sent = _fields(first.get(name.replace("kv_send:", "kv_sent:", 1)), ("t_ms",))
                    start = _fields(e, ("t_ms", "export_ms"))
                    if sent is not None and start is not None:
                        handovers.setdefault(key, []).append(sent[0] - start[0] + start[1])
                        pre = _fields(
                            e, ("prefill_ms",)
                        )  # the prefill began its own time before it ended
                        if pre is not None and start[0] - start[1] - pre[0] >= QUEUED_S:
                            queued.setdefault(key, []).append(sent[0] - start[0] + start[1])
    if not per_token and not prefills:
        raise CalibrationError(
            f"{', '.join(map(str, paths))}: no `host_cpu` and no per-request prefill times; "
            f"pass `pddflow bench serve --json --per-request` output of this version"
        )
    return {
        k: ServeFacts(
            " + ".join(sorted(set(src))),
            statistics.median(per_token[k]) if k in per_token else None,
            tuple(prefills.get(k, ())),
            tuple(sorted(handovers.get(k, ()))),
            tuple(decode.get(k, ())),
            tuple(sorted(shipping.get(k, ()))),
            tuple(decode_wall.get(k, ())),
            tuple(sorted(queued.get(k, ()))),
            tuple(prefill_wall.get(k, ())),
            tuple(sorted(latency.get(k, ()))),
        )
        for k, src in sources.items()
    }


def merge(facts: list[BenchFacts]) -> BenchFacts:
    """Several calibrations of one machine as one: the median of every measured point. On a shared
    machine one quick calibration can be 1.5x off the next; several spread over a run (before and
    after it, say) steady the fit. Points measured by only some of them take those."""
    if len(facts) == 1:
        return facts[0]

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    def points(attr: str) -> tuple[tuple[int, float], ...]:
        keys = sorted({k for f in facts for k, _ in getattr(f, attr)})
        return tuple(
            (k, med([v for f in facts for k2, v in getattr(f, attr) if k2 == k])) for k in keys
        )

    def tuples(attr: str, keyed: int) -> tuple | None:
        """The median of a (sizes..., values...) point; only points at the first one's sizes count."""
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
    for f in facts[1:]:
        if (f.arch, f.devices, f.threads, f.decode_context) != (
            head.arch,
            head.devices,
            head.threads,
            head.decode_context,
        ):
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


def fit(
    facts: BenchFacts, arch: ModelArch | None = None, base: DeviceClass | None = None
) -> Calibration:
    """The device class (per device) and step overheads whose roofline reproduces the measurements:
    decode (`_fit_decode`), prefill (`_fit_prefill`), the extend's fixed cost and the attention
    factor. `Calibration.to_dict()` lists every measured point against the fitted model."""
    if arch is None:
        name = facts.arch if facts.arch in ARCHS else "tiny-llama"
        arch = ARCHS.get(name)
    n = facts.devices
    bytes_s, seq_s, kv_factor = _fit_decode(facts, arch)
    b = base or DeviceClass("calibrated", 0, 1024, 0, 100, 0.0)
    # Prefill FLOP/s, its fixed cost, the extend's fixed cost and the attention factor depend on each
    # other (a prompt's own attention is part of its FLOPs; the long-context extend is mostly
    # attention): a few rounds of fitting each with the others fixed settle them.
    attn_factor, cal = 1.0, None
    grid = _fit_prefill_grid(facts, arch)
    for _ in range(8):
        if grid is not None:
            flops_s, job_ovh, attn_factor = grid
        else:
            flops_s, job_ovh = _fit_prefill(
                facts, arch, arch.attention_flops_per_pair * attn_factor
            )
        dev = replace(
            b, name=f"{b.name}@calibrated", tflops=flops_s / 1e12 / n, hbm_tbps=bytes_s / 1e12 / n
        )
        eff = replace(
            UNIT,
            seq_overhead_s=seq_s,
            job_overhead_s=job_ovh,
            kv_read_factor=kv_factor,
            attn_factor=attn_factor,
        )
        if facts.extend is not None and job_ovh > 0:
            # the measured extend step (handed-off IDs over a context) against the roofline: what
            # is left is the extend call's own fixed cost, often well under a prompt prefill's
            n_, ctx_, t_ = facts.extend
            eff = replace(
                eff,
                extend_overhead_s=max(0.0, t_ - DeviceModel(dev, n, arch, eff).chunk_s(n_, ctx_)),
            )
        cal = Calibration(facts, dev, arch, eff)
        if facts.extend_long is None or grid is not None:
            break
        # new tokens over a long cached context: what the matmuls and the fixed cost leave is attention
        tokens, ctx_, t_ = facts.extend_long
        m = DeviceModel(dev, n, arch, eff)
        pairs = tokens * ctx_ + tokens * tokens / 2
        attn_s = t_ - m.ext_ovh - tokens * arch.flops_per_token / m.flops_s
        attn_factor = max(1.0, attn_s * m.flops_s / (pairs * arch.attention_flops_per_pair))
    return cal


def _fit_decode(facts: BenchFacts, arch: ModelArch) -> tuple[float, float, float]:
    """Achieved bandwidth, cost per decoding sequence and KV read factor from the decode points.

    With two batch sizes the step splits into weights-and-KV traffic (bandwidth) and a per-sequence
    cost; with one, it is all memory traffic. A long-context point then prices the KV read."""
    B, C = facts.decode_batch, facts.decode_context
    kvb = arch.kv_bytes_per_token
    step = B / facts.decode_tokens_per_s
    w1 = arch.weight_bytes + B * C * kvb
    bytes_s, seq_s = w1 / max(step, 1e-9), 0.0
    others = [p for p in facts.decode_points if p[0] != B]
    if others:
        # step(b) = (W + b*C*kv) / BW + b * s: two batch sizes, two unknowns
        B2, r2 = max(others)
        step2 = B2 / r2
        w2 = arch.weight_bytes + B2 * C * kvb
        det = w1 * B2 - w2 * B
        if det > 0:
            x = (step * B2 - step2 * B) / det  # seconds per byte
            s_ = (step - w1 * x) / B
            if x > 0 and s_ >= 0:
                bytes_s, seq_s = 1 / x, s_
    kv_factor = 1.0
    if facts.decode_long is not None:
        # A step over a long context: what the weights and per-sequence costs do not explain is the
        # KV it reads. CPU paged attention reads (gathers, pads) it at well under the weights' rate.
        Bl, Cl, tl = facts.decode_long
        kv_s = tl - arch.weight_bytes / bytes_s - Bl * seq_s
        if kv_s > 0:
            kv_factor = kv_s * bytes_s / (Bl * Cl * kvb)
    return bytes_s, seq_s, kv_factor


def _prefill_points(facts: BenchFacts) -> list[tuple[int, int, float]]:
    """Every measured prompt prefill as (new tokens, cached tokens, seconds): the cold lengths and
    the grid over a cached prefix."""
    return [(n, 0, n / r) for n, r in facts.prefill_points] + list(facts.prefill_grid)


def _fit_prefill_grid(facts: BenchFacts, arch: ModelArch) -> tuple[float, float, float] | None:
    """FLOP/s, fixed cost per prefill call and attention factor from a grid of prompts over cached
    prefixes (`bench engine`'s `prefill_grid`), by least squares in relative error over every
    prefill point: t = job overhead + new x FLOPs per token / FLOP/s + pairs x attention FLOPs x
    factor / FLOP/s. Three unknowns over the shapes a multi-turn workload runs: fitting two cold
    lengths and one long extend exactly extrapolated 10-40% fast to the prompts in between
    (docs/simulator.md, Fidelity). None without enough points or when the fit is unphysical (the
    caller falls back to the exact fits)."""
    pts = _prefill_points(facts)
    if not facts.prefill_grid or len(pts) < 4:
        return None
    apf = arch.attention_flops_per_pair
    rows = [((1.0, n * arch.flops_per_token, (n * c + n * n / 2) * apf), t) for n, c, t in pts]
    for cols in ((0, 1, 2), (1, 2)):  # with a fixed cost, then (if it came out negative) without
        x = np.array([[r[i] / t for i in cols] for r, t in rows])
        coef = dict(zip(cols, np.linalg.lstsq(x, np.ones(len(rows)), rcond=None)[0]))
        ovh, per_flop, attn = coef.get(0, 0.0), coef[1], coef[2]
        if per_flop > 0 and attn > 0 and ovh >= 0:
            return float(1 / per_flop), float(ovh), float(attn / per_flop)
    return None


def _fit_prefill(facts: BenchFacts, arch: ModelArch, apf: float) -> tuple[float, float]:
    """Achieved FLOP/s and fixed cost per prefill call, from the prefill points (attention at `apf`
    FLOPs-equivalent per pair).

    The longest measured prompt, all compute (a per-step overhead fitted from two lengths came out
    larger than a whole decode step on the CPU engine: prefill and decode do not share one fixed
    cost there, so none is fitted). With two or more lengths: t(L) = job overhead + FLOPs(L) /
    FLOP/s through the two longest, when both come out positive (a noisy short point, e.g. one that
    paid a warm-up, gives a negative overhead: then the longest prompt alone, all compute)."""

    def flops(tokens: int) -> float:
        return tokens * arch.flops_per_token + tokens * tokens / 2 * apf

    L = facts.prompt_tokens
    flops_s, job_ovh = flops(L) / (L / facts.prefill_tokens_per_s), 0.0
    if len(facts.prefill_points) >= 2:
        (L1, r1), (L2, r2) = sorted(facts.prefill_points)[-2:]
        t1, t2 = L1 / r1, L2 / r2
        df = flops(L2) - flops(L1)
        if t2 > t1 and df > 0:
            f_s = df / (t2 - t1)
            o = t2 - flops(L2) / f_s
            if o > 0:
                flops_s, job_ovh = f_s, o
    return flops_s, job_ovh


def calibrated_plan(
    plan: Plan, cal: Calibration, local: bool = True, kv_cache_bytes: int = LOCAL_KV_CACHE_MIB << 20
) -> Plan:
    """`plan` as the embedded deployment runs it: the local profile's replicas, the benchmark's
    model architecture, every device class replaced by the calibrated one (price kept). Local: each
    worker runs on what the benchmark measured, with the deployment's KV memory per worker (its
    decoders make KV wait for room: at bench serve's load that gate sets the batches)."""
    p = plan.scaled_to_local() if local else plan
    devices = {
        k: replace(v, tflops=cal.device.tflops, hbm_tbps=cal.device.hbm_tbps)
        for k, v in p.device_classes.items()
    }
    if local:
        ops = {
            k: replace(
                op, devices_per_replica=cal.facts.devices, kv_budget_bytes=float(kv_cache_bytes)
            )
            for k, op in p.operators.items()
        }
        p = replace(p, operators=ops, instances=_instances(ops))
    return replace(p, device_classes=devices, model=replace(p.model, arch=cal.arch))
