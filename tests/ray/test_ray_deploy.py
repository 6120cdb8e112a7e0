"""`pddflow deploy --backend ray` on a real multi-node Ray cluster, started as a user would (`ray
start`: a head node and five more, each with its graph cluster's resource), in two private network
namespaces of this test module joined by a veth pair shaped by tc (nothing leaves them): the two
datacenters and a real kernel link between them. Datacenter B's two nodes are at the far end, the
others (the head, A's two, T's) at the near one, each node on an address of its own (a host as far
as Ray and pddflow can tell), so prefill and relay land on different hosts and their rdma_tensor
edge goes over tcp, and taking the link down splits the datacenters.

One cluster and one deployment of graphs/pdd.yaml for the module (the tests run in file order;
the last one stops the deployment). Every client call has a deadline: nothing can hang.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pddflow.bench.deploy_process import DeployProcess, get_json, post, post_json
from pddflow.testing.chaos import greedy_reference, wait_until
from pddflow.testing.partition import Fault, assert_settled, partition_drill
from pddflow.testing.ray_cluster import (
    NetNamespace,
    RayCluster,
    RayNode,
    VethLink,
    veth_refused,
)

pytestmark = pytest.mark.slow  # a Ray cluster of six nodes and a deployment on it

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[dev]')")
openai = pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["The relay decodes while the KV crosses the WAN.", "Hello, main decode!"]
TOKENS = 16
CLIENT_TIMEOUT_S = 60

# the head carries cluster G (one GPU, for the shortfall test); A two one-CPU nodes on hosts of
# their own (prefill and relay, one CPU each, cannot share one), B two (below); T one node of
# three CPUs, for a prefill of one rank and a decode instance of two
HEAD_IP = "10.77.0.1"
A_IPS = ("10.77.0.2", "10.77.0.3")
# cluster B's two nodes, across the link, hosts of their own so that one can be lost alone: one
# main each (the second placed at start for live scaling; which gets which is Ray's choice)
B_IPS = ("10.77.0.4", "10.77.0.6")
T_IP = "10.77.0.5"
LEASE_S = 4  # the deployment's: a 2 s split is ridden out, a 6.5 s one routed around
WAN_MBIT = 100


def _b_node(ip: str, far: str) -> RayNode:
    return RayNode({"pddflow_cluster_B": 1}, num_cpus=1, ip=ip, netns=far)


def _nodes(far: str) -> list[RayNode]:
    """The cluster; `far`: the namespace at the link's far end (datacenter B's)."""
    return [
        RayNode({"pddflow_cluster_G": 1}, num_cpus=1, num_gpus=1, ip=HEAD_IP),
        *(RayNode({"pddflow_cluster_A": 1}, num_cpus=1, ip=ip) for ip in A_IPS),
        *(_b_node(ip, far) for ip in B_IPS),
        RayNode({"pddflow_cluster_T": 1}, num_cpus=3, ip=T_IP),
    ]


BYSTANDER = """
import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

@ray.remote(num_cpus=0)
class Bystander:
    def ping(self):
        return 1

# on the head, as its placement group: Ray would put a resourceless actor anywhere, and the
# node-loss test below takes B's node down with whatever runs there
head = next(
    n["NodeID"] for n in ray.nodes() if n["Alive"] and "pddflow_cluster_G" in n["Resources"]
)
a = Bystander.options(
    name="bystander",
    namespace="not-pddflow",
    lifetime="detached",
    scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False),
).remote()
ray.get(a.ping.remote())
pg = placement_group([{"GPU": 0.1}], name="bystander", lifetime="detached")  # on the head
ray.get(pg.ready())
out = 1
"""


@pytest.fixture(scope="module")
def ray_tmp():
    # short: Ray's Unix sockets live under it (a socket path has at most 107 bytes)
    tmp = Path(tempfile.mkdtemp(prefix="pddflow-ray-", dir="/tmp"))
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def wan():
    """This module's namespace (datacenter A's end) and the veth link to B's."""
    reason = veth_refused()
    if reason is not None:
        pytest.skip(f"needs two network namespaces and a veth link for its Ray cluster: {reason}")
    ns = NetNamespace()
    link = None
    try:
        link = VethLink([HEAD_IP, *A_IPS, T_IP], list(B_IPS), mbit=WAN_MBIT)
        yield link
    finally:
        # every process in either namespace (the Ray nodes) by PID; never `ray stop`
        if link is not None:
            link.close()
        ns.close()


