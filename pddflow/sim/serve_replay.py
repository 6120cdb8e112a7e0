"""`pddflow bench serve`'s multi-turn workload, token for token, as simulator requests
(docs/simulator.md, `--serve-workload`)."""

from __future__ import annotations

from pathlib import Path

from pddflow.core.block_hash import chain_block_hashes
from pddflow.core.serve_sessions import WorkloadSpec, build
from pddflow.data import MOONCAKE_TRACE
from pddflow.sim.workload import SimRequest, Workload

DEFAULT_TRACE = MOONCAKE_TRACE


def _placeholder(session: int, turn: int, i: int) -> int:
    """A stand-in for a generated token: negative, so never equal to a real vocabulary ID."""
    return -(1 + ((session * 1_000 + turn) * 100_000 + i) % (2**31 - 2))


def replay(
    spec: WorkloadSpec,
    block_tokens: int,
    rps: float = 2.0,
    think_s: float = 1.0,
    name: str = "serve-workload",
) -> Workload:
    """Roots at i/rps, later turns closed-loop."""
    if rps <= 0:
        raise ValueError("rps must be > 0")
    reqs: list[SimRequest] = []
    # roots first, in arrival order (the simulator walks roots in list order); later turns after
    contexts: list[list[list[int]]] = []
    for i, s in enumerate(spec.sessions):
        ctx = list(s.first_prompt)
        turns = []
        for turn in range(len(s.output_tokens)):
            if turn:
                prev_out = s.output_tokens[turn - 1]
                ctx = (
                    ctx
                    + [_placeholder(i, turn - 1, k) for k in range(prev_out)]
                    + list(s.user_turns[turn - 1])
                )
            turns.append(ctx)
        contexts.append(turns)
    done = [
        [
            tuple(
                chain_block_hashes(
                    ctx + [_placeholder(i, turn, k) for k in range(s.output_tokens[turn])],
                    block_tokens,
                )
            )
            for turn, ctx in enumerate(contexts[i])
        ]
        for i, s in enumerate(spec.sessions)
    ]
    rid = 0
    ids: dict[tuple[int, int], int] = {}
    for i, s in enumerate(spec.sessions):
        ctx = contexts[i][0]
        ids[(i, 0)] = rid
        reqs.append(
            SimRequest(
                rid,
                i / rps,
                len(ctx),
                s.output_tokens[0],
                tuple(chain_block_hashes(ctx, block_tokens)) or (_root_hash(i),),
                done_hashes=done[i][0],
                session=i,
                turn=0,
            )
        )
        rid += 1
    for i, s in enumerate(spec.sessions):
        for turn in range(1, len(s.output_tokens)):
            ctx = contexts[i][turn]
            ids[(i, turn)] = rid
            reqs.append(
                SimRequest(
                    rid,
                    i / rps,
                    len(ctx),
                    s.output_tokens[turn],
                    tuple(chain_block_hashes(ctx, block_tokens)) or (_root_hash(i),),
                    parent=ids[(i, turn - 1)],
                    gap_s=think_s,
                    done_hashes=done[i][turn],
                    session=i,
                    turn=turn,
                )
            )
            rid += 1
    meta = {
        "generator": "serve-workload",
        "sessions": len(spec.sessions),
        "scale": spec.scale,
        "rps": rps,
        "think_s": think_s,
        "requests": len(reqs),
    }
    return Workload(name, reqs, block_tokens, meta)


def _root_hash(session: int) -> int:
    """A prompt shorter than one block has no full block: give it a unique stand-in hash."""
    return -(10**12 + session)


def serve_workload(
    trace: Path,
    sessions: int,
    turns: int,
    block_tokens: int,
    *,
    scale: float = 1 / 32,
    vocab: int = 256,
    seed: int = 0,
    max_output: int = 128,
    rps: float = 2.0,
    think_s: float = 1.0,
) -> Workload:
    spec = build(trace, sessions, turns, scale, vocab=vocab, seed=seed, max_output=max_output)
    wl = replay(
        spec,
        block_tokens,
        rps,
        think_s,
        name=f"serve-workload({sessions}x{turns}, rps={rps:g}, think={think_s:g}s)",
    )
    wl.meta.update({"trace": str(trace), "turns": turns, "max_output": max_output, "seed": seed})
    return wl
