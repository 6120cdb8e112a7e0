"""`pddflow deploy` refuses what it cannot serve before it starts a single worker."""

from __future__ import annotations

import socket
import subprocess
import sys


def test_a_taken_port_fails_before_any_worker_starts(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "pddflow.cli", "deploy", "pdd", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
    assert out.returncode == 2, out.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr and "--port" in out.stderr
    assert "starting" not in out.stderr and "Traceback" not in out.stderr
