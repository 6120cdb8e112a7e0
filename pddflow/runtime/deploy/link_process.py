"""The local backend's emulated links in a process of their own: every cross-cluster connection's
relay (channels/link_relay.py) runs there, so the bytes the emulated WAN carries take neither the
router's CPU nor its GIL (a real link costs the frontend nothing). The deployer starts it with the
relays it needs, learns their addresses, and cuts or impairs a link through it; it dies with the
deployer.

    python -m pddflow.runtime.deploy.link_process      (JSON lines on stdin and stdout)

The first line in is the relays ({"relays": [RelaySpec, ...]}), answered with their addresses in
the same order; every later line is one command ({"cut": LINK, ...} or {"impair": LINK, ...}),
answered {"ok": true} or {"error": MESSAGE}."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass
from typing import Any

from pddflow.core.child_python import python_module
from pddflow.core.parent_death import die_with_parent, parent_env

REPLY_TIMEOUT_S = 10.0  # the link process answers at once; silence this long is a dead process


@dataclass(frozen=True)
class RelaySpec:
    """One relay of `link` to `upstream` (host:port); `delay_s` set: a control relay, which adds
    the link's one-way delay itself (docs/channels.md)."""

    link: str
    upstream: str
    client_cluster: str
    server_cluster: str
    delay_s: float | None = None


class LinkProcessError(RuntimeError):
    """The link process did not start, or stopped answering."""


class LinkProcess:
    """The deployer's handle on the link process."""

    def __init__(self, specs: list[RelaySpec], log_path: os.PathLike | None = None):
        self.links = sorted({s.link for s in specs})
        self._lock = threading.Lock()
        log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            python_module("pddflow.runtime.deploy.link_process"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=parent_env(),
            process_group=0,  # Ctrl-C goes to the deployer, which stops it in order
        )
        if log is not subprocess.DEVNULL:
            log.close()
        try:
            got = self._ask({"relays": [asdict(s) for s in specs]})
        except Exception:
            self.proc.kill()  # started, but it will not serve: nothing is left behind
            self.proc.wait(timeout=5)
            raise
        self.addresses: list[str] = got["addresses"]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cut(self, link: str, seconds: float, after_bytes: int = 0) -> None:
        self._ask({"cut": link, "seconds": seconds, "after_bytes": after_bytes})

    def impair(self, link: str, seconds: float, loss: float, from_cluster: str | None) -> None:
        self._ask({"impair": link, "seconds": seconds, "loss": loss, "from_cluster": from_cluster})

    def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if self.proc.poll() is not None:
                raise LinkProcessError(f"the link process exited ({self.proc.returncode})")
            assert self.proc.stdin and self.proc.stdout
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
            ready, _, _ = select.select([self.proc.stdout], [], [], REPLY_TIMEOUT_S)
            line = self.proc.stdout.readline() if ready else b""
        if not line:
            raise LinkProcessError(f"the link process did not answer {next(iter(message))!r}")
        reply = json.loads(line)
        if "error" in reply:
            raise ValueError(reply["error"])
        return reply

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin
            try:
                self.proc.stdin.close()  # end of commands: it closes its relays and exits
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=5)


def _serve(lines: Any, out: Any) -> None:
    from pddflow.channels.link_relay import Link, LinkRelay

    specs = [RelaySpec(**s) for s in json.loads(next(lines))["relays"]]
    links = {s.link: Link() for s in specs}
    relays = []
    for s in specs:
        host, port = s.upstream.rsplit(":", 1)
        relays.append(
            LinkRelay(
                (host, int(port)),
                link=links[s.link],
                client_cluster=s.client_cluster,
                server_cluster=s.server_cluster,
                delay_s=s.delay_s or 0.0,
                control=s.delay_s is not None,
            )
        )
    out.write(json.dumps({"addresses": [r.address for r in relays]}) + "\n")
    out.flush()
    try:
        for line in lines:
            cmd = json.loads(line)
            try:
                if "cut" in cmd:
                    links[cmd["cut"]].cut(cmd["seconds"], cmd["after_bytes"])
                else:
                    link = links[cmd["impair"]]
                    link.impair(cmd["seconds"], cmd["loss"], cmd["from_cluster"])
                reply: dict[str, Any] = {"ok": True}
            except (KeyError, ValueError) as exc:
                reply = {"error": str(exc)}
            out.write(json.dumps(reply) + "\n")
            out.flush()
    finally:
        for r in relays:
            r.close()


def main() -> int:
    die_with_parent()
    _serve(iter(sys.stdin.readline, ""), sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
