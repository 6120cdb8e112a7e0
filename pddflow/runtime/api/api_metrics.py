"""What only the API sees, as Prometheus metrics served after the router's on /metrics: requests
by the output they asked for (structured output, tools) and answers that called tools."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest

# what a request asked of its output's shape
KINDS = ("json_object", "json_schema", "tools_auto", "tools_required", "tools_named")


class ApiMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.shaped = Counter(
            "pddflow_shaped_requests",
            "requests for structured output (response_format) or with tools, by kind",
            ["kind"],
            registry=r,
        )
        self.tool_answers = Counter(
            "pddflow_tool_call_answers",
            "choices answered with tool calls (finish_reason tool_calls)",
            registry=r,
        )
        for kind in KINDS:  # every series exported from the start, at 0
            self.shaped.labels(kind)

    def requested(self, response_format: str | None, tool_mode: str | None) -> None:
        """One request's kinds: its response_format's type, and its tool_choice with tools."""
        if response_format in ("json_object", "json_schema"):
            self.shaped.labels(response_format).inc()
        if tool_mode is not None and tool_mode != "none":
            named = tool_mode not in ("auto", "required")
            self.shaped.labels("tools_named" if named else f"tools_{tool_mode}").inc()

    def text(self) -> bytes:
        return generate_latest(self.registry)
