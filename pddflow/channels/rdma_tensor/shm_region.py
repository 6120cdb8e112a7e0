"""Shared-memory regions: a memfd mapped by both processes, passed with SCM_RIGHTS, so no name in
/dev/shm can leak."""

from __future__ import annotations

import mmap
import os

import numpy as np

from pddflow.channels.deadline import Deadline
from pddflow.channels.errors import ChannelError
from pddflow.channels.rdma_tensor.memory_region import Region, RegionBackend, RegionWriter

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


class SharedMemoryRegion(Region):
    def __init__(self, nbytes: int, populate: bool):
        self.nbytes = nbytes
        self.fd = os.memfd_create("pddflow-shm-kv", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, nbytes)
            self._mm = mmap.mmap(
                self.fd, nbytes, flags=mmap.MAP_SHARED | (_POPULATE if populate else 0)
            )
        except BaseException:
            os.close(self.fd)
            raise
        self._arr = np.frombuffer(self._mm, dtype=np.uint8)

    def view(self, offset: int, n: int) -> np.ndarray:
        return self._arr[offset : offset + n]

    def buffer(self) -> object:
        return self._mm

    def descriptor(self) -> tuple[bytes, list[int]]:
        return b"", [self.fd]

    def close(self) -> None:
        self._arr = None  # type: ignore[assignment]
        try:
            self._mm.close()
        except BufferError:  # views handed out are still alive; the mapping goes when they do
            pass
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class SharedMemoryWriter(RegionWriter):
    def __init__(self, nbytes: int, fd: int):
        try:
            size = os.fstat(fd).st_size
            if size < nbytes:
                raise ChannelError(f"shared region is {size} bytes, expected {nbytes}")
            self._mm = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)  # the mapping keeps the memory alive
        self._arr = np.frombuffer(self._mm, dtype=np.uint8)

    def write_at(self, offset: int, src: np.ndarray, dl: Deadline) -> None:
        # numpy releases the GIL for the copy, so the sender's other threads keep running
        np.copyto(self._arr[offset : offset + src.shape[0]], src)

    def close(self) -> None:
        self._arr = None  # type: ignore[assignment]
        try:
            self._mm.close()
        except BufferError:
            pass


class SharedMemoryBackend(RegionBackend):
    name = "shm"
    needs_unix_socket = True  # the memfd travels as SCM_RIGHTS ancillary data

    def create_region(self, nbytes: int, populate: bool) -> Region:
        return SharedMemoryRegion(nbytes, populate)

    def attach(self, nbytes: int, payload: bytes, fds: list[int]) -> RegionWriter:
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise ChannelError(
                f"shm region: expected 1 file descriptor from the receiver, got {len(fds)}"
            )
        return SharedMemoryWriter(nbytes, fds[0])
