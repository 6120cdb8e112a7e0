"""`pddflow bench serve`'s run, for the command to call with its options as one typed object: the
workload derived from the trace, the colocated reference when asked, each graph deployed and
served in turn (bench/serve.py), and the report `--json` prints."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pddflow.bench.serve import ratios, run_graph, summarize
from pddflow.bench.wan_degrade import WanDegrade
from pddflow.data import MOONCAKE_TRACE
from pddflow.graph.plan import Plan


class ServeError(RuntimeError):
    """The workload could not be built or a graph's deployment failed; the message says which."""


@dataclass(frozen=True, kw_only=True)
class ServeOptions:
    trace: Path = MOONCAKE_TRACE  # the sessions derive from it
    sessions: int = 12
    turns: int = 4
    scale: float = 1 / 32  # built-in model tokens per trace token
    rps: float = 2.0  # session starts per second
    max_output: int = 128
    think_s: float = 1.0  # from a turn's answer to the next turn
    wan_gbps: float | None = None  # every graph's emulated WAN (None: the graphs' links)
    degrade: WanDegrade | None = None
    timeout_s: float = 120.0  # one request's deadline
    seed: int = 0
    # passed to every `pddflow deploy`
    cpu_pinning: str = "auto"
    backend: str = "local"
    address: str | None = None
    engine: str = "real"
    profile: str = "local"
    stream_interval: int = 1
    api_servers: int = 1
    per_request: bool = False  # every request's row in the report
    exact: bool = False  # count the answers that differ from the colocated reference

    def deploy_args(self) -> tuple[str, ...]:
        return (
            *("--cpu-pinning", self.cpu_pinning, "--backend", self.backend),
            *("--engine", self.engine, "--profile", self.profile),
            *("--stream-interval", str(self.stream_interval)),
            *("--api-servers", str(self.api_servers)),
            *(("--address", self.address) if self.address else ()),
        )

    def as_json(self, requests: int) -> dict:
        return {
            "sessions": self.sessions,
            "turns": self.turns,
            "requests": requests,
            "scale": self.scale,
            "rps": self.rps,
            "wan_gbps": self.wan_gbps,
            "wan_degrade": self.degrade.as_json() if self.degrade is not None else None,
            "max_output": self.max_output,
            "think_s": self.think_s,
            "trace": str(self.trace),
            "cpu_pinning": self.cpu_pinning,
            "backend": self.backend,
            "engine": self.engine,
            "profile": self.profile,
            "stream_interval": self.stream_interval,
            "api_servers": self.api_servers,
        }


def serve_graphs(
    graphs: list[Path],
    plans: list[Plan],
    opts: ServeOptions,
    track: Callable[[str, int], Callable[[], None]],
    say: Callable[[str], None] = lambda _: None,
) -> dict:
    """Serve the workload on each graph (plans: theirs, compiled); `track(name, requests)` gives
    each graph's per-request tick. The report: the workload, one row per graph, the ratios of
    the others to the first."""
    from pddflow.bench.deploy_process import LaunchError
    from pddflow.core.serve_sessions import TraceError, build
    from pddflow.operators.hub import resolve_model
    from pddflow.runtime.frontend.model_info import model_info

    try:
        vocab = model_info(resolve_model(plans[0].model.weights)).vocab_size
        workload = build(
            opts.trace,
            opts.sessions,
            opts.turns,
            opts.scale,
            vocab=min(vocab, 256),
            seed=opts.seed,
            max_output=opts.max_output,
        )
    except (TraceError, OSError) as exc:
        raise ServeError(str(exc)) from exc
    reference = None
    if opts.exact:
        from pddflow.bench.serve_reference import reference_outputs

        say(f"the colocated reference: {workload.requests} requests ...")
        reference = reference_outputs(plans[0].model.weights, workload, opts.engine)
    results = []
    for g in graphs:
        tick = track(g.name, workload.requests)
        try:
            results.append(
                run_graph(
                    g,
                    workload,
                    opts.rps,
                    opts.wan_gbps,
                    opts.timeout_s,
                    tick,
                    opts.think_s,
                    extra=opts.deploy_args(),
                    per_request=opts.per_request,
                    degrade=opts.degrade,
                )
            )
        except LaunchError as exc:
            raise ServeError(f"{g}: {exc}") from exc
    sla = plans[0].scheduler
    rows = [summarize(r, sla.ttft_s, sla.tpot_ms / 1e3, reference) for r in results]
    return {
        "workload": opts.as_json(workload.requests),
        "graphs": rows,
        "ratios_vs_first": {r["graph"]: ratios(rows[0], r) for r in rows[1:]},
    }
