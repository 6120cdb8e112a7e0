"""Every operator type the runtime claims to run has a worker class registered beside it, and a
registration checks the class's contract against the type when the code loads."""

from __future__ import annotations

import pytest

from pddflow.core.operator_types import OPERATOR_TYPES, OperatorType
from pddflow.core.payloads import Payload
from pddflow.runtime.workers.registry import (
    CAPABILITIES,
    WORKERS,
    ContractError,
    check_contract,
    runs,
)
from pddflow.runtime.workers.roster import worker_class

BUILTIN = ("prefill", "relay_decode", "main_decode", "decode", "colocated")


@pytest.mark.parametrize("name", BUILTIN)
def test_every_builtin_operator_type_has_a_worker_that_can_run_it(name):
    cls = worker_class(name)
    op_type = OPERATOR_TYPES.get(name)
    check_contract(cls, op_type)
    assert cls.decodes == op_type.decodes
    for capability in CAPABILITIES:
        assert getattr(cls, capability) >= getattr(op_type, capability), capability


def test_the_registry_holds_exactly_the_builtin_types():
    worker_class("prefill")  # imports the worker modules, which register their classes
    assert set(WORKERS.names()) == set(BUILTIN) <= set(OPERATOR_TYPES.names())


def test_a_type_without_a_worker_is_refused_naming_what_runs():
    with pytest.raises(ValueError, match="has no worker in this runtime .*colocated, decode"):
        worker_class("kv_forwarder")


# (type, worker capabilities, what the error names)
CONTRACTS = [
    ("relay_decode", {"decodes": True, "prefills": True}, "relays"),
    ("main_decode", {"decodes": True, "prefills": True}, "takes_handoff"),
    ("prefill", {"decodes": True, "prefills": True}, "does not decode"),
    ("decode", {"prefills": True}, "decodes"),
]


@pytest.mark.parametrize(("name", "caps", "named"), CONTRACTS)
def test_a_worker_that_cannot_run_a_type_fails_at_registration(name, caps, named):
    cls = type("Partial", (), {c: caps.get(c, False) for c in CAPABILITIES})
    with pytest.raises(ContractError, match=named):
        runs(name)(cls)
    assert WORKERS.get(name) is not cls


def test_a_plugin_type_checks_against_its_own_ports():
    hop = OperatorType(
        "hop", "re-sends KV", {"kv": Payload.KV_BLOCKS}, {"ids": Payload.TOKEN_IDS}, "decode"
    )
    assert hop.relays and not hop.takes_handoff
    check_contract(worker_class("relay_decode"), hop)
    with pytest.raises(ContractError, match="relays"):
        check_contract(worker_class("main_decode"), hop)
