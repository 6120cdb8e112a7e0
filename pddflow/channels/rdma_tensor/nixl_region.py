"""Regions over NVIDIA NIXL (RDMA, NVLink), where `nixl` is importable: `write_at` is a NIXL
WRITE that returns at DONE. Written against NIXL's Python API; never run here (no NIXL)."""

from __future__ import annotations

import struct
import time
import uuid
from typing import Any

import numpy as np

from pddflow.channels.deadline import Deadline
from pddflow.channels.errors import ChannelError
from pddflow.channels.rdma_tensor.memory_region import Region, RegionBackend, RegionWriter


def _api() -> Any:
    import nixl._api as api

    return api


def _pack(*parts: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(p)) + p for p in parts)


def _unpack(data: bytes) -> list[bytes]:
    out, i = [], 0
    while i < len(data):
        (n,) = struct.unpack_from("<I", data, i)
        out.append(data[i + 4 : i + 4 + n])
        i += 4 + n
    return out


class NixlRegion(Region):
    def __init__(self, nbytes: int, populate: bool):
        api = _api()
        self.nbytes = nbytes
        self.name = f"pddflow-rx-{uuid.uuid4().hex[:12]}"
        self.agent = api.nixl_agent(self.name, api.nixl_agent_config(backends=["UCX"]))
        # zeros touches every page now, so registration pins real pages
        self._arr = np.zeros(nbytes, dtype=np.uint8)
        self._reg = self.agent.register_memory(
            self.agent.get_reg_descs([(self._arr.ctypes.data, self._arr.nbytes, 0, "")], "DRAM")
        )
        if self._reg is None:
            raise ChannelError("NIXL could not register the rdma_tensor ring")
        self._base = self._arr.ctypes.data

    def view(self, offset: int, n: int) -> np.ndarray:
        return self._arr[offset : offset + n]

    def buffer(self) -> object:
        return self._arr

    def descriptor(self) -> tuple[bytes, list[int]]:
        return _pack(
            self.name.encode(),
            self.agent.get_agent_metadata(),
            struct.pack("<QQ", self._base, self.nbytes),
        ), []

    def close(self) -> None:
        try:
            self.agent.deregister_memory(self._reg)
        except Exception:  # noqa: BLE001 - a half-broken agent's teardown must not mask the error
            pass


class NixlWriter(RegionWriter):
    def __init__(self, nbytes: int, payload: bytes):
        api = _api()
        remote_name, metadata, region = _unpack(payload)
        self.remote_base, remote_bytes = struct.unpack("<QQ", region)
        if remote_bytes < nbytes:
            raise ChannelError(f"NIXL region is {remote_bytes} bytes, expected {nbytes}")
        self.nbytes = nbytes
        self.agent = api.nixl_agent(
            f"pddflow-tx-{uuid.uuid4().hex[:12]}", api.nixl_agent_config(backends=["UCX"])
        )
        self.remote = self.agent.add_remote_agent(metadata)
        if isinstance(self.remote, bytes):
            self.remote = self.remote.decode()
        if self.remote != remote_name.decode():
            raise ChannelError(f"NIXL peer is {self.remote!r}, expected {remote_name.decode()!r}")
        self._reg: Any = None
        self._base = 0

    def begin(self, src_rows: np.ndarray) -> None:
        self._reg = self.agent.register_memory(
            self.agent.get_reg_descs([(src_rows.ctypes.data, src_rows.nbytes, 0, "")], "DRAM")
        )
        if self._reg is None:
            raise ChannelError("NIXL could not register the KV source tensor")
        self._base = src_rows.ctypes.data

    def end(self) -> None:
        if self._reg is not None:
            self.agent.deregister_memory(self._reg)
            self._reg = None

    def write_at(self, offset: int, src: np.ndarray, dl: Deadline) -> None:
        local = self.agent.get_xfer_descs([(src.ctypes.data, src.nbytes, 0)], "DRAM")
        remote = self.agent.get_xfer_descs([(self.remote_base + offset, src.nbytes, 0)], "DRAM")
        handle = self.agent.initialize_xfer("WRITE", local, remote, self.remote, b"")
        if not handle:
            raise ChannelError("NIXL initialize_xfer failed")
        try:
            if self.agent.transfer(handle) == "ERR":
                raise ChannelError("NIXL transfer failed to start")
            while True:
                state = self.agent.check_xfer_state(handle)
                if state == "DONE":
                    return
                if state == "ERR":
                    raise ChannelError("NIXL transfer failed")
                if dl.expired():
                    raise dl.timeout("NIXL write")
                time.sleep(0)
        finally:
            self.agent.release_xfer_handle(handle)

    def close(self) -> None:
        try:
            self.agent.remove_remote_agent(self.remote)
        except Exception:  # noqa: BLE001
            pass


class NixlBackend(RegionBackend):
    name = "nixl"
    network = True

    @staticmethod
    def available() -> bool:
        try:
            _api()
            return True
        except Exception:  # noqa: BLE001 - any import failure means "not here"
            return False

    def create_region(self, nbytes: int, populate: bool) -> Region:
        return NixlRegion(nbytes, populate)

    def attach(self, nbytes: int, payload: bytes, fds: list[int]) -> RegionWriter:
        return NixlWriter(nbytes, payload)