@pytest.fixture(scope="module")
def cluster(wan, ray_tmp):
    c = RayCluster(_nodes(wan.netns), ray_tmp)
    c.query(BYSTANDER)  # someone else's actor and placement group: stop must leave them
    return c


@pytest.fixture(scope="module")
def dep(cluster, tmp_path_factory):
    # main wired for live scaling: its second instance is placed (on B's second node), parked
    text = (ROOT / "graphs" / "pdd.yaml").read_text()
    replicas = "  replicas: {prefill: 1, relay: 1, main: 1}\n"
    scheduler = "\nscheduler:\n"
    assert replicas in text and scheduler in text and "\ndeploy:" not in text
    text = text.replace(replicas, replicas + "  max_replicas: {main: 2}\n")
    text = text.replace(scheduler, f"\ndeploy: {{lease_s: {LEASE_S}}}\n{scheduler}")
    graph = tmp_path_factory.mktemp("ray-graph") / "pdd.yaml"
    graph.write_text(text)
    d = DeployProcess(
        graph,
        None,
        "--backend",
        "ray",
        "--address",
        cluster.address,
        startup_s=240,
    )
    yield d
    d.stop()


@pytest.fixture(scope="module")
def reference():
    return greedy_reference()  # the engine `pddflow generate` runs


@pytest.fixture(scope="module")
def client(dep):
    return openai.OpenAI(
        base_url=f"{dep.base}/v1", api_key="unused", timeout=CLIENT_TIMEOUT_S, max_retries=0
    )


def _node_ids(cluster, resource: str) -> set[str]:
    return {n["id"] for n in cluster.alive_nodes() if n["resources"].get(resource)}


def test_instances_run_on_their_clusters_nodes(dep, cluster):
    h = dep.health()
    assert h["backend"] == "ray"
    w = h["workers"]
    a, b = _node_ids(cluster, "pddflow_cluster_A"), _node_ids(cluster, "pddflow_cluster_B")
    assert w["prefill/0"]["node"] in a and w["relay/0"]["node"] in a
    assert w["main/0"]["node"] in b and w["main/1"]["node"] in b
    # prefill and relay on cluster A's two hosts, each serving on its node's address; main/0 and
    # the parked main/1 (placed at start) on cluster B's two, in either order
    assert {w["prefill/0"]["node_ip"], w["relay/0"]["node_ip"]} == set(A_IPS)
    assert {w["main/0"]["node_ip"], w["main/1"]["node_ip"]} == set(B_IPS)
    for inst in ("prefill/0", "relay/0", "main/0"):
        assert w[inst]["state"] == "up"
        assert w[inst]["address"].startswith(w[inst]["node_ip"] + ":")
    # so their rdma_tensor edge is tcp, checksummed, to the relay's node address; the WAN edges
    # are TCP with TLS and the token
    assert h["channels"] == {
        "prefill.kv->relay.kv": "tcp (cross-host, checksummed)",
        "prefill.kv->main.kv": "arrow flight over TCP+TLS + token",
        "relay.handoff->main.handoff": "TCP+TLS + token",
    }
    relay = w["relay/0"]["endpoints"]
    assert relay["kv_rdma_net"].startswith(f"tcp:{w['relay/0']['node_ip']}:")
    assert "kv_rdma" not in relay  # no shared-memory receiver: no sender shares its host


ROUTES = [("p_md", None), ("p_rld_md", "one_shot"), ("p_rld_md", "catch_up")]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("route", ROUTES, ids=["p_md", "p_rld_md-one_shot", "p_rld_md-catch_up"])
def test_openai_client_gets_the_tokens_of_generate(client, reference, route, stream):
    prompt = PROMPTS[route[0] == "p_md"]
    extra = {"return_token_ids": True, "variant": route[0]}
    if route[1]:
        extra["handoff"] = route[1]
    r = client.completions.create(
        model="pdd",
        prompt=prompt,
        max_tokens=TOKENS,
        temperature=0,
        stream=stream,
        extra_body=extra,
    )
    if stream:
        ids: list[int] = []
        for chunk in r:
            ids += chunk.choices[0].model_extra.get("token_ids", [])
    else:
        ids = r.choices[0].model_extra["token_ids"]
    assert ids == reference(prompt, TOKENS)


