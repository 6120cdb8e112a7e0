"""The deployment calibration: a `bench serve` report's figures against the engine fit."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from pddflow.core.stats import percentile
from pddflow.sim.calibration.engine_fit import EngineFit
from pddflow.sim.calibration.serve_report import ServeFacts

MIN_PREFILLS = 5  # fewer measured prefills: no prefill terms


@dataclass(frozen=True)
class DeploymentFit:
    serve: ServeFacts
    prefill_host_factor: float = 1.0
    decode_host_factor: float = 1.0
    prefill_spread: tuple[float, ...] = ()

    def to_dict(self) -> dict:
        serve = self.serve

        def quantiles(xs: tuple[float, ...], scale: float, digits: int) -> dict | None:
            return (
                {q: round(percentile(list(xs), q * 100) * scale, digits) for q in (0.1, 0.5, 0.9)}
                if xs
                else None
            )

        return {
            "source": serve.source,
            "prefills": len(serve.prefills),
            "prefill_host_factor": round(self.prefill_host_factor, 4),
            "decode_host_factor": round(self.decode_host_factor, 4),
            "decode_steps": sum(d[0] for d in serve.decode),
            "prefill_spread": quantiles(self.prefill_spread, 1, 3),
            "prefill_shipping_ms_per_mb": quantiles(serve.shipping, 1e9, 3),
            "prefill_wall_over_cpu": {
                i: round(r, 4) for i, r in sorted(serve.prefill_wall_ratios().items())
            }
            or None,
        }


def fit_deployment(engine: EngineFit, serve: ServeFacts) -> DeploymentFit:
    """The deployment's prefill and decode-step CPU over the engine fit's for the same work: the
    host factors (median) and the prefill spread around it."""
    m = engine.model()
    shapes = [(p - c, cpu / m.prefill_s(p - c, c)) for p, c, cpu in serve.prefills if p > c]
    enough = len(shapes) >= MIN_PREFILLS
    ratios = [r for _, r in shapes]
    f = statistics.median(ratios) if enough else 1.0
    spread = tuple(sorted(round(r / f, 4) for r in ratios)) if enough else ()
    model_s = sum(
        n * (m.weight_bytes / m.bytes_s + m.step_overhead_s)
        + ctx * m.kv_read_bytes_per_token / m.bytes_s
        + seqs * m.seq_overhead_s
        for n, _, seqs, ctx in serve.decode
    )
    fd = sum(cpu for _, cpu, _, _ in serve.decode) / model_s if model_s > 0 else 1.0
    return DeploymentFit(serve, f, fd, spread)
