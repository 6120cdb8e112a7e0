"""The engine fit: `bench engine` figures as a device class of achieved rates, and step costs."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pddflow.core.arch import ARCHS, ModelArch
from pddflow.core.device import LOCAL_KV_CACHE_MIB, DeviceClass
from pddflow.core.device_model import DeviceModel, Efficiency
from pddflow.graph.plan import Plan, _instances
from pddflow.sim.calibration.bench_files import BenchFacts

UNIT = Efficiency(prefill_mfu=1.0, decode_mbu=1.0, step_overhead_s=0.0)


@dataclass(frozen=True)
class EngineFit:
    facts: BenchFacts
    device: DeviceClass
    arch: ModelArch
    efficiency: Efficiency = UNIT

    def model(self) -> DeviceModel:
        return DeviceModel(self.device, self.facts.devices, self.arch, self.efficiency)

    def to_dict(self) -> dict:
        """The fit, and every measured point against it."""
        d, f, eff, m = self.device, self.facts, self.efficiency, self.model()
        return {
            "source": f.source,
            "arch": self.arch.name,
            "prefill_tokens_per_s": f.prefill_tokens_per_s,
            "decode_tokens_per_s": f.decode_tokens_per_s,
            "achieved_tflops": round(d.tflops * f.devices, 6),
            "achieved_hbm_tbps": round(d.hbm_tbps * f.devices, 6),
            "step_overhead_ms": round(eff.step_overhead_s * 1e3, 3),
            "seq_overhead_ms": round(eff.seq_overhead_s * 1e3, 3),
            "prefill_overhead_ms": round(eff.prefill_overhead_s * 1e3, 3),
            "extend_overhead_ms": None
            if eff.extend_overhead_s is None
            else round(eff.extend_overhead_s * 1e3, 3),
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
            "attn_factor": round(eff.attn_factor, 3),
            "extend_long_check": None
            if f.extend_long is None
            else _check(
                {"tokens": f.extend_long[0], "context": f.extend_long[1]},
                f.extend_long[2],
                m.extend_s(f.extend_long[0], f.extend_long[1]),
            ),
            "kv_read_factor": round(eff.kv_read_factor, 3),
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
            else _check(
                {"batch": f.decode_long[0], "context": f.decode_long[1]},
                f.decode_long[2],
                m.decode_step_s(f.decode_long[0], f.decode_long[0] * f.decode_long[1]),
                "step_ms",
            ),
        }


def _check(sizes: dict, measured_s: float, model_s: float, unit: str = "ms") -> dict:
    return sizes | {
        f"measured_{unit}": round(measured_s * 1e3, 2),
        f"model_{unit}": round(model_s * 1e3, 2),
    }


def fit(
    facts: BenchFacts, arch: ModelArch | None = None, base: DeviceClass | None = None
) -> EngineFit:
    """The device class (per device) and step costs whose roofline reproduces the measurements."""
    if arch is None:
        arch = ARCHS.get(facts.arch if facts.arch in ARCHS else "tiny-llama")
    n = facts.devices
    bytes_s, seq_s, kv_factor = _fit_decode(facts, arch)
    b = base or DeviceClass("calibrated", 0, 1024, 0, 100, 0.0)
    # without a grid the prefill terms depend on each other: iterate to a fixed point
    attn_factor, result = 1.0, None
    grid = _fit_prefill_grid(facts, arch)
    for _ in range(8):
        if grid is not None:
            flops_s, job_s, attn_factor = grid
        else:
            flops_s, job_s = _fit_prefill(facts, arch, arch.attention_flops_per_pair * attn_factor)
        dev = replace(
            b, name=f"{b.name}@calibrated", tflops=flops_s / 1e12 / n, hbm_tbps=bytes_s / 1e12 / n
        )
        eff = replace(
            UNIT,
            seq_overhead_s=seq_s,
            prefill_overhead_s=job_s,
            kv_read_factor=kv_factor,
            attn_factor=attn_factor,
        )
        if facts.extend is not None and job_s > 0:
            # what the roofline leaves of the measured extend is the extend call's fixed cost
            n_, ctx_, t_ = facts.extend
            roofline = DeviceModel(dev, n, arch, eff).chunk_s(n_, ctx_)
            eff = replace(eff, extend_overhead_s=max(0.0, t_ - roofline))
        result = EngineFit(facts, dev, arch, eff)
        if facts.extend_long is None or grid is not None:
            break
        # new tokens over a long cached context: what matmuls and the fixed cost leave is attention
        tokens, ctx_, t_ = facts.extend_long
        m = result.model()
        pairs = tokens * ctx_ + tokens * tokens / 2
        attn_s = t_ - m.extend_overhead_s - tokens * arch.flops_per_token / m.flops_s
        attn_factor = max(1.0, attn_s * m.flops_s / (pairs * arch.attention_flops_per_pair))
    return result


def _fit_decode(facts: BenchFacts, arch: ModelArch) -> tuple[float, float, float]:
    """Bandwidth, per-sequence cost (needs two batch sizes) and KV read factor (a long point)."""
    B, C = facts.decode_batch, facts.decode_context
    kv_bytes = arch.kv_bytes_per_token
    step = B / facts.decode_tokens_per_s
    w1 = arch.weight_bytes + B * C * kv_bytes
    bytes_s, seq_s = w1 / max(step, 1e-9), 0.0
    others = [p for p in facts.decode_points if p[0] != B]
    if others:
        # step(b) = (W + b*C*kv) / BW + b * s: two batch sizes, two unknowns
        B2, r2 = max(others)
        step2 = B2 / r2
        w2 = arch.weight_bytes + B2 * C * kv_bytes
        det = w1 * B2 - w2 * B
        if det > 0:
            x = (step * B2 - step2 * B) / det  # seconds per byte
            s_ = (step - w1 * x) / B
            if x > 0 and s_ >= 0:
                bytes_s, seq_s = 1 / x, s_
    kv_factor = 1.0
    if facts.decode_long is not None:
        # CPU paged attention gathers and pads the KV: the rest of a long step prices the read
        Bl, Cl, tl = facts.decode_long
        kv_s = tl - arch.weight_bytes / bytes_s - Bl * seq_s
        if kv_s > 0:
            kv_factor = kv_s * bytes_s / (Bl * Cl * kv_bytes)
    return bytes_s, seq_s, kv_factor


def _fit_prefill_grid(facts: BenchFacts, arch: ModelArch) -> tuple[float, float, float] | None:
    """Least squares in relative error over the grid and cold points: t = fixed + (new x FLOPs/token
    + pairs x attention FLOPs x factor) / FLOP/s. None when unphysical (callers fit exactly)."""
    import numpy as np  # here: `pddflow simulate` without --calibrate stays light

    pts = [(n, 0, n / r) for n, r in facts.prefill_points] + list(facts.prefill_grid)
    if not facts.prefill_grid or len(pts) < 4:
        return None
    per_pair = arch.attention_flops_per_pair
    rows = [((1.0, n * arch.flops_per_token, (n * c + n * n / 2) * per_pair), t) for n, c, t in pts]
    for cols in ((0, 1, 2), (1, 2)):  # with a fixed cost, then (if it came out negative) without
        x = np.array([[r[i] / t for i in cols] for r, t in rows])
        coef = dict(zip(cols, np.linalg.lstsq(x, np.ones(len(rows)), rcond=None)[0]))
        fixed, per_flop, attn = coef.get(0, 0.0), coef[1], coef[2]
        if per_flop > 0 and attn > 0 and fixed >= 0:
            return float(1 / per_flop), float(fixed), float(attn / per_flop)
    return None


def _fit_prefill(facts: BenchFacts, arch: ModelArch, per_pair: float) -> tuple[float, float]:
    """FLOP/s and fixed cost through the two longest cold prompts; a negative fixed cost (a noisy
    short point) falls back to the longest alone, all compute."""

    def flops(tokens: int) -> float:
        return tokens * arch.flops_per_token + tokens * tokens / 2 * per_pair

    L = facts.prompt_tokens
    flops_s, fixed = flops(L) / (L / facts.prefill_tokens_per_s), 0.0
    if len(facts.prefill_points) >= 2:
        (L1, r1), (L2, r2) = sorted(facts.prefill_points)[-2:]
        t1, t2 = L1 / r1, L2 / r2
        df = flops(L2) - flops(L1)
        if t2 > t1 and df > 0:
            f_s = df / (t2 - t1)
            o = t2 - flops(L2) / f_s
            if o > 0:
                flops_s, fixed = f_s, o
    return flops_s, fixed


def calibrated_plan(
    plan: Plan,
    engine: EngineFit,
    local: bool = True,
    kv_cache_bytes: int = LOCAL_KV_CACHE_MIB << 20,
) -> Plan:
    """`plan` as the embedded deployment runs it: local replicas, the benchmark's architecture, the
    fitted device (price kept), the deployment's KV memory per worker (`local.cache_mib` kv where
    the graph gives it)."""
    p = plan.scaled_to_local() if local else plan
    devices = {
        k: replace(v, tflops=engine.device.tflops, hbm_tbps=engine.device.hbm_tbps)
        for k, v in p.device_classes.items()
    }
    if local:
        sized = {k for k, c in p.local_cache_mib.items() if c.kv}  # the profile's own pool size
        ops = {
            k: replace(
                op,
                devices_per_replica=engine.facts.devices,
                kv_budget_bytes=op.kv_budget_bytes if k in sized else float(kv_cache_bytes),
            )
            for k, op in p.operators.items()
        }
        p = replace(p, operators=ops, instances=_instances(ops))
    return replace(p, device_classes=devices, model=replace(p.model, arch=engine.arch))