def test_wan_edge_crosses_nodes_with_tls_and_the_token(dep):
    import json

    from pddflow.channels.errors import ChannelAuthError, ChannelError
    from pddflow.channels.security import TLSConfig, self_signed
    from pddflow.channels.wan_flight.params import WanFlightParams
    from pddflow.channels.wan_flight.sender import WanFlightSender

    h = dep.health()["workers"]
    assert h["prefill/0"]["node"] != h["main/0"]["node"]
    target = h["main/0"]["endpoints"]["kv_flight"].replace("grpc://", "grpc+tls://")
    # the frontend's key and certificate, signed by the deployment's CA (whose key never left
    # the deploying process: each instance made its own key on its node)
    d = dep.run_dir / "tls"
    tls = TLSConfig(str(d / "cert.pem"), str(d / "key.pem"), root_certs=str(d / "ca.pem"))
    token = json.loads((dep.run_dir / "wiring.json").read_text())["auth_token"]
    for guess in (None, "guess"):  # no token, a wrong one
        with WanFlightSender(target, params=WanFlightParams(token=guess, tls=tls)) as tx:
            with pytest.raises(ChannelAuthError, match="refused our credentials"):
                tx.ping(timeout_s=10)
    with WanFlightSender(target, params=WanFlightParams(token=token, tls=tls)) as tx:
        tx.ping(timeout_s=10)  # the deployment's token is let in
    # a server certificate the client's own CA did not sign is not believed, token or not
    stranger = self_signed(dep.run_dir / "stranger")
    with WanFlightSender(target, params=WanFlightParams(token=token, tls=stranger)) as tx:
        with pytest.raises(ChannelError):
            tx.ping(timeout_s=5)


def test_rdma_edge_across_hosts_wants_the_deployment_token(dep):
    import json

    import numpy as np

    from pddflow.channels.errors import ChannelAuthError
    from pddflow.channels.rdma_tensor.protocol import SharedMemoryKVParams
    from pddflow.channels.rdma_tensor.sender import SharedMemoryKVSender
    from pddflow.core.payloads import KVBlocks

    address = dep.health()["workers"]["relay/0"]["endpoints"]["kv_rdma_net"]
    # one block of 16 tokens; the relay keeps a set no request waits for only a little while
    kv = KVBlocks("not-from-prefill", [7], 0, 16, 16, np.ones((1, 1, 2, 16, 1, 8), np.float16))
    with SharedMemoryKVSender(address, params=SharedMemoryKVParams(token="guess")) as tx:
        with pytest.raises(ChannelAuthError, match="wrong token"):
            tx.send(kv, timeout_s=10)
    token = json.loads((dep.run_dir / "wiring.json").read_text())["auth_token"]
    with SharedMemoryKVSender(address, params=SharedMemoryKVParams(token=token)) as tx:
        tx.send(kv, timeout_s=10)  # let in (the relay drops a set no request waits for)
        assert tx.transport == "tcp"


@pytest.mark.parametrize(
    "fault",
    [Fault("link down 2 s (within the lease)", 2.0), Fault("link down 6.5 s (past it)", 6.5)],
    ids=["within-lease", "past-lease"],
)
def test_the_datacenters_split_and_heal(dep, wan, reference, fault):
    """The veth link down while requests are in the WAN KV transfer, the handoff, decoding on
    main and arriving (pddflow.testing.partition): every one exact or a typed error within its
    deadline; a split the lease rides out costs only the wait, a longer one is routed around main
    and main serves again after the heal; no block leaked, the mirror equals the caches."""
    dep.wait_ready()
    res = partition_drill(dep, fault, reference, split=lambda f: wan.down_for(f.seconds))
    assert_settled(res)
    if fault.seconds < LEASE_S:
        assert res.exact == res.sent and res.around_s is None, res.to_dict()
    else:
        assert res.around_s is not None and res.around_s < fault.seconds, res.to_dict()
        assert res.routed_around, res.to_dict()


