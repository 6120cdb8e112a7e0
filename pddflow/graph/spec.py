"""The graph file format (`pddflow: 1`) as pydantic models: the schema stage of validation and
the source of `pddflow schema`'s JSON Schema. Every field carries its help text."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ArchNumbers(_Strict):
    kv_bytes_per_token: int = Field(
        gt=0, description="KV cache bytes per token, all layers, K and V"
    )
    flops_per_token: float = Field(
        gt=0, description="forward FLOPs per token (about 2 x active params)"
    )
    weight_bytes: int = Field(gt=0, description="bytes of all weights at the serving dtype")
    attn_flops_per_pair: float = Field(
        0.0,
        ge=0,
        description="attention FLOPs per (query, key) pair, all layers "
        "(4 x layers x query heads x head_dim); 0: 8 x kv_bytes_per_token",
    )


class ModelSpec(_Strict):
    weights: str = Field(
        description="what `deploy` loads: `builtin:tiny-llama`, a local HF checkpoint directory "
        "(relative to the graph file) or a Hugging Face Hub id `owner/name`"
    )
    arch: str | ArchNumbers = Field(
        description="what `plan` and `simulate` assume: a preset name "
        "(see `pddflow schema --list`) or inline numbers"
    )
    max_context: int = Field(
        131072, gt=0, description="longest prompt + output a request may have, in tokens"
    )
    block_size: int = Field(16, gt=0, description="tokens per KV block")


class LocalProfile(_Strict):
    replicas: dict[str, int] = Field(
        default_factory=dict,
        description="operator name -> processes on one machine (default 1 each)",
    )
    max_replicas: dict[str, int] = Field(
        default_factory=dict,
        description="operator name -> most instances live scaling may run (POST "
        "/admin/pools/OPERATOR on a deployment); default: replicas, no scaling",
    )
    devices_per_replica: dict[str, int] = Field(
        default_factory=dict,
        description="operator name -> rank processes (tensor-parallel degree) of each instance "
        "deployed, at most the operator's devices_per_replica (default: that, all of them)",
    )
    cache_mib: dict[str, LocalCacheSpec] = Field(
        default_factory=dict,
        description="operator name -> sizes on one machine, MiB: its device KV pool (kv) and "
        "the host_cache / disk_cache tiers it declares (host, disk)",
    )
    scheduler: dict[str, Any] = Field(
        default_factory=dict,
        description="policy parameters on one machine, over scheduler.params (thresholds in "
        "tokens scaled to the built-in model's context, e.g. singular_min_prompt_tokens)",
    )


class DeviceClassSpec(_Strict):
    tflops: float = Field(gt=0, description="dense peak TFLOPS at the serving dtype")
    hbm_gib: float = Field(gt=0, description="memory capacity, GiB")
    hbm_tbps: float = Field(gt=0, description="memory bandwidth, TB/s")
    net_gbps: float = Field(gt=0, description="interconnect (RDMA) bandwidth per device, Gbps")
    usd_per_hour: float = Field(ge=0, description="price per device-hour, for cost and BCR")


class ClusterSpec(_Strict):
    devices: dict[str, int] = Field(description="device class -> how many devices this cluster has")
    rdma_gbps: float | None = Field(
        None, gt=0, description="intra-cluster fabric bandwidth (default: the devices' net_gbps)"
    )


class JitterSpec(_Strict):
    dist: Literal["lognormal", "normal", "constant"] = Field(
        "lognormal", description="shape of the extra delay"
    )
    p50_ms: float = Field(0.0, ge=0, description="median extra delay per transfer, ms")
    p99_ms: float = Field(0.0, ge=0, description="99th percentile extra delay per transfer, ms")


class LinkSpec(_Strict):
    between: list[str] | None = Field(
        None,
        min_length=2,
        max_length=2,
        description="the two clusters (default: the name split at '-')",
    )
    gbps: float = Field(gt=0, description="bandwidth available to this deployment, Gbps")
    rtt_ms: float = Field(0.0, ge=0, description="round-trip time, ms")
    jitter: JitterSpec = Field(
        default_factory=JitterSpec, description="per-transfer extra delay distribution"
    )
    tcp_window_mib: float = Field(
        8.0,
        gt=0,
        description="TCP window one stream may have in flight, MiB; a stream sustains at most "
        "window/RTT (8 MiB at 30 ms: 2.24 Gbps)",
    )
    stream_gbps: float | None = Field(
        None,
        ge=0,
        description="what one TCP stream sustains, Gbps (default: tcp_window_mib / rtt_ms; "
        "0: no per-stream limit); a wan_flight transfer gets at most its streams x this",
    )


class ShapeSpec(_Strict):
    device: str | None = Field(None, description="device class (default: the operator's)")
    devices_per_replica: int | None = Field(
        None, ge=1, description="devices one replica spans (default: the operator's)"
    )


class HostCacheSpec(_Strict):
    """A host-memory tier under an operator's prefix/radix cache: blocks evicted from HBM move
    here (LRU) and a later hit on them is loaded back at `gbytes_per_s` (docs/simulator.md)."""

    gib: float = Field(
        ge=0, description="host memory for KV per replica, GiB (0: no tier; `size` may raise it)"
    )
    max_gib: float | None = Field(
        None,
        ge=0,
        description="the most `pddflow size` may buy per replica, GiB (default: gib)",
    )
    usd_per_gib_hour: float = Field(
        ge=0, description="price of one GiB of host memory for an hour, for cost and BCR"
    )
    gbytes_per_s: float = Field(
        25.0,
        gt=0,
        description="host-to-HBM bandwidth of one replica, GB/s (default 25: one PCIe Gen4 x16 "
        "link's effective rate); concurrent loads take turns on it",
    )


class DiskCacheSpec(_Strict):
    """A local-disk tier under an operator's prefix/radix cache, below `host_cache` when both are
    declared: every block the device caches is written through, so a restarted worker re-opens
    it (docs/engine.md, Tiered cache)."""

    gib: float = Field(gt=0, description="disk for KV per replica, GiB")
    usd_per_gib_hour: float = Field(
        0.0, ge=0, description="price of one GiB of local disk for an hour, for cost and BCR"
    )
    gbytes_per_s: float = Field(
        5.0, gt=0, description="disk-to-HBM bandwidth of one replica, GB/s (default 5: one NVMe)"
    )
    dir: str | None = Field(
        None,
        description="directory of the instances' arenas (one subdirectory each); default: the "
        "deployment's run directory, removed when it stops",
    )
    persist: bool = Field(
        False,
        description="keep the arenas after `stop` (needs `dir`): a later deployment of the same "
        "model re-opens them; false: no file is left",
    )


class LocalCacheSpec(_Strict):
    kv: float | None = Field(
        None, gt=0, description="the device KV pool, MiB (default: deploy --kv-cache-mb)"
    )
    host: float | None = Field(None, gt=0, description="the host_cache tier, MiB (default 64)")
    disk: float | None = Field(None, gt=0, description="the disk_cache tier, MiB (default 256)")


class OperatorSpec(_Strict):
    op: str = Field(
        description="operator type (prefill, relay_decode, main_decode, decode, colocated, "
        "or a plugin's)"
    )
    cluster: str = Field(description="cluster the replicas run in")
    device: str = Field(description="device class each replica runs on")
    replicas: int = Field(1, ge=1, description="instances in the production topology")
    devices_per_replica: int = Field(
        1, ge=1, description="devices one replica spans (tensor parallel degree)"
    )
    params: dict[str, Any] = Field(
        default_factory=dict, description="operator-type parameters (see docs/graph-reference.md)"
    )
    choices: list[ShapeSpec] = Field(
        default_factory=list,
        description="other shapes `pddflow size` may give each replica (device class and/or "
        "devices_per_replica, in the operator's cluster); the declared one is always a candidate",
    )
    host_cache: HostCacheSpec | None = Field(
        None,
        description="a priced host-memory KV tier under this operator's prefix/radix cache",
    )
    disk_cache: DiskCacheSpec | None = Field(
        None, description="a local-disk KV tier under the cache (and under host_cache)"
    )


class EdgeSpec(_Strict):
    from_: str = Field(alias="from", description="source `operator.port`")
    to: str = Field(description="destination `operator.port`")
    channel: str = Field(
        description="channel kind: rdma_tensor, wan_flight, token_ids, local, or a plugin's"
    )
    link: str | None = Field(
        None, description="link this edge crosses (default: the one joining the two clusters)"
    )
    params: dict[str, Any] = Field(default_factory=dict, description="channel parameters")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class VariantSpec(_Strict):
    path: list[str] = Field(
        min_length=1,
        description="operators a request visits, a prefilling operator first, a decoder last",
    )
    handoff: Literal["one_shot", "catch_up", "adaptive"] | None = Field(
        None, description="relay -> main handoff mode; required when the path has a relay"
    )
    singular_traffic: StrictBool = Field(
        False,
        description="marks the one allowed path that ends at the relay "
        "(rare long-input, short-output requests)",
    )
    expected_share: float | None = Field(
        None,
        ge=0,
        le=1,
        description="planning only: the share of requests expected on this variant",
    )


class SlaSpec(_Strict):
    ttft_s: float = Field(5.0, gt=0, description="time to first token a request must meet")
    tpot_ms: float = Field(50.0, gt=0, description="time per output token a request must meet")


class SchedulerSpec(_Strict):
    policy: str = Field(
        "predicted_hit_rate",
        description="policy name (predicted_hit_rate, uncached_threshold, first_variant)",
    )
    sla: SlaSpec = Field(default_factory=SlaSpec)
    params: dict[str, Any] = Field(default_factory=dict, description="policy parameters")


class DeploySpec(_Strict):
    backend: Literal["local", "ray"] = Field(
        "local",
        description="where `pddflow deploy` runs the instances: local (processes on this "
        "machine) or ray (actors on a Ray cluster; docs/deploy-ray.md); --backend wins",
    )
    address: str | None = Field(
        None, description="Ray cluster address (ray backend; default: RAY_ADDRESS or 'auto')"
    )
    namespace: str = Field(
        "pddflow", min_length=1, description="Ray namespace of the deployment's actors"
    )
    bind: Literal["node", "all"] = Field(
        "node",
        description="ray backend: endpoints listen on the node's address (node) or on every "
        "interface (all: 0.0.0.0; they are still published with the node's address)",
    )
    accelerators: dict[str, str] = Field(
        default_factory=dict,
        description="device class -> Ray accelerator type (e.g. H100) its instances require",
    )
    frontend_cluster: str | None = Field(
        None,
        description="the cluster the API frontend and the deployer run in (default: the first "
        "cluster); control and report connections to the others cross their link",
    )
    lease_s: float = Field(
        10.0,
        gt=0,
        description="the frontend's lease on each worker's legs: a side that hears nothing from "
        "the other for this long gives the legs up (docs/runtime.md, Leases)",
    )


class AutoscaleSpec(_Strict):
    enabled: bool = Field(
        False,
        description="the planner resizes pools while `deploy` serves (deploy --planner / "
        "--no-planner win); `simulate --planner` runs it whatever this says",
    )
    min_replicas: dict[str, int] = Field(
        default_factory=dict,
        description="operator name -> fewest replicas in production (simulate; default 1); "
        "the most is the operator's replicas. Deploy scales within 1..local.max_replicas",
    )
    interval_s: float = Field(5.0, gt=0, description="seconds between the planner's decisions")
    target_utilization: float = Field(
        0.7,
        gt=0,
        le=1,
        description="the share of a pool's capacity within the SLA it is sized to use",
    )
    scale_down_after_s: float = Field(
        30.0,
        ge=0,
        description="a pool shrinks after this long of lower load, and this long "
        "after its last change (hysteresis)",
    )
    startup_s: float = Field(
        60.0, ge=0, description="simulate: seconds a new replica takes to serve (weights loading)"
    )


class GraphSpec(_Strict):
    pddflow: Literal[1] = Field(description="format version; always 1")
    name: str = Field(min_length=1, description="the deployment's name")
    description: str = Field("", description="free text")
    model: ModelSpec
    local: LocalProfile = Field(
        default_factory=LocalProfile, description="the embedded profile: one machine"
    )
    device_classes: dict[str, DeviceClassSpec] = Field(min_length=1)
    clusters: dict[str, ClusterSpec] = Field(min_length=1)
    links: dict[str, LinkSpec] = Field(default_factory=dict)
    operators: dict[str, OperatorSpec] = Field(min_length=1)
    edges: list[EdgeSpec] = Field(default_factory=list)
    variants: dict[str, VariantSpec] = Field(min_length=1)
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    deploy: DeploySpec = Field(
        default_factory=DeploySpec, description="how `pddflow deploy` runs the graph"
    )
    autoscale: AutoscaleSpec = Field(
        default_factory=AutoscaleSpec,
        description="the planner: pools follow the load (docs/runtime.md, The planner)",
    )


def json_schema() -> dict[str, Any]:
    schema = GraphSpec.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "pddflow graph (pddflow: 1)"
    return schema
