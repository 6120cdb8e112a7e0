"""A tensor-parallel follower's life (`follow_leader`, every follower's: deployed or local), the
local follower process, and a group of them on this machine.

    python -m pddflow.operators.follower --model SPEC --engine-config JSON --tp-config JSON
        [--device DEV]

joins the group (`TPConfig` as JSON of its fields; rank > 0), loads the model, keeps its shard and
follows the leader's steps until the leader stops it (exit 0) or a rank is lost (exit 3, one line
on stderr). `local_group` starts the N-1 followers of an instance led by this process on this
machine (127.0.0.1, a free port): `pddflow generate --tensor-parallel N`, `bench engine`, tests.
A deployment's followers are its worker processes of rank > 0 (`python -m pddflow.runtime.workers
WIRING INSTANCE RANK`, runtime/workers/ranks.py): the same life over an engine built from the
wiring, with rank-to-rank KV beside it. Followers started here die with their parent
(core/parent_death.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from pddflow.core.child_python import python_module
from pddflow.core.parent_death import die_with_parent, parent_env
from pddflow.core.ports import free_port
from pddflow.core.startup_gc import starting
from pddflow.operators.engine_config import EngineConfig, rank_device
from pddflow.operators.tensor_parallel import TPConfig, TPGroup, TPPeerLost, join

if TYPE_CHECKING:
    from pddflow.operators.engine import Engine
    from pddflow.operators.tp_steps import RankKV

EXIT_PEER_LOST = 3


def follow_leader(
    name: str,
    build: Callable[[], Engine],
    rank_kv: Callable[[Engine], RankKV] | None = None,
) -> int:
    """A follower rank's whole life: build its engine (`build` joins the rank's group) with the
    garbage collector off (core/startup_gc.py), say so on stdout, then follow the leader's steps
    until it stops them (0) or a rank is lost, before or after (EXIT_PEER_LOST, one line on
    stderr). `rank_kv`: the rank's part of rank-to-rank KV, made beside its engine."""
    kv: RankKV | None = None
    try:
        with starting():  # torch's import and the engine's build
            engine = build()
            kv = rank_kv(engine) if rank_kv is not None else None
        print(f"{name} ready (pid {os.getpid()})", flush=True)
        engine.follow(kv)
        return 0
    except TPPeerLost as exc:
        print(f"{name}: {exc}", file=sys.stderr, flush=True)
        return EXIT_PEER_LOST
    finally:
        if kv is not None:
            kv.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pddflow.operators.follower")
    p.add_argument("--model", required=True, help="model spec (as the leader's)")
    p.add_argument("--engine-config", default="{}", help="EngineConfig fields as JSON")
    p.add_argument("--tp-config", required=True, help="TPConfig fields as JSON (rank > 0)")
    p.add_argument("--device", default=None, help="this rank's device (default: cuda:RANK or cpu)")
    args = p.parse_args(argv)
    die_with_parent()
    config = EngineConfig(**json.loads(args.engine_config))
    tp_cfg = TPConfig(**json.loads(args.tp_config))
    if tp_cfg.rank == 0 or tp_cfg.size < 2:
        p.error("a follower has rank >= 1 of size >= 2")
    device = torch.device(args.device or rank_device(tp_cfg.rank, config.device))
    groups: list[TPGroup] = []

    def build() -> Engine:
        from pddflow.operators.engine import Engine
        from pddflow.operators.weights import load_model_source

        tp = join(tp_cfg, device)
        assert tp is not None
        groups.append(tp)
        return Engine(load_model_source(args.model), config, tp)

    try:
        return follow_leader(f"follower rank {tp_cfg.rank}", build)
    finally:
        for tp in groups:
            tp.close()


def start_followers(
    spec: str, config: EngineConfig, tp: TPConfig, log_dir: Path
) -> list[subprocess.Popen]:
    """Ranks 1..size-1 of `tp` as processes of this one (they die with it); stderr to
    log_dir/rank-R.log."""
    procs = []
    for rank in range(1, tp.size):
        argv = [
            *python_module("pddflow.operators.follower"),
            "--model",
            spec,
            "--engine-config",
            json.dumps(dataclasses.asdict(config)),
            "--tp-config",
            json.dumps(dataclasses.asdict(dataclasses.replace(tp, rank=rank))),
        ]
        with open(log_dir / f"rank-{rank}.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    env=parent_env(),
                )
            )
    return procs


class LocalGroup:
    """What `local_group` yields: the leader's group (None at size 1) and its followers."""

    def __init__(self, tp: TPGroup | None, procs: list[subprocess.Popen], log_dir: Path):
        self.tp, self.procs, self.log_dir = tp, procs, log_dir

    def follower_logs(self) -> str:
        """The followers' last stderr lines (why one failed)."""
        out = []
        for rank in range(1, len(self.procs) + 1):
            f = self.log_dir / f"rank-{rank}.log"
            lines = f.read_text(errors="replace").strip().splitlines() if f.exists() else []
            if lines:
                out.append(f"rank {rank}: " + " | ".join(lines[-3:]))
        return "; ".join(out)


@contextmanager
def local_group(
    spec: str, config: EngineConfig, size: int, timeout_s: float = 60.0
) -> Iterator[LocalGroup]:
    """Lead a TP `size` instance on this machine: start its followers, join as rank 0, and on exit
    stop them (the leader's engine should be closed first) and reap them (killed after a grace)."""
    if size == 1:
        yield LocalGroup(None, [], Path("."))
        return
    if rank_device(0, config.device).startswith("cuda") and size > torch.cuda.device_count():
        raise ValueError(
            f"tensor parallelism {size} needs {size} CUDA devices (one per rank), "
            f"{torch.cuda.device_count()} here"
        )
    cfg = TPConfig(size=size, init_address=f"127.0.0.1:{free_port()}", timeout_s=timeout_s)
    with tempfile.TemporaryDirectory(prefix="pddflow-tp-") as tmp:
        procs = start_followers(spec, config, cfg, Path(tmp))
        tp: TPGroup | None = None
        try:
            tp = join(cfg, torch.device(rank_device(0, config.device)))
            yield LocalGroup(tp, procs, Path(tmp))
        finally:
            if tp is not None:
                tp.close()
            for proc in procs:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


if __name__ == "__main__":
    sys.exit(main())
