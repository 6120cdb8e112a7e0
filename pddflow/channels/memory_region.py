"""The data plane under the rdma_tensor channel kind: memory the receiver owns and the sender
writes into, behind one interface so the protocol (`shm_kv_*.py`) is the same on every backend.

The receiver creates a `Region` and describes it in bytes (plus file descriptors on one host); the
sender attaches a `RegionWriter` to that description, and once `write_at(offset, src)` returns the
receiver may read the bytes. Credits, checksums, resends, landing and cancel are the protocol's,
not a backend's. Backends: `shm_region.py` (memfd shared memory between processes on one host) and
`nixl_region.py` (NVIDIA NIXL: RDMA, NVLink), picked in `shm_kv_protocol.py`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from pddflow.channels.deadline import Deadline


class Region(ABC):
    """Receiver side: `nbytes` of memory a sender can write into."""

    nbytes: int

    @abstractmethod
    def view(self, offset: int, n: int) -> np.ndarray:
        """uint8 view of [offset, offset + n) (valid until close)."""

    @abstractmethod
    def buffer(self) -> object:
        """The writable buffer behind the region, for views that must hold a reference to it."""

    @abstractmethod
    def descriptor(self) -> tuple[bytes, list[int]]:
        """What a writer needs to attach: a payload and file descriptors to pass (may be empty)."""

    @abstractmethod
    def close(self) -> None: ...


class RegionWriter(ABC):
    """Sender side: writes into a receiver's region."""

    def begin(self, src_rows: np.ndarray) -> None:  # noqa: B027 - optional: most register nothing
        """A send of src_rows (uint8 [blocks, block_bytes]) starts: register it if needed."""

    def end(self) -> None:  # noqa: B027 - optional, as begin
        """The send ended (successfully or not): release what begin registered."""

    @abstractmethod
    def write_at(self, offset: int, src: np.ndarray, dl: Deadline) -> None:
        """Copy src (1-D uint8) to [offset, offset + len); visible to the reader on return."""

    @abstractmethod
    def close(self) -> None: ...


class RegionBackend(ABC):
    name: ClassVar[str]
    needs_unix_socket: ClassVar[bool] = False

    @staticmethod
    def available() -> bool:
        return True

    @abstractmethod
    def create_region(self, nbytes: int, populate: bool) -> Region:
        """populate: commit the pages now (a small, hot ring), not on first touch (an arena)."""

    @abstractmethod
    def attach(self, nbytes: int, payload: bytes, fds: list[int]) -> RegionWriter: ...
