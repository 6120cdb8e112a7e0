"""Flight's exceptions mapped onto channel errors, and which of them a sender retries."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.flight as fl

from pddflow.channels.deadline import Deadline
from pddflow.channels.errors import ChannelAuthError, ChannelCancelled, ChannelError, ChannelTimeout

# a dropped connection or a receiver restarting: reconnect and resume
RETRYABLE = (fl.FlightUnavailableError, fl.FlightInternalError, pa.ArrowIOError, OSError)


class AcksEnded(Exception):
    """The receiver's ack stream ended before every batch was acknowledged."""


def first_line(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    text = str(exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    for cut in (". Detail:", ". gRPC client debug context"):  # gRPC appends its debug dump
        first = first.split(cut)[0]
    return first[:300]


def translate(exc: BaseException, dl: Deadline, location: str) -> BaseException:
    """Retryable transport errors pass through unchanged."""
    if isinstance(exc, ChannelError):
        return exc
    if isinstance(exc, (fl.FlightUnauthenticatedError, fl.FlightUnauthorizedError)):
        return ChannelAuthError(
            f"wan_flight receiver at {location} refused our credentials: {first_line(exc)}"
        )
    if isinstance(exc, fl.FlightTimedOutError) or (dl.expired() and isinstance(exc, RETRYABLE)):
        return ChannelTimeout(f"{dl.what}: deadline passed ({first_line(exc)})")
    if isinstance(exc, fl.FlightCancelledError):
        return ChannelCancelled(f"{dl.what}: {first_line(exc)}")
    if isinstance(exc, (fl.FlightUnavailableError, fl.FlightInternalError)):
        return exc
    if isinstance(exc, fl.FlightServerError):
        return ChannelError(f"{dl.what}: receiver error: {first_line(exc)}")
    return exc
