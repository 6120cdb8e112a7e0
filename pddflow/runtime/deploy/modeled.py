"""A deployment of the modeled engine (operators/modeled_engine.py; docs/runtime.md, The modeled
engine): one process stands for each replica whatever its devices, and since its KV payloads are
`kv_scale` of the arch's true bytes, every emulated link carries them `kv_scale` as fast, so a
transfer takes the time the true bytes would."""

from __future__ import annotations

from dataclasses import replace

from pddflow.graph.plan import Plan

ENGINES = ("real", "modeled")
PROFILES = ("local", "production")


def check_engine_profile(engine: str, profile: str) -> None:
    """ValueError unless `engine` can run `profile` (deploy's check, and the bench commands' that
    deploy, made before they start anything)."""
    if engine not in ENGINES:
        raise ValueError(f"--engine: unknown {engine!r}; engines: {', '.join(ENGINES)}")
    if profile not in PROFILES:
        raise ValueError(f"--profile: unknown {profile!r}; profiles: {', '.join(PROFILES)}")
    if profile == "production" and engine != "modeled":
        raise ValueError(
            "--profile production starts every declared replica, each on its devices_per_replica "
            "devices: on one machine that is for --engine modeled"
        )


DEFAULT_KV_SCALE = 1 / 256


def modeled_plan(plan: Plan, kv_scale: float) -> Plan:
    """`plan` (either profile) as the modeled engine deploys it: one rank process an instance,
    links scaled with the payloads. ValueError where it cannot model the graph."""
    tiered = [n for n, op in plan.operators.items() if op.host_cache or op.disk_cache]
    if tiered:
        raise ValueError(
            f"{plan.source}: {', '.join(tiered)} declare{'s' if len(tiered) == 1 else ''} "
            "host_cache/disk_cache tiers, which the modeled engine does not have; deploy this "
            "graph with --engine real, or one without the tiers"
        )
    ops = {n: replace(op, local_ranks=1) for n, op in plan.operators.items()}
    links = {
        n: replace(link, gbps=link.gbps * kv_scale, stream_gbps=link.stream_gbps * kv_scale)
        for n, link in plan.links.items()
    }
    return replace(plan, operators=ops, links=links)
