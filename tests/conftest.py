"""The whole suite's start and its garbage collector.

- Bytecode: the suite starts hundreds of processes (deployers, workers, API processes) that each
  import pddflow afresh; where bytecode writing is off (PYTHONDONTWRITEBYTECODE, set on this
  project's development machine) each of them compiled every module again, 0.3-0.7 s of CPU a
  process.
  The session compiles the package once, into its `__pycache__` (git ignores it).
- What collection imported (torch, transformers, every pddflow module: about 300,000 objects) is
  frozen out of the garbage collector, whose full passes would otherwise scan it again and again
  (0.13 s a pass here) while the tests make and drop their own objects.

And one fixture two packages' tests share: `echo`, a TCP server that sends back what it gets
(what the link relays, and the link process that runs them, are tested against).
"""

from __future__ import annotations

import compileall
import gc
import socket
import sys
import threading
from pathlib import Path

import pytest


def pytest_sessionstart(session) -> None:
    if sys.dont_write_bytecode:
        import pddflow.kernels

        for package in (pddflow, pddflow.kernels):
            compileall.compile_dir(Path(package.__file__).parent, quiet=1)


def pytest_collection_finish(session) -> None:
    gc.freeze()


@pytest.fixture
def echo():
    """(host, port) of a server on 127.0.0.1 that sends back what it gets."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()
    srv.close()


def _echo(conn: socket.socket) -> None:
    with conn:
        try:
            while data := conn.recv(65536):
                conn.sendall(data)
        except OSError:
            pass
