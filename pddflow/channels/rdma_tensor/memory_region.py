"""The region interface under rdma_tensor: memory the receiver owns and the sender writes into,
so the protocol is the same on every backend (`shm_region.py`, `nixl_region.py`,
`tcp_region.py`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from pddflow.channels.deadline import Deadline
from pddflow.channels.errors import ChannelError

if TYPE_CHECKING:
    import threading

    from pddflow.channels.rdma_tensor.control_socket import ControlSocket


class Region(ABC):
    nbytes: int

    @abstractmethod
    def view(self, offset: int, n: int) -> np.ndarray:
        """uint8 view of [offset, offset + n) (valid until close)."""

    @abstractmethod
    def buffer(self) -> object:
        """The writable buffer behind the region, for views that must hold a reference to it."""

    @abstractmethod
    def descriptor(self) -> tuple[bytes, list[int]]:
        """What a writer needs to attach: a payload and file descriptors (may be none)."""

    @abstractmethod
    def close(self) -> None: ...


class RegionWriter(ABC):
    def begin(self, src_rows: np.ndarray) -> None:  # noqa: B027 - optional: most register nothing
        """A send of src_rows (uint8 [blocks, block_bytes]) starts: register it if needed."""

    def end(self) -> None:  # noqa: B027 - optional, as begin
        """Release what begin registered (whether the send succeeded or not)."""

    @abstractmethod
    def write_at(self, offset: int, src: np.ndarray, dl: Deadline) -> None:
        """Copy src (1-D uint8) to [offset, offset + len); visible to the reader on return."""

    @abstractmethod
    def close(self) -> None: ...


class RegionBackend(ABC):
    name: ClassVar[str]
    needs_unix_socket: ClassVar[bool] = False
    network: ClassVar[bool] = False  # bytes cross a wire: checksums on unless turned off

    @staticmethod
    def available() -> bool:
        return True

    @classmethod
    def for_sender(cls, address: str, token: str | None) -> RegionBackend:
        """The sender's instance, told where the receiver listens (a backend whose writers
        connect back to it needs that)."""
        return cls()

    def serve_writer(
        self, control: ControlSocket, body: bytes, closed: threading.Event, deadline_s: float
    ) -> None:
        """A data connection a writer opened with ATTACH (only backends that carry bytes over
        the receiver's own socket take those)."""
        raise ChannelError(f"rdma_tensor transport {self.name!r} takes no data connections")

    @abstractmethod
    def create_region(self, nbytes: int, populate: bool) -> Region:
        """populate: commit the pages now (a small, hot ring), not on first touch (an arena)."""

    @abstractmethod
    def attach(self, nbytes: int, payload: bytes, fds: list[int]) -> RegionWriter: ...
