"""The `pddflow deploy` options that `bench serve` and `bench elastic` pass on to every
deployment they start, declared once here so that the three commands cannot drift apart in
meaning, bounds, checks or help. `passed=True` words the help for a bench command."""

from __future__ import annotations

from typing import Any

import typer

from pddflow.commands.common import check_cpu_pinning, fail

PASSED = "passed to every `pddflow deploy`: "

CPU_PINNING_HELP = (
    "auto: give each emulated cluster (and, with enough cores, each instance) cores of its own, "
    "as separate hardware would; none: workers float over all cores"
)
ENGINE_HELP = (
    "real: run the model's weights; modeled: every step takes the simulator's device-model "
    "time for the graph's model.arch on the operator's devices, tokens from a hash of the "
    "context, no torch (fleet-scale tests of the runtime; docs/runtime.md, The modeled engine)"
)
PROFILE_HELP = (
    "local: the graph's local profile; production: every declared replica (with --engine modeled)"
)
STREAM_INTERVAL_HELP = (
    "a streamed answer's SSE chunks each carry at least this many tokens (vLLM's "
    "--stream-interval): the first token and the last chunk go at once; larger values cost the "
    "frontend less per token, the text and its order are the same"
)
API_SERVERS_HELP = (
    "HTTP processes serving the API on the one port (vLLM's --api-server-count): one process "
    "routes every request and keeps the scheduler's state; each request's tokens go from the "
    "workers straight to the process holding its connection; /health, /metrics and /admin "
    "answer for the whole deployment from any of them"
)


def _help(text: str, passed: bool) -> str:
    return PASSED + text if passed else text


def cpu_pinning_option(default: str = "auto", passed: bool = False) -> Any:
    return typer.Option(default, help=_help(CPU_PINNING_HELP, passed), callback=check_cpu_pinning)


def engine_option(passed: bool = False) -> Any:
    return typer.Option("real", help=_help(ENGINE_HELP, passed))


def profile_option(passed: bool = False) -> Any:
    return typer.Option("local", help=_help(PROFILE_HELP, passed))


def stream_interval_option(passed: bool = False) -> Any:
    return typer.Option(1, min=1, help=_help(STREAM_INTERVAL_HELP, passed))


def api_servers_option(passed: bool = False) -> Any:
    return typer.Option(1, min=1, max=64, help=_help(API_SERVERS_HELP, passed))


def check_engine_profile(engine: str, profile: str = "local") -> None:
    """Exit 2 unless `engine` can run `profile` (the deployment's own check, made before a bench
    command starts anything)."""
    from pddflow.runtime.deploy.modeled import check_engine_profile as check

    try:
        check(engine, profile)
    except ValueError as exc:
        fail(str(exc), code=2)
