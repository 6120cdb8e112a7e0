"""Tensor parallelism over torch.distributed (docs/engine.md, Tensor parallelism): the group of one
instance's ranks, the layout of each rank's shard, and the few collectives the engine uses, every
one with the group's deadline so a lost rank surfaces as `TPPeerLost`, never as a hang.

Attention heads split over the ranks; KV heads split while there are at least as many as ranks,
else each rank holds one KV head and `size / num_kv_heads` consecutive ranks share it (their query
heads are contiguous, so each rank's query heads all read its one KV head). The MLP's intermediate
dimension splits likewise. The reduction after the row-parallel projections (o, down) gathers every
rank's partial sums and adds them in rank order: the same bits on every rank and for every batch
composition, which a backend all-reduce does not promise.
"""

from __future__ import annotations

import atexit
import datetime
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from pddflow.core.model_config import ModelConfig
from pddflow.operators.engine_core import TPPeerLost
from pddflow.operators.kv_shards import kv_heads, kv_owners

STOP = 0  # step kind that ends a follower's loop (the others are tp_steps')
# A follower waiting for the leader's next step, and ranks waiting for each other to load the
# model, wait this long: an idle instance is not a lost one. A dead process still surfaces at
# once (its sockets close); a stuck one surfaces at the leader's next step, within timeout_s.
IDLE_WAIT = datetime.timedelta(days=3650)


@dataclass(frozen=True)
class TPConfig:
    size: int = 1  # ranks of one instance
    rank: int = 0  # 0 leads
    init_address: str = ""  # host:port where rank 0 listens for the rendezvous (TCP store)
    timeout_s: float = 60.0  # every collective's deadline: a dead peer never hangs a step
    backend: str = "auto"  # auto: nccl on cuda, else gloo


def valid_degrees(config: ModelConfig, expert_parallel: bool = False) -> list[int]:
    return [
        n for n in range(1, config.num_heads + 1) if not layout_problems(config, n, expert_parallel)
    ]


def layout_problems(config: ModelConfig, size: int, expert_parallel: bool = False) -> list[str]:
    h, kv, inter = config.num_heads, config.num_kv_heads, config.intermediate_size
    out = []
    if h % size:
        out.append(f"{h} attention heads do not split over {size} ranks")
    if size <= kv and kv % size:
        out.append(f"{kv} KV heads do not split over {size} ranks")
    if size > kv and size % kv:
        out.append(
            f"{size} ranks do not share {kv} KV heads evenly (past the KV heads, ranks must be "
            "a multiple of them)"
        )
    if inter % size:
        out.append(f"intermediate size {inter} does not split over {size} ranks")
    shared = config.shared_experts * config.moe_intermediate_size
    if shared % size:
        out.append(f"shared experts' intermediate size {shared} does not split over {size} ranks")
    moe, experts = config.moe_intermediate_size, config.num_experts
    if experts and expert_parallel and experts % size:
        out.append(f"{experts} experts do not split over {size} ranks (expert parallel)")
    elif experts and not expert_parallel and moe % size:
        out.append(f"expert intermediate size {moe} does not split over {size} ranks")
    return out


def check_layout(config: ModelConfig, size: int, expert_parallel: bool = False) -> None:
    """ValueError naming the numbers and the fix when the model does not split over `size`."""
    if size < 1:
        raise ValueError(f"tensor parallelism must be >= 1, got {size}")
    problems = layout_problems(config, size, expert_parallel)
    if problems:
        ok = ", ".join(map(str, valid_degrees(config, expert_parallel)))
        raise ValueError(
            f"tensor parallelism {size} does not fit this {config.arch} model "
            f"({config.num_heads} heads, {config.num_kv_heads} KV heads, intermediate "
            f"{config.intermediate_size}): {'; '.join(problems)}; use one of: {ok}"
        )


