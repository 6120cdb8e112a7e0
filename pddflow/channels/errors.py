"""One exception per way a transfer fails: a dead peer (fail over), a bad credential, a corrupt
payload (already retried)."""

from __future__ import annotations


class ChannelError(RuntimeError):
    pass


class ChannelTimeout(ChannelError, TimeoutError):
    """The call's deadline passed before the peer answered. Never retried silently past it."""


class ChannelAuthError(ChannelError, PermissionError):
    """The peer refused our credentials (missing or wrong bearer token, TLS mismatch)."""


class ChannelCorrupt(ChannelError):
    """A block failed its checksum past the retry budget; garbage is never decoded."""

    def __init__(self, message: str, bad_blocks: list[int] | None = None):
        super().__init__(message)
        self.bad_blocks = list(bad_blocks or [])


class ChannelCancelled(ChannelError):
    """The transfer was cancelled by either side (a failed paired leg, a released request)."""


class ChannelClosed(ChannelError):
    """The channel (or its peer) was closed while the call was in progress."""
