"""Which worker class runs each operator type. A class registers itself beside its definition
(`@runs("main_decode", "decode")`), and the registration checks its contract against the type's
when the code loads: a worker must do everything the type's ports say (prefill, relay a handoff,
take one) and decode exactly when the type decodes. Plugins add workers for their types by entry
point (`pddflow.workers`, as the other registries: docs/plugins.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from pddflow.core.operator_types import OPERATOR_TYPES, OperatorType
from pddflow.core.registry import Registry

# what a worker class can do, as class attributes; each is asked of the operator type too
CAPABILITIES = ("prefills", "decodes", "relays", "takes_handoff")
WORKERS: Registry[type] = Registry("worker", "pddflow.workers")
W = TypeVar("W", bound=type)


class ContractError(TypeError):
    """A worker class registered for an operator type it cannot run."""


def check_contract(cls: type, op_type: OperatorType) -> None:
    missing = [c for c in CAPABILITIES if getattr(op_type, c) and not getattr(cls, c, False)]
    if missing:
        raise ContractError(
            f"{cls.__name__} cannot run operator type {op_type.name!r}: the type "
            f"{', '.join(missing)} and the worker does not"
        )
    if getattr(cls, "decodes", False) != op_type.decodes:
        does = "decodes" if op_type.decodes else "does not decode"
        raise ContractError(f"{cls.__name__} cannot run {op_type.name!r}, which {does}")


def runs(*op_types: str) -> Callable[[W], W]:
    """Register the decorated worker class for these operator types, checking its contract."""

    def register(cls: W) -> W:
        for name in op_types:
            check_contract(cls, OPERATOR_TYPES.get(name))
            WORKERS.register(name, cls)
        return cls

    return register