@dataclass(frozen=True)
class Shard:
    """What rank `rank` of `size` holds: query heads [h0, h1), KV heads [k0, k1), intermediate
    columns [i0, i1), and of a mixture of experts the experts [x0, x1) with their intermediate
    columns [m0, m1): every expert, a slice of each (tensor parallel), or whole experts, a share
    of them (expert parallel); the router stays whole. `local` is the model config it computes
    with (its own head counts and widths)."""

    size: int
    rank: int
    h0: int
    h1: int
    k0: int
    k1: int
    i0: int
    i1: int
    m0: int
    m1: int
    x0: int
    x1: int
    local: ModelConfig
    full: ModelConfig

    @classmethod
    def of(cls, config: ModelConfig, size: int, rank: int, expert_parallel: bool = False) -> Shard:
        check_layout(config, size, expert_parallel)
        h, i = config.num_heads // size, config.intermediate_size // size
        k0, k1 = cls.kv_range(config, size, rank)
        r, mi, e = rank, config.moe_intermediate_size, config.num_experts
        if expert_parallel:  # whole experts, E / size of them
            m0, m1, x0, x1 = 0, mi, r * e // size, (r + 1) * e // size
        else:  # every expert, a slice of its columns
            m0, m1, x0, x1 = r * mi // size, (r + 1) * mi // size, 0, e
        local = replace(
            config,
            num_heads=h,
            num_kv_heads=k1 - k0,
            intermediate_size=i,
            moe_intermediate_size=m1 - m0,
        )
        i0, i1 = r * i, (r + 1) * i
        return cls(size, r, r * h, (r + 1) * h, k0, k1, i0, i1, m0, m1, x0, x1, local, config)

    def holds_expert(self, expert: int) -> bool:
        return self.x0 <= expert < self.x1

    @staticmethod
    def kv_range(config: ModelConfig, size: int, rank: int) -> tuple[int, int]:
        return kv_heads(config.num_kv_heads, size, rank)

    def slice(self, t: torch.Tensor, part: str) -> torch.Tensor:
        """This rank's slice of a full weight or bias: q, kv, inter, expert and shared rows
        (column-parallel), o, inter_down, expert_down and shared_down columns (row-parallel);
        latent attention's per-head query rows (mla_q) and output columns (mla_o). A copy, so
        the full tensor can be freed."""
        c, d = self.full, self.full.head_dim
        qk, v = c.qk_nope_head_dim + c.qk_rope_head_dim, c.v_head_dim
        w = c.shared_experts * c.moe_intermediate_size // self.size
        rows = {
            "q": (self.h0 * d, self.h1 * d),
            "kv": (self.k0 * d, self.k1 * d),
            "inter": (self.i0, self.i1),
            "expert": (self.m0, self.m1),
            "shared": (self.rank * w, (self.rank + 1) * w),
            "mla_q": (self.h0 * qk, self.h1 * qk),
            "o": (self.h0 * d, self.h1 * d),
            "inter_down": (self.i0, self.i1),
            "expert_down": (self.m0, self.m1),
            "shared_down": (self.rank * w, (self.rank + 1) * w),
            "mla_o": (self.h0 * v, self.h1 * v),
        }[part]
        row_parallel = ("o", "inter_down", "expert_down", "shared_down", "mla_o")
        dim = t.dim() - 1 if part in row_parallel else 0
        return t.narrow(dim, rows[0], rows[1] - rows[0]).clone()

    def kv_owners(self) -> list[int]:
        """The rank holding each KV-head chunk, in head order: export reads these."""
        return kv_owners(self.full.num_kv_heads, self.size)

    def canonical(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """Every rank's blocks [n, L, 2, bs, own KV heads, D] -> the full-head blocks (TP 1's
        layout)."""
        return torch.cat([parts[r] for r in self.kv_owners()], dim=4)

    def split(self, full: torch.Tensor) -> list[torch.Tensor]:
        """Full-head blocks -> each rank's KV heads, contiguous."""
        out = []
        for r in range(self.size):
            a, b = self.kv_range(self.full, self.size, r)
            out.append(full.narrow(4, a, b - a).contiguous())
        return out


class TPGroup:
    """This process's place in one instance's group. The engine's collectives go through here;
    any failure of one marks the group lost and raises TPPeerLost (then and on every later call).
    close() leaves the group (idempotent); on the leader it first stops followers still
    following."""

    def __init__(self, cfg: TPConfig, device: torch.device, data, ctrl):
        self.cfg, self.device = cfg, device
        self.rank, self.size, self.timeout_s = cfg.rank, cfg.size, cfg.timeout_s
        self._data, self._ctrl = data, ctrl  # compute collectives; step messages (gloo, CPU)
        self._lost: str | None = None
        self._closed = False
        self._engaged = False  # followers are inside an engine's follow()

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def _guard(self, what: str, fn):
        if self._closed:
            raise TPPeerLost(f"tensor-parallel group of rank {self.rank} is closed")
        if self._lost is not None:
            raise TPPeerLost(self._lost)
        try:
            return fn()
        except TPPeerLost:
            raise
        except RuntimeError as exc:  # gloo/NCCL errors, timeouts, closed connections
            detail = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc)
            self._lost = (
                f"tensor-parallel rank {self.rank} of {self.size}: {what} failed: a rank of "
                f"this instance is gone or stuck past {self.timeout_s:g} s ({detail})"
            )
            raise TPPeerLost(self._lost) from None

    def _bcast(self, t: torch.Tensor, timeout: datetime.timedelta | None = None) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        opts.timeout = timeout or datetime.timedelta(seconds=self.timeout_s)
        self._ctrl.broadcast([t], opts).wait()

    # step messages: a two-int64 header [kind, length], then the int64 payload
    def send(self, kind: int, payload: torch.Tensor) -> None:
        assert self.is_leader
        payload = payload.to(torch.long).contiguous()

        def go() -> None:
            self._bcast(torch.tensor([kind, payload.numel()], dtype=torch.long))
            if payload.numel():
                self._bcast(payload)

        self._guard("sending a step", go)

    def recv(self) -> tuple[int, torch.Tensor]:
        """A follower's wait for the leader's next step (no deadline while the leader idles)."""
        assert not self.is_leader

        def go() -> tuple[int, torch.Tensor]:
            head = torch.empty(2, dtype=torch.long)
            self._bcast(head, IDLE_WAIT)
            payload = torch.empty(int(head[1]), dtype=torch.long)
            if payload.numel():
                self._bcast(payload)
            return int(head[0]), payload

        return self._guard("waiting for the leader's step", go)

    def agree(self, values: list[int]) -> list[list[int]]:
        """Every rank's `values` (same length), once all ranks got here (however long loading
        the model took them)."""

        def go() -> list[list[int]]:
            self._bcast(torch.zeros(1, dtype=torch.long), IDLE_WAIT)  # all ranks are here
            mine = torch.tensor(values, dtype=torch.long)
            parts = [torch.empty_like(mine) for _ in range(self.size)]
            dist.all_gather(parts, mine, group=self._ctrl)
            return [p.tolist() for p in parts]

        return self._guard("the start-up handshake", go)

    def check_same(self, facts: dict[str, int]) -> None:
        """The handshake: every rank states the same facts (model, settings), else ValueError on
        every rank; then the leader's followers are ready to follow."""
        ranks = self.agree(list(facts.values()))
        odd = [r for r, v in enumerate(ranks) if v != ranks[0]]
        if odd:
            diff = ", ".join(
                f"{name} {ranks[odd[0]][i]} vs {ranks[0][i]}"
                for i, name in enumerate(facts)
                if ranks[odd[0]][i] != ranks[0][i]
            )
            raise ValueError(
                f"tensor-parallel rank {odd[0]} loaded a different model or engine settings "
                f"than rank 0: {diff}"
            )
        if self.is_leader:
            self._engaged = True

    def stop_followers(self) -> None:
        """Leader: end the followers' loops (they return from follow()); no-op when none run."""
        if self.is_leader and self._engaged and not self._closed:
            self._engaged = False
            self.send(STOP, torch.empty(0, dtype=torch.long))

    def sum_partials(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of every rank's `x`, added in rank order: bit-identical on every rank."""

        def go() -> torch.Tensor:
            x_ = x.contiguous()
            parts = [torch.empty_like(x_) for _ in range(self.size)]
            dist.all_gather(parts, x_, group=self._data)
            out = parts[0]
            for p in parts[1:]:
                out = out + p
            return out

        return self._guard("the row-parallel reduction", go)

    def gather_to_leader(self, x: torch.Tensor) -> list[torch.Tensor] | None:
        def go() -> list[torch.Tensor] | None:
            x_ = x.contiguous()
            parts = [torch.empty_like(x_) for _ in range(self.size)] if self.is_leader else None
            dist.gather(x_, parts, dst=0, group=self._data)
            return parts

        return self._guard("gathering KV", go)

    def scatter_from_leader(self, parts: list[torch.Tensor] | None, out: torch.Tensor) -> None:
        def go() -> None:
            dist.scatter(out, parts if self.is_leader else None, src=0, group=self._data)

        self._guard("scattering KV", go)

    def all_true(self, ok: bool) -> bool:
        """Whether every rank's `ok` is true (each learns the same answer)."""

        def go() -> bool:
            flag = torch.tensor([int(ok)], dtype=torch.long)
            opts = dist.AllreduceOptions()
            opts.reduceOp = dist.ReduceOp.MIN
            opts.timeout = datetime.timedelta(seconds=self.timeout_s)
            self._ctrl.allreduce([flag], opts).wait()
            return bool(flag.item())

        return self._guard("agreeing on a KV landing", go)

    def close(self) -> None:
        if self._closed:
            return
        if self._lost is None:
            try:
                self.stop_followers()
            except TPPeerLost:
                pass
        self._closed = True
        if dist.is_initialized():
            dist.destroy_process_group()
        # drop the process groups now: one destroyed at interpreter exit can abort the process
        # (its threads still joinable)
        self._data = self._ctrl = None


def resolve_backend(cfg: TPConfig, device: torch.device) -> str:
    if cfg.backend == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if cfg.backend not in ("gloo", "nccl"):
        raise ValueError(
            f"unknown tensor-parallel backend {cfg.backend!r}; valid: auto, gloo, nccl"
        )
    return cfg.backend


def join(cfg: TPConfig, device: torch.device) -> TPGroup | None:
    """Join the instance's group (rank 0 listens at init_address); None when cfg.size == 1."""
    if cfg.size < 1 or not 0 <= cfg.rank < cfg.size:
        raise ValueError(f"bad tensor-parallel rank {cfg.rank} of {cfg.size}")
    if cfg.size == 1:
        return None
    host, _, port = cfg.init_address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"init_address must be host:port, got {cfg.init_address!r}")
    if cfg.timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {cfg.timeout_s}")
    backend = resolve_backend(cfg, device)
    if dist.is_initialized():
        raise RuntimeError("this process already belongs to a process group (one rank each)")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=cfg.timeout_s)
    try:
        dist.init_process_group(
            backend,
            init_method=f"tcp://{cfg.init_address}",
            rank=cfg.rank,
            world_size=cfg.size,
            timeout=timeout,
        )
        data = dist.distributed_c10d._get_default_group()
        ctrl = data if backend == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
    except RuntimeError as exc:
        if dist.is_initialized():
            dist.destroy_process_group()
        raise TPPeerLost(
            f"tensor-parallel rendezvous of rank {cfg.rank} of {cfg.size} at {cfg.init_address} "
            f"failed within {cfg.timeout_s:g} s: {str(exc).strip().splitlines()[0][:300]}"
        ) from None
    group = TPGroup(cfg, device, data, ctrl)
    atexit.register(group.close)  # a group left open can abort the interpreter at exit
    return group
