"""The files given to `pddflow simulate --calibrate`, and each graph's `Calibration` from them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from pddflow.sim.calibration.bench_files import load_bench, merge
from pddflow.sim.calibration.deployment import DeploymentFit, fit_deployment
from pddflow.sim.calibration.engine_fit import EngineFit, fit
from pddflow.sim.calibration.host import HostSpec
from pddflow.sim.calibration.serve_report import ServeFacts, graph_key, load_serve
from pddflow.sim.calibration.terms import Calibration


@dataclass(frozen=True)
class Measurements:
    engine: EngineFit  # the median of every engine benchmark, fitted
    serve: Mapping[str, ServeFacts]  # per graph; may be empty

    @staticmethod
    def load(engine_files: list[Path], serve_files: list[Path] = ()) -> Measurements:
        engine = fit(merge([load_bench(f) for f in engine_files]))
        return Measurements(engine, load_serve(list(serve_files)) if serve_files else {})

    def deployment(self, graph: str | Path) -> DeploymentFit | None:
        """`graph`'s own facts, else every served graph's pooled; None without a serve report."""
        if not self.serve:
            return None
        facts = self.serve.get(graph_key(graph))
        if facts is None:
            facts = ServeFacts.pooled(list(self.serve.values()))
        return fit_deployment(self.engine, facts)

    def calibration(self, graph: str | Path, host: HostSpec | None = None) -> Calibration:
        dep = self.deployment(graph)
        if dep is None:
            # a deployment's own measurements supersede the co-run guess
            if host is not None and self.engine.facts.corun is not None:
                host = replace(host, corun=self.engine.facts.corun)
            return Calibration(efficiency=self.engine.efficiency, host=host)
        s = dep.serve
        measured_host = host is not None
        return Calibration(
            efficiency=self.engine.efficiency,
            prefill_host_factor=dep.prefill_host_factor,
            decode_host_factor=dep.decode_host_factor,
            prefill_spread=dep.prefill_spread,
            prefill_shipping=s.shipping,
            host=host,
            prefill_wall_over_cpu=s.prefill_wall_ratios() if measured_host else {},
        )

    def report(self, graph: str | Path) -> dict:
        """The fit and the deployment facts, as `--json` reports them under `calibration`."""
        dep = self.deployment(graph)
        return self.engine.to_dict() | {"deployment": None if dep is None else dep.to_dict()}
