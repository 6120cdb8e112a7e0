"""Which host cores each worker of a local deployment runs on (docs/runtime.md, Cores)."""

from __future__ import annotations

import os
from dataclasses import dataclass

MODES = ("auto", "none")
DECODE_NICE = 5  # CFS weight 335 against prefill's 1024


@dataclass(frozen=True)
class CpuLayout:
    mode: str  # "instance" | "cluster" | "shared"
    cpus: dict[str, tuple[int, ...]]  # instance -> cores it is pinned to (empty: any core)
    threads: dict[str, int]  # instance -> torch threads
    nice: dict[str, int]  # instance -> niceness increment (0: normal priority)

    def describe(self) -> str:
        if self.mode == "shared":
            threads = ", ".join(f"{i}: {t} threads" for i, t in self.threads.items())
            return f"workers share all cores ({threads})"
        return "; ".join(
            f"{i}: cores {_ranges(c)}" + (f" (nice +{self.nice[i]})" if self.nice[i] else "")
            for i, c in self.cpus.items()
        )


def host_cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows: no affinity API
        return list(range(os.cpu_count() or 1))


def layout(
    instances: list[tuple[str, str, str]], cores: list[int], pinning: str = "auto"
) -> CpuLayout:
    """instances: (process name, cluster, role: prefill | decode | both) in plan order: one entry
    an instance, or one each of its rank processes."""
    if pinning not in MODES:
        raise ValueError(f"cpu pinning must be one of {', '.join(MODES)}, not {pinning!r}")
    ids = [i for i, _, _ in instances]
    role = {i: r for i, _, r in instances}
    clusters: dict[str, list[str]] = {}
    for inst, cluster, _ in instances:
        clusters.setdefault(cluster, []).append(inst)
    can_pin = hasattr(os, "sched_setaffinity") and len(cores) >= len(clusters) > 0
    if pinning == "none" or not can_pin:
        per = max(1, len(cores) // max(1, len(instances)))
        return CpuLayout("shared", {i: () for i in ids}, {i: per for i in ids}, {i: 0 for i in ids})
    shares = _split(len(cores), [len(v) for v in clusters.values()])
    cpus: dict[str, tuple[int, ...]] = {}
    threads: dict[str, int] = {}
    nice = {i: 0 for i in ids}
    mode = "instance"
    at = 0
    for (_, members), n in zip(clusters.items(), shares):
        own = cores[at : at + n]
        at += n
        if n >= len(members):
            for inst, k in zip(members, _split(n, [1] * len(members))):
                cpus[inst], threads[inst] = tuple(own[:k]), k
                own = own[k:]
        else:
            mode = "cluster"
            has_prefill = any(role[m] == "prefill" for m in members)
            for inst in members:
                cpus[inst], threads[inst] = tuple(own), max(1, n // len(members))
                if has_prefill and role[inst] == "decode":
                    nice[inst] = DECODE_NICE
    return CpuLayout(mode, {i: cpus[i] for i in ids}, {i: threads[i] for i in ids}, nice)


def plan_layout(plan, cores: list[int], pinning: str = "auto") -> CpuLayout:
    """Every rank process of every instance (`Plan.rank_processes`) gets its share."""
    return layout(
        [
            (name, i.cluster, plan.operators[i.operator].role)
            for i in plan.instances
            for name in plan.rank_processes(i.id)
        ],
        cores,
        pinning,
    )


def pin_self(cpus: tuple[int, ...] | list[int], nice: int = 0) -> None:
    """Pin this process (and threads it starts later) to `cpus` (none: no-op), niced by `nice`."""
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cpus))
    if nice > 0:
        os.nice(nice)


def _split(total: int, weights: list[int]) -> list[int]:
    """`total` cores split in proportion to `weights`, at least one each (largest remainder)."""
    n = len(weights)
    spare = total - n
    w = sum(weights)
    exact = [spare * x / w for x in weights]
    out = [1 + int(e) for e in exact]
    for i in sorted(range(n), key=lambda i: (int(exact[i]) - exact[i], i))[: total - sum(out)]:
        out[i] += 1
    return out


def _ranges(cpus: tuple[int, ...]) -> str:
    if not cpus:
        return "any"
    parts, start, prev = [], cpus[0], cpus[0]
    for c in cpus[1:] + (None,):  # type: ignore[operator]
        if c is not None and c == prev + 1:
            prev = c
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if c is not None:
            start = prev = c
    return ",".join(parts)
