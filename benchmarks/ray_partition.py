"""Partition drills on a real kernel link: `pddflow deploy --backend ray` on a Ray cluster of two
network namespaces, one per datacenter, joined by a veth pair shaped by `tc` tbf
(`pddflow.testing.ray_cluster.VethLink`). Cluster A's node (the head: the driver with the
frontend, prefill and relay) is on one end, cluster B's (main) on the other; a split takes the link
down (`ip link set ... down`) and back up. The drills are `pddflow.testing.partition`'s, with the
graph's lease set by --lease-s. Needs root (unshare --net, ip, tc) and the ray extra.

    python benchmarks/ray_partition.py [--split-s 2 7] [--lease-s 3] [--mbit 100] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from pddflow.bench.deploy_process import DeployProcess
from pddflow.testing.chaos import greedy_reference
from pddflow.testing.partition import Fault, partition_drill, results_table
from pddflow.testing.ray_cluster import (
    NetNamespace,
    RayCluster,
    RayNode,
    VethLink,
    veth_refused,
)

ROOT = Path(__file__).resolve().parents[1]
A_IP, B_IP = "10.77.0.1", "10.77.0.2"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split-s", type=float, nargs="+", default=[2.0, 7.0])
    ap.add_argument("--lease-s", type=float, default=3.0, help="the deployment's lease")
    ap.add_argument("--mbit", type=int, default=100, help="the veth link's rate (tc tbf)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not all(0 < s <= 600 for s in a.split_s) or a.lease_s <= 0 or a.mbit <= 0:
        ap.error("--split-s in (0, 600] seconds, --lease-s and --mbit > 0")
    reason = veth_refused()
    if reason is not None:
        sys.exit(f"error: this needs two network namespaces joined by a veth pair: {reason}")
    tmp = Path(tempfile.mkdtemp(prefix="pddflow-rayp-", dir="/tmp"))  # Ray's socket paths
    ns = NetNamespace()
    link, rows = None, []
    try:
        link = VethLink([A_IP], [B_IP], mbit=a.mbit)
        nodes = [
            RayNode({"pddflow_cluster_A": 1}, num_cpus=2, ip=A_IP),
            RayNode({"pddflow_cluster_B": 1}, num_cpus=1, ip=B_IP, netns=link.netns),
        ]
        print("starting the Ray cluster (two namespaces)", file=sys.stderr)
        cluster = RayCluster(nodes, tmp)
        text = (ROOT / "graphs" / "pdd.yaml").read_text()
        graph = tmp / "pdd.yaml"
        lease = f"\ndeploy: {{lease_s: {a.lease_s:g}}}\n\nscheduler:\n"
        graph.write_text(text.replace("\nscheduler:\n", lease, 1))
        dep = DeployProcess(graph, None, "--backend", "ray", "--address", cluster.address)
        try:
            workers = dep.health()["workers"]
            placed = {i: w["node_ip"] for i, w in workers.items()}
            assert placed["main/0"] == B_IP and placed["prefill/0"] == A_IP, placed
            reference = greedy_reference()
            for s in a.split_s:
                print(f"drill: link down {s:g} s", file=sys.stderr)
                fault = Fault(f"link down {s:g} s", s)
                rows.append(
                    partition_drill(dep, fault, reference, split=lambda f: link.down_for(f.seconds))
                )
        finally:
            dep.stop()
    finally:
        if link is not None:
            link.close()
        ns.close()
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
        return
    print(f"lease {a.lease_s:g} s, veth at {a.mbit} Mbit/s\n")
    print(results_table(rows))


if __name__ == "__main__":
    main()
