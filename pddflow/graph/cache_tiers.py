"""The KV tiers a graph declares under an operator's cache (`host_cache`, `disk_cache`) and the
local profile's sizes for them (`local.cache_mib`), checked where they are written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pddflow.core.registry import did_you_mean
from pddflow.graph.plan import DiskCachePlan, HostCachePlan, LocalCache
from pddflow.graph.spec import GraphSpec

Err = Callable[..., None]  # Compiler.err(path, message, key=False)


def _under_a_cache(err: Err, name: str, o: Any, params: dict[str, Any], key: str) -> bool:
    if params.get("radix_cache") or params.get("prefix_cache"):
        return True
    err(
        ("operators", name, key),
        f"operator {name} has a {key} but no prefix cache to sit under (op {o.op} with "
        "radix_cache/prefix_cache false or not declared); set params.radix_cache (decoders) or "
        f"params.prefix_cache (prefill) to true, or drop {key}",
        key=True,
    )
    return False


def host_cache(err: Err, name: str, o: Any, params: dict[str, Any]) -> HostCachePlan | None:
    hc = o.host_cache
    if hc is None or not _under_a_cache(err, name, o, params, "host_cache"):
        return None
    max_gib = hc.gib if hc.max_gib is None else hc.max_gib
    if max_gib < hc.gib:
        err(
            ("operators", name, "host_cache", "max_gib"),
            f"operator {name}: host_cache.max_gib ({max_gib:g}) is below host_cache.gib "
            f"({hc.gib:g}); the most `size` may buy cannot be less than what is declared",
        )
        return None
    return HostCachePlan(hc.gib, max_gib, hc.usd_per_gib_hour, hc.gbytes_per_s)


def disk_cache(err: Err, name: str, o: Any, params: dict[str, Any]) -> DiskCachePlan | None:
    dc = o.disk_cache
    if dc is None or not _under_a_cache(err, name, o, params, "disk_cache"):
        return None
    if dc.persist and not dc.dir:
        err(
            ("operators", name, "disk_cache", "persist"),
            f"operator {name}: disk_cache.persist keeps the arenas after stop, but without "
            "disk_cache.dir they live in the run directory, which stop removes; set dir",
        )
        return None
    return DiskCachePlan(dc.gib, dc.usd_per_gib_hour, dc.gbytes_per_s, dc.dir, dc.persist)


def local_cache_mib(err: Err, spec: GraphSpec) -> dict[str, LocalCache]:
    """operator -> its local sizes; a tier sized here must be declared on the operator."""
    out = {}
    for name, c in spec.local.cache_mib.items():
        at = ("local", "cache_mib", name)
        o = spec.operators.get(name)
        if o is None:
            err(
                at,
                f"local profile names operator {name!r}, which is not defined"
                f"{did_you_mean(name, spec.operators)}",
                key=True,
            )
            continue
        for tier in ("host", "disk"):
            if getattr(c, tier) is not None and getattr(o, f"{tier}_cache") is None:
                err(
                    at + (tier,),
                    f"local cache_mib.{name}.{tier} sizes a tier operator {name} does not "
                    f"declare; add operators.{name}.{tier}_cache or drop it here",
                    key=True,
                )
        out[name] = LocalCache(c.kv, c.host, c.disk)
    return out
