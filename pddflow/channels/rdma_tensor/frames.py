"""The frame kinds of an rdma_tensor connection (control, and the tcp backend's data links)."""

from __future__ import annotations

import enum

from pddflow.channels.errors import ChannelAuthError, ChannelError


class Frame(enum.IntEnum):
    """s->r: AUTH HELLO BEGIN CHUNK END CANCEL ATTACH; r->s: RING PLACE FREE RESULT ERROR ATTACH.

    AUTH (the receiver's token) comes first on every connection to a receiver that has one;
    ATTACH opens a tcp data link instead of a control connection (`tcp_region.py`)."""

    HELLO = 1
    RING = 2
    BEGIN = 3
    CHUNK = 4
    END = 5
    FREE = 6
    RESULT = 7
    CANCEL = 8
    ERROR = 9
    PLACE = 10
    AUTH = 11
    ATTACH = 12


def refusal(body: bytes) -> ChannelError:
    """The error an ERROR frame from the receiver stands for (a token refusal is an auth error)."""
    text = body.decode(errors="replace")
    return ChannelAuthError(text) if " token " in text else ChannelError(text)
