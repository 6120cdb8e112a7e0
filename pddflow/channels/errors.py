"""Channel errors: one exception type per way a transfer can fail, so a worker can tell a dead peer
(fail over) from a bad credential (configuration) from a corrupt payload (already retried)."""

from __future__ import annotations


class ChannelError(RuntimeError):
    """Base class of every error a channel raises."""


class ChannelTimeout(ChannelError, TimeoutError):
    """The call's deadline passed before the peer answered. Never retried silently past it."""


class ChannelAuthError(ChannelError, PermissionError):
    """The peer refused our credentials (missing or wrong bearer token, TLS mismatch)."""


class ChannelCorrupt(ChannelError):
    """A block failed its checksum more often than the retry budget allows, or a decode was asked
    to accept a block whose checksum does not match (it never decodes garbage)."""

    def __init__(self, message: str, bad_blocks: list[int] | None = None):
        super().__init__(message)
        self.bad_blocks = list(bad_blocks or [])


class ChannelCancelled(ChannelError):
    """The transfer was cancelled by either side (a failed paired leg, a released request)."""


class ChannelClosed(ChannelError):
    """The channel (or its peer) was closed while the call was in progress."""