def test_main_killed_mid_stream_the_stream_completes_and_main_comes_back(dep, client, reference):
    """The main actor's process is killed (its worker dies with it): the relay finishes the
    stream with the same tokens; Ray's word that the actor died reaches the supervisor, which
    makes a new actor on the same node; the next request is served by the new main."""
    prompt = "A stream whose main decode is lost halfway: " + "words " * 12
    n = 40
    w = dep.health()["workers"]["main/0"]
    old_actor = w["actor_pid"]
    stream = client.completions.create(
        model="pdd",
        prompt=prompt,
        max_tokens=n,
        temperature=0,
        stream=True,
        extra_body={"return_token_ids": True, "variant": "p_rld_md", "handoff": "catch_up"},
    )
    ids: list[int] = []
    killed = False
    for chunk in stream:
        ids += chunk.choices[0].model_extra.get("token_ids", [])
        if not killed and len(ids) >= 4:
            os.kill(old_actor, signal.SIGKILL)
            killed = time.monotonic()
    assert killed and ids == reference(prompt, n)

    def back() -> dict | None:
        m = dep.health()["workers"]["main/0"]
        return m if m["state"] == "up" and m.get("restarts", 0) >= 1 else None

    m = wait_until("main restarted and ready", back, 120)
    assert m["actor_pid"] != old_actor and "Ray actor died" in m["last_exit"]
    code, out = post_json(
        f"{dep.base}/v1/completions",
        {
            "model": "pdd",
            "prompt": "main is back",
            "max_tokens": 8,
            "temperature": 0,
            "return_token_ids": True,
            "variant": "p_md",
        },
        timeout=CLIENT_TIMEOUT_S,
    )
    assert code == 200 and out["choices"][0]["token_ids"] == reference("main is back", 8), out


def test_main_scales_onto_a_second_node_of_its_cluster_and_back_under_load(dep, reference):
    """POST /admin/pools/main 2: main/1, placed on cluster B's second node at start, starts its
    worker there and serves; 1 while a request streams on it: drained (the request ends there,
    exact), its worker stopped, its actor kept parked."""
    w = dep.health()["workers"]
    second = w["main/1"]["node_ip"]
    assert w["main/1"]["state"] == "parked" and second != w["main/0"]["node_ip"]
    assert w["main/1"]["pid"] == 0
    code, out = _scale(dep, 2)
    assert code == 200 and out["instances"] == {"main/0": "up", "main/1": "up"}, out
    assert _state(dep, "main/1")["pid"] > 0
    prompts = [f"Load on two mains, request {i}." for i in range(4)]
    with ThreadPoolExecutor(len(prompts)) as pool:  # main/0 busy: some land on main/1
        served = list(pool.map(lambda p: _served(dep, p, 24, variant="p_rld_md"), prompts))
    assert [ids for ids, _ in served] == [reference(p, 24) for p in prompts]
    assert any("main/1" in on for _, on in served), served
    # shrink while a request streams on main/1: it holds the prompt's blocks, so it gets it
    on_main1 = next(p for p, (_, on) in zip(prompts, served, strict=True) if "main/1" in on)
    result: list = []
    streaming = threading.Thread(
        target=lambda: result.append(_served(dep, on_main1, 40, variant="p_rld_md"))
    )
    streaming.start()
    wait_until("main/1 holds the leg", lambda: _state(dep, "main/1").get("legs", 0) >= 1, 30)
    code, out = _scale(dep, 1)
    streaming.join(CLIENT_TIMEOUT_S)
    assert code == 200 and out["instances"] == {"main/0": "up", "main/1": "parked"}, out
    ids, on = result[0]
    assert ids == reference(on_main1, 40) and "main/1" in on
    m = _state(dep, "main/1")
    assert m["state"] == "parked" and m["pid"] == 0 and m["node_ip"] == second


def _scale(dep, replicas: int) -> tuple[int, dict]:
    url = f"{dep.base}/admin/pools/main"
    return post_json(url, {"replicas": replicas}, timeout=CLIENT_TIMEOUT_S, key=dep.admin_key)


