"""The workload `pddflow simulate` replays, its options as one typed object built by keyword:
the kind and its knobs. Three knobs mean different things by kind and default by kind (`rps`,
`turns`, `think_s`: `DEFAULTS`); `agentic()` and `build()` resolve them, so nothing downstream
asks which kind it was given."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pddflow.data import MOONCAKE_TRACE
from pddflow.sim.agentic import AgenticConfig, generate, pdd_conditions
from pddflow.sim.arrival_profile import ArrivalProfile
from pddflow.sim.workload import Workload

KINDS = ("trace", "agentic", "pdd", "serve")
# kind -> the shared knobs' defaults: agentic's (and pdd's) are a request rate, mean tool-call
# rounds and mean think time of a generated fleet; serve's are `bench serve`'s session starts per
# second, turns per session and seconds from an answer to the next turn
DEFAULTS = {
    "agentic": {"rps": 8.0, "turns": 12.0, "think_s": 20.0},
    "serve": {"rps": 2.0, "turns": 4.0, "think_s": 1.0},
}


class WorkloadError(ValueError):
    """A workload that cannot be built; the message names the file or the knob."""


@dataclass(frozen=True, kw_only=True)
class WorkloadOptions:
    kind: str  # KINDS
    seed: int = 0  # the workload's draws
    # trace: the Mooncake JSONL replayed (None: the shipped conversation trace); serve: the trace
    # its sessions derive from
    trace: Path | None = None
    requests: int | None = None  # trace: the first N (None: all); agentic, pdd: how many (4000)
    rate_scale: float = 1.0  # trace: the request rate times this
    input_scale: float = 1.0  # trace: prompt lengths times this
    output_scale: float = 1.0  # trace: output lengths times this
    rps: float | None = None  # None: DEFAULTS for the kind
    turns: float | None = None
    think_s: float | None = None
    hit_rate: float = 0.9  # agentic: target mean prefix hit
    prompt_tokens: int = 16000  # agentic: median first-turn context
    output_tokens: int = 400  # agentic: median output length
    sessions: int = 4  # serve: `bench serve --sessions`
    scale: float = 1 / 32  # serve: built-in model tokens per trace token
    max_output: int = 128  # serve: cap on one turn's output tokens
    arrivals: ArrivalProfile | None = None  # the arrivals re-timed (diurnal, steps)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise WorkloadError(f"unknown workload {self.kind!r}; use {', '.join(KINDS)}")

    def knob(self, name: str) -> float:
        """rps, turns or think_s as given, else the kind's default."""
        given = getattr(self, name)
        return given if given is not None else DEFAULTS.get(self.kind, DEFAULTS["agentic"])[name]

    def agentic(self, block_tokens: int, max_context: int) -> AgenticConfig:
        """The generator's settings: the agentic workload's (pdd's preset over them), the
        hit-rate sweep's base, and the rate, rounds and think time a serve replay uses."""
        base = AgenticConfig(
            requests=self.requests or 4000,
            rps=self.knob("rps"),
            hit_rate=self.hit_rate,
            turns_mean=self.knob("turns"),
            think_s=self.knob("think_s"),
            first_prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            seed=self.seed,
            system_prompt_tokens=min(2048, self.prompt_tokens // 8),
            block_tokens=block_tokens,
            max_context=min(65536, max_context),
        )
        if self.kind == "pdd":
            return pdd_conditions(
                requests=base.requests, rps=base.rps, seed=self.seed, block_tokens=block_tokens
            )
        return base

    def build(self, block_tokens: int, max_context: int, model_block: int) -> Workload:
        """The requests: generated, read from the trace, or `bench serve`'s sessions (hashed at
        the served model's block size `model_block`), re-timed by `arrivals`."""
        wl = self._requests(block_tokens, max_context, model_block)
        return self.arrivals.apply(wl) if self.arrivals is not None else wl

    def _requests(self, block_tokens: int, max_context: int, model_block: int) -> Workload:
        from pddflow.core.serve_sessions import TraceError as SessionsError
        from pddflow.sim.serve_replay import serve_workload
        from pddflow.sim.trace import TraceError, load_trace

        if self.kind in ("agentic", "pdd"):
            return generate(self.agentic(block_tokens, max_context))
        try:
            if self.kind == "serve":
                return serve_workload(
                    self.trace or MOONCAKE_TRACE,
                    self.sessions,
                    int(self.knob("turns")),
                    model_block,
                    scale=self.scale,
                    seed=self.seed,
                    max_output=self.max_output,
                    rps=self.knob("rps"),
                    think_s=self.knob("think_s"),
                )
            return load_trace(
                self.trace or MOONCAKE_TRACE,
                rate_scale=self.rate_scale,
                input_scale=self.input_scale,
                output_scale=self.output_scale,
                limit=self.requests,
            )
        except (TraceError, SessionsError, OSError) as exc:
            raise WorkloadError(str(exc)) from exc
