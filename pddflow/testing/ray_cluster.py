"""A multi-node Ray cluster on this machine, started the way a user would (`ray start`), inside a
private network namespace of its own (`unshare --net`, loopback up): every Ray and pddflow address
is the namespace's own and no traffic leaves it. The thread that enters the namespace (pytest's
main thread) and everything it starts afterwards live in it, until `close()` takes it back out.
A second namespace joined to it by a veth pair (`VethLink`) is a second datacenter: nodes started
there talk to the others over a real kernel link that can be shaped and taken down.

Stopping never uses `ray stop` (which stops every Ray process on the machine, others' included):
every process in the namespaces is this cluster's, and those are ended by PID.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

CLONE_NEWNET = 0x40000000
HEAD_PORT = 6379


def _setns(fd: int) -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def unshare_refused() -> str | None:
    """Why a private network namespace cannot be made here (None: it can)."""
    if sys.platform != "linux":
        return "network namespaces are Linux-only"
    try:
        r = subprocess.run(
            ["unshare", "--net", "ip", "link", "set", "lo", "up"],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare --net is not available: {exc}"
    if r.returncode != 0:
        return f"unshare --net is not permitted here: {r.stderr.decode(errors='replace').strip()}"
    return None


def veth_refused() -> str | None:
    """Why two namespaces joined by a shaped veth pair (`VethLink`) cannot be made here."""
    missing = [cmd for cmd in ("nsenter", "tc") if shutil.which(cmd) is None]
    if missing:
        return f"{' and '.join(missing)} not found (util-linux, iproute2)"
    return unshare_refused()


def _ns_inode(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _hold_namespace() -> tuple[subprocess.Popen, str | None]:
    """A process holding a fresh network namespace, and the namespace's inode."""
    holder = subprocess.Popen(["unshare", "--net", "sleep", "infinity"])
    mine = _ns_inode("thread-self")
    deadline = time.monotonic() + 10
    while _ns_inode(holder.pid) in (None, mine):
        if time.monotonic() > deadline or holder.poll() is not None:
            holder.kill()
            raise OSError("unshare --net did not make a namespace")
        time.sleep(0.02)
    return holder, _ns_inode(holder.pid)


class NetNamespace:
    """Enter a fresh network namespace on the calling thread (loopback up)."""

    def __init__(self) -> None:
        self.home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        self.holder, self.inode = _hold_namespace()
        fd = os.open(f"/proc/{self.holder.pid}/ns/net", os.O_RDONLY)
        try:
            _setns(fd)
        finally:
            os.close(fd)
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=10)

    def processes(self) -> list[int]:
        """Every process in the namespace but this one and the holder."""
        mine = (os.getpid(), self.holder.pid)
        return [pid for pid in _processes(self.inode) if pid not in mine]

    def close(self) -> None:
        _end(self.processes)
        _setns(self.home)
        os.close(self.home)
        self.holder.kill()
        self.holder.wait(timeout=5)


class VethLink:
    """A second network namespace joined to the calling thread's by a veth pair: two datacenters
    and the link between them, a real kernel link. `a_ips` are the near end's addresses, `b_ips`
    the far end's (one subnet, /24); both ends are shaped by `tc` tbf to `mbit` (this kernel has
    no netem: delay stays in pddflow's own emulation). `down()` splits the datacenters (both
    ways: the link carries nothing), `up()` heals them. A `RayNode` whose `netns` is `netns` runs
    at the far end."""

    A_DEV, B_DEV = "pddflowA", "pddflowB"

    def __init__(self, a_ips: list[str], b_ips: list[str], mbit: int = 200):
        self.holder, self.inode = _hold_namespace()
        self.netns = f"/proc/{self.holder.pid}/ns/net"
        far = _in_namespace(self.netns)
        shape = ["root", "tbf", "rate", f"{mbit}mbit", "burst", "256kb", "latency", "400ms"]
        for argv in (
            ["ip", "link", "add", self.A_DEV, "type", "veth", "peer", "name", self.B_DEV],
            ["ip", "link", "set", self.B_DEV, "netns", str(self.holder.pid)],
            *(["ip", "addr", "add", f"{ip}/24", "dev", self.A_DEV] for ip in a_ips),
            ["ip", "link", "set", self.A_DEV, "up"],
            ["tc", "qdisc", "add", "dev", self.A_DEV, *shape],
            far + ["ip", "link", "set", "lo", "up"],
            *(far + ["ip", "addr", "add", f"{ip}/24", "dev", self.B_DEV] for ip in b_ips),
            far + ["ip", "link", "set", self.B_DEV, "up"],
            far + ["tc", "qdisc", "add", "dev", self.B_DEV, *shape],
        ):
            subprocess.run(argv, check=True, timeout=10, capture_output=True)

    def down(self) -> None:
        subprocess.run(["ip", "link", "set", self.A_DEV, "down"], check=True, timeout=10)

    def up(self) -> None:
        subprocess.run(["ip", "link", "set", self.A_DEV, "up"], check=True, timeout=10)

    def down_for(self, seconds: float) -> None:
        """Split now and heal `seconds` later (on a timer thread: this returns at once)."""
        self.down()
        threading.Timer(seconds, self.up).start()

    def close(self) -> None:
        """End every process in the far namespace (by PID), then the namespace."""
        _end(lambda: [p for p in _processes(self.inode) if p != self.holder.pid])
        self.holder.kill()
        self.holder.wait(timeout=5)