def _served(dep, prompt: str, n: int, **extra) -> tuple[list[int], list[str]]:
    """The answer's tokens and the instances its timeline names."""
    code, out, _ = _complete(dep, prompt, n, **extra)
    assert code == 200, out
    _, timeline = get_json(f"{dep.base}/v1/requests/{out['id']}/timeline")
    return out["choices"][0]["token_ids"], [
        e["instance"] for e in timeline["events"] if "instance" in e
    ]


def _complete(dep, prompt: str, n: int, **extra) -> tuple[int, dict, str | None]:
    """(status, body, Retry-After) of one bounded completion request."""
    body = {"model": "pdd", "prompt": prompt, "max_tokens": n, "temperature": 0}
    code, out, headers = post(
        f"{dep.base}/v1/completions",
        {**body, "return_token_ids": True, **extra},
        timeout=CLIENT_TIMEOUT_S,
    )
    return code, out, headers.get("Retry-After")


def _state(dep, instance: str) -> dict:
    return dep.health()["workers"][instance]


def test_prefill_lost_new_requests_get_503_until_it_is_back(dep, reference):
    """Prefill's worker process dies on its node: new requests get 503 with Retry-After (or,
    once it is back, their answer); the restarted prefill serves the next one exactly."""
    os.kill(_state(dep, "prefill/0")["pid"], signal.SIGKILL)
    wait_until("prefill seen lost", lambda: _state(dep, "prefill/0")["state"] != "up", 20)
    code, out, retry = _complete(dep, "prefill is down", 4)
    if code != 200:  # (it may already be back: a restart takes a few seconds)
        assert code == 503 and retry is not None, out
    wait_until("prefill back", lambda: _state(dep, "prefill/0")["state"] == "up", 120)
    code, out, _ = _complete(dep, "prefill is back", 8)
    assert code == 200 and out["choices"][0]["token_ids"] == reference("prefill is back", 8), out


def test_main_node_lost_the_relay_finishes_and_main_returns_with_a_new_node(
    dep, cluster, wan, reference
):
    """Main's whole node is lost (its raylet, actor and worker SIGKILLed, as in a power loss):
    the loss is seen within a bounded time; meanwhile the relay finishes requests, forced p_md
    too; once a node carrying cluster B joins at the same address, main is restarted there in a
    new actor and serves again, exactly."""
    old = _state(dep, "main/0")
    ip = old["node_ip"]
    assert cluster.kill_node(ip)
    wait_until("main seen lost", lambda: _state(dep, "main/0")["state"] != "up", 40)
    for variant in ("p_md", None):
        prompt = f"main's node is down ({variant})"
        code, out, _ = _complete(dep, prompt, 10, **({"variant": variant} if variant else {}))
        assert code == 200, out
        assert out["choices"][0]["token_ids"] == reference(prompt, 10)
    # the machine is back: a new Ray node on the same address
    cluster.start_node(_b_node(ip, wan.netns))

    def back() -> dict | None:
        m = _state(dep, "main/0")
        return m if m["state"] == "up" and m["node"] != old["node"] else None

    m = wait_until("main restarted on the new node", back, 180)
    assert m["node_ip"] == ip and m["actor_pid"] != old["actor_pid"]
    code, out, _ = _complete(dep, "main's node is back", 8, variant="p_md")
    assert code == 200, out
    assert out["choices"][0]["token_ids"] == reference("main's node is back", 8)


