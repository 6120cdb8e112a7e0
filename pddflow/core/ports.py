"""Ports for servers that a process starts later: the deployer's workers, API processes and
tensor-parallel groups, and the tests' deployments."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on, for a server that a worker starts later. It is drawn below the
    kernel's ephemeral range: a port from port 0 can be taken, before the worker binds it, as the
    local end of any outgoing connection on this host."""
    low = _ephemeral_low()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12_000), low) if low > 2048 else 0
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            port = s.getsockname()[1]
        _handed_out.add(port)
        return port
    raise OSError(f"no free port below {low} on {host}")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; elsewhere a guess that costs nothing if wrong
