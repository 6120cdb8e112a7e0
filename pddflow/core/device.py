"""Device classes: an accelerator judged on PDD's four dimensions, plus its price."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3
# `pddflow deploy --kv-cache-mb` default; the simulator's replay of a deployment uses it too
LOCAL_KV_CACHE_MIB = 256
LOCAL_HOST_CACHE_MIB = 64  # a declared host_cache tier on one machine (local.cache_mib wins)
LOCAL_DISK_CACHE_MIB = 256  # and a disk_cache tier


@dataclass(frozen=True)
class DeviceClass:
    name: str
    tflops: float  # dense peak at the serving dtype
    hbm_gib: float
    hbm_tbps: float  # memory bandwidth, TB/s
    net_gbps: float  # interconnect (RDMA NIC) bandwidth per device
    usd_per_hour: float  # price, for cost and BCR

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gib * GIB
