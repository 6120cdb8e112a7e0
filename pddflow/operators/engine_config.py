"""The engine's settings (`EngineConfig`, re-exported by engine.py) and how they resolve to a device
and dtype (torch is imported by these functions only: a modeled engine reads the settings
without it)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pddflow.core.host_memory import keep_freed_memory
from pddflow.kernels import DEFAULT_TILE

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class EngineConfig:
    block_size: int = 16  # tokens per KV block: the unit of paging, caching and transfer
    # the KV pool of the whole instance, counted in full-model bytes (all KV heads): at any
    # tensor-parallel degree it holds kv_cache_bytes // engine.block_bytes blocks
    kv_cache_bytes: int = 512 * 2**20
    chunk_size: int = 512  # most token rows per prefill/extend forward
    max_decode_rows: int = 256  # most sequences per decode forward (bigger batches split)
    attention_tile: int = DEFAULT_TILE
    prefix_cache: bool = True
    device: str = "auto"  # auto | cpu | cuda
    tune_host_malloc: bool = True  # CPU: let glibc recycle large freed buffers (host_memory)
    # torch threads, process-wide; set it when workers share a machine (OpenMP stalls otherwise).
    # None: torch's default, or at tensor parallelism N on CPU, usable cores // N per rank
    num_threads: int | None = None
    dtype: str | None = None  # None: fp32 on CPU, bf16 on CUDA; or float32/bfloat16/float16
    # tensor parallel over a mixture of experts: each rank keeps whole experts (num_experts /
    # ranks of them) instead of a slice of every expert; attention stays split by heads
    expert_parallel: bool = False
    # tiers under the prefix cache (kv_tiers.py): host memory and local disk, whole-model bytes;
    # the disk tier's directory, and whether its arena outlives the engine's close()
    host_cache_bytes: int = 0
    disk_cache_bytes: int = 0
    disk_cache_dir: str = ""
    disk_cache_persist: bool = False


DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}


def resolve_device(config: EngineConfig) -> torch.device:
    import torch

    if config.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(config.device)


def cuda_devices() -> int:
    """The CUDA devices this process sees; 0 without asking torch on a host with no GPU driver
    (neither NVIDIA's nor ROCm's device node), so that a process that only places ranks (the
    deployer) does not import torch to learn it."""
    if not any(os.path.exists(node) for node in ("/dev/nvidiactl", "/dev/kfd")):
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def rank_device(rank: int, device: str = "auto", gpus: int | None = None) -> str:
    """The device tensor-parallel rank `rank` computes on, for an engine configured for `device`
    on a process that sees `gpus` CUDA devices (default: as many as torch sees): the
    (rank mod gpus)-th GPU when the engine runs on CUDA ("auto" or "cuda" with a GPU here), else
    the configured device, the CPU by default. Every follower, deployed or local, starts here."""
    if gpus is None:
        gpus = cuda_devices()
    if device == "auto":
        device = "cuda" if gpus else "cpu"
    if device.split(":")[0] != "cuda":
        return device
    return f"cuda:{rank % gpus}" if gpus else "cpu"


def resolve_dtype(config: EngineConfig, device: torch.device) -> torch.dtype:
    import torch

    if config.dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    elif config.dtype in DTYPES:
        dtype = getattr(torch, DTYPES[config.dtype])
    else:
        raise ValueError(f"unknown dtype {config.dtype!r}; valid: {', '.join(sorted(DTYPES))}")
    if device.type == "cpu" and dtype != torch.float32:
        raise ValueError("the CPU path computes in float32 only")
    return dtype


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def prepare(
    config: EngineConfig, rank_device: torch.device | None = None, tp_size: int = 1
) -> tuple[torch.device, torch.dtype]:
    """Check the settings and set up the process (glibc, torch threads) for an engine; its device
    (a tensor-parallel rank's own when given) and dtype."""
    import torch

    device = rank_device if rank_device is not None else resolve_device(config)
    if rank_device is not None and config.device != "auto":
        if torch.device(config.device).type != rank_device.type:
            raise ValueError(f"EngineConfig.device {config.device!r} but the rank's is {device}")
    dtype = resolve_dtype(config, device)
    if config.block_size <= 0 or config.attention_tile % config.block_size:
        raise ValueError(
            f"attention_tile ({config.attention_tile}) must be a positive multiple of "
            f"block_size ({config.block_size})"
        )
    if device.type == "cpu" and config.tune_host_malloc:
        keep_freed_memory()
    if config.num_threads is not None:
        if config.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {config.num_threads}")
        torch.set_num_threads(config.num_threads)
    elif tp_size > 1 and device.type == "cpu":
        # the ranks of one instance share this machine's cores: never oversubscribe them
        torch.set_num_threads(max(1, usable_cores() // tp_size))
    return device, dtype