@dataclass
class RayNode:
    resources: dict[str, float] = field(default_factory=dict)
    num_cpus: int = 1
    num_gpus: int = 0
    # its node IP: another address of the namespace (127.0.0.2, ..., or one on a VethLink) is
    # another "host", whose processes bind and are reached there
    ip: str = "127.0.0.1"
    netns: str | None = None  # another network namespace to run it in (VethLink.netns)


class RayCluster:
    """`ray start --head` plus `ray start --address` for every further node, each on its node's
    address in the current network namespace (or its own `netns`), their files under
    `temp_dir`."""

    def __init__(self, nodes: list[RayNode], temp_dir: Path, timeout_s: float = 120.0):
        self.address = f"{nodes[0].ip}:{HEAD_PORT}"
        self.temp_dir = temp_dir
        self.nodes = nodes
        # one at a time: `ray start`s run at once on one machine time out waiting for their
        # raylets
        for i, node in enumerate(nodes):
            self.start_node(node, head=i == 0, timeout_s=timeout_s)
        self.wait_nodes(len(nodes), timeout_s)

    def start_node(self, node: RayNode, head: bool = False, timeout_s: float = 120.0) -> None:
        """`ray start` for one node (again, after `kill_node`: a new Ray node on the same
        address)."""
        ray = str(Path(sys.executable).with_name("ray"))
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        env.pop("RAY_ADDRESS", None)
        argv = [
            *(_in_namespace(node.netns) if node.netns else ()),
            ray,
            "start",
            *(("--head", f"--port={HEAD_PORT}") if head else (f"--address={self.address}",)),
            f"--node-ip-address={node.ip}",
            f"--num-cpus={node.num_cpus}",
            f"--num-gpus={node.num_gpus}",
            f"--resources={json.dumps(node.resources)}",
            "--object-store-memory=80000000",
            f"--temp-dir={self.temp_dir}",
            "--disable-usage-stats",
            *(("--include-dashboard=false",) if head else ()),
        ]
        r = subprocess.run(argv, capture_output=True, env=env, timeout=timeout_s)
        if r.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} failed ({r.returncode}):\n"
                f"{r.stdout.decode(errors='replace')}\n{r.stderr.decode(errors='replace')}"
            )

    def kill_node(self, ip: str) -> list[int]:
        """SIGKILL every process of the (non-head) node on `ip`, as if its machine lost power:
        its raylet and every process under it (the actors, their workers), and its agents. The
        pids killed."""
        procs: dict[int, tuple[int, str]] = {}
        for ns in {"/proc/thread-self/ns/net", *(n.netns for n in self.nodes if n.netns)}:
            procs |= _processes(os.readlink(ns))
        mark = re.compile(rf"node[_-]ip[_-]address[= ]{re.escape(ip)}(\s|$)")
        doomed = {pid for pid, (_, cmd) in procs.items() if mark.search(cmd)}
        grew = True
        while grew:  # every descendant
            more = {pid for pid, (ppid, _) in procs.items() if ppid in doomed} - doomed
            doomed |= more
            grew = bool(more)
        for pid in doomed:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return sorted(doomed)

    def query(self, code: str, timeout_s: float = 60.0) -> object:
        """Run `code` (which sets `out`) in a fresh Ray driver connected to the cluster; out as
        JSON. A separate process, so this one never becomes a Ray driver."""
        script = (
            "import json, ray\n"
            f"ray.init(address={self.address!r}, logging_level='ERROR', log_to_driver=False)\n"
            f"{code}\n"
            "print('@@' + json.dumps(out))\n"
        )
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        r = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, env=env, timeout=timeout_s
        )
        for line in r.stdout.decode().splitlines():
            if line.startswith("@@"):
                return json.loads(line[2:])
        raise RuntimeError(f"query failed ({r.returncode}): {r.stderr.decode()[-2000:]}")

    def alive_nodes(self) -> list[dict]:
        return self.query(
            "out = [{'id': n['NodeID'], 'resources': n['Resources']} "
            "for n in ray.nodes() if n['Alive']]"
        )

    def wait_nodes(self, n: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.alive_nodes()) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Ray cluster did not reach {n} live nodes")
            time.sleep(1)

    def actors_and_groups(self) -> dict:
        """Live actors (name, class, state) and placement groups not removed, each list sorted
        (Ray lists them in no fixed order)."""
        out = self.query(
            "from ray._private.state import actors\n"
            "from ray.util import placement_group_table\n"
            "out = {'actors': [{'name': a.get('Name', ''), 'class': a['ActorClassName'],"
            " 'state': a['State']} for a in actors().values() if a['State'] != 'DEAD'],"
            " 'groups': [{'name': g.get('name', ''), 'state': g['state']} for g in "
            "placement_group_table().values() if g['state'] != 'REMOVED']}"
        )
        return {k: sorted(v, key=lambda x: sorted(x.items())) for k, v in out.items()}


def _end(processes: Callable[[], list[int]], wait_s: float = 5.0) -> None:
    """SIGTERM every pid `processes()` lists, then SIGKILL those left after `wait_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in processes():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while processes() and time.monotonic() < deadline:
            time.sleep(0.1)


def _in_namespace(netns: str) -> list[str]:
    """The argv prefix that runs a command in the network namespace `netns` (a /proc path)."""
    return ["nsenter", f"--net={netns}"]


def _processes(inode: str | None) -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process in the network namespace `inode`."""
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or _ns_inode(p.name) != inode:
            continue
        try:
            stat = (p / "stat").read_text()
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out[int(p.name)] = (ppid, cmd)
    return out
