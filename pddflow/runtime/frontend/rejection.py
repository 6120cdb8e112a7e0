"""How the router refuses a request: the API answers it with the status it carries."""

from __future__ import annotations


class RequestRejected(Exception):
    """A request the deployment will not run; `status` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str, retry_after_s: int | None = None):
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s