def test_graph_needing_more_gpus_than_its_cluster_fails_before_starting(cluster, tmp_path):
    """Cluster G (the head node: one GPU) is asked for prefill's and relay's 4 GPUs each."""
    text = (ROOT / "graphs" / "pdd.yaml").read_text()
    text = text.replace("  A: {devices", "  G: {devices").replace("cluster: A", "cluster: G")
    # the production layout, 4 ranks an instance: the local profile's one-rank line goes
    one_rank = "  devices_per_replica: {prefill: 1, relay: 1, main: 1}\n"
    assert one_rank in text
    text = text.replace(one_rank, "")
    graph = tmp_path / "pdd_on_g.yaml"
    graph.write_text(text.replace("A-B:", "G-B:"))
    before = cluster.actors_and_groups()
    r = subprocess.run(
        [sys.executable, "-m", "pddflow.cli", "deploy", str(graph), "--backend", "ray"]
        + ["--address", cluster.address, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    line = next(x for x in r.stderr.splitlines() if "needs GPU" in x)
    where = f"{graph}:{text.splitlines().index('  G: {devices: {gpu_a: 48}}') + 1}:3: "
    assert line.startswith(where), r.stderr
    assert "cluster 'G' needs GPU: 8" in line and "have 1: 7 missing" in line, line
    assert cluster.actors_and_groups() == before  # nothing was started


def test_an_instance_of_two_ranks_runs_on_one_node_exactly(cluster, reference, tmp_path):
    """same_dc_pd.yaml on cluster T with the local layout {prefill: 1, decode: 2}: decode is one
    bundle of 2 CPUs, both ranks on T's node; prefill's KV goes rank to rank over tcp (the edge
    asks it), each decode rank on a port of its own; the tokens of `generate` at TP 1, and a stop
    that leaves nothing."""
    text = (ROOT / "graphs" / "same_dc_pd.yaml").read_text()
    one = "devices_per_replica: {prefill: 1, decode: 1}"
    edge = "channel: rdma_tensor}"
    assert one in text and edge in text
    text = text.replace(one, "devices_per_replica: {prefill: 1, decode: 2}")
    text = text.replace(edge, "channel: rdma_tensor, params: {transport: tcp}}")
    text = text.replace("  A: {devices", "  T: {devices").replace("cluster: A", "cluster: T")
    graph = tmp_path / "pd_tp2.yaml"
    graph.write_text(text)
    d = DeployProcess(graph, None, "--backend", "ray", "--address", cluster.address, startup_s=240)
    try:
        w = d.health()["workers"]["decode/0"]
        assert [r["rank"] for r in w["ranks"]] == [0, 1], w
        assert {r["node"] for r in w["ranks"]} == {T_IP} and all(r["pid"] for r in w["ranks"])
        (rank1,) = w["endpoints"]["kv_rdma_ranks"]
        assert rank1.startswith(f"tcp:{T_IP}:") and rank1 != w["endpoints"]["kv_rdma_net"], w
        deployment = w["actor"].split("/", 1)[1].split(":")[0]
        for prompt in PROMPTS:
            code, out, headers = post(
                f"{d.base}/v1/completions",
                {
                    "model": "same_dc_pd",
                    "prompt": prompt,
                    "max_tokens": TOKENS,
                    "temperature": 0,
                    "return_token_ids": True,
                },
                timeout=CLIENT_TIMEOUT_S,
            )
            assert code == 200, out
            assert out["choices"][0]["token_ids"] == reference(prompt, TOKENS)
            rid = headers["x-request-id"]
            _, timeline = get_json(f"{d.base}/v1/requests/{rid}/timeline")
            landed = [e for e in timeline["events"] if e["event"] == "kv_landed"]
            assert [e["ranks_own_heads"] for e in landed] == [1.0], timeline
    finally:
        out = d.stop()
    assert d.proc.returncode == 0, out
    left = cluster.actors_and_groups()
    assert not [a for a in left["actors"] if deployment in a["name"]], left
    assert not [g for g in left["groups"] if deployment in g["name"]], left


def test_stop_removes_every_actor_group_and_process_it_made_and_nothing_else(dep, cluster):
    deployment = dep.health()["workers"]["main/0"]["actor"].split("/", 1)[1].split(":")[0]
    out = dep.stop()
    assert dep.proc.returncode == 0, out
    left = cluster.actors_and_groups()
    assert not [a for a in left["actors"] if deployment in a["name"]], left
    assert not [g for g in left["groups"] if deployment in g["name"]], left
    # someone else's actor and placement group are still there
    assert [a["name"] for a in left["actors"]] == ["bystander"], left
    assert [g["name"] for g in left["groups"]] == ["bystander"], left
    mine = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and deployment in (p / "cmdline").read_bytes().decode(
                errors="replace"
            ):
                mine.append(int(p.name))
        except OSError:
            continue
    assert mine == []
    # the Ray cluster itself is healthy (main's node was lost and started again: as many live)
    assert len(cluster.alive_nodes()) == len(cluster.nodes)
    assert cluster.query("out = ray.get(ray.remote(lambda: 41 + 1).remote())") == 42
