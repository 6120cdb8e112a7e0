"""Each single fault under a burst of concurrent requests (pddflow.testing.chaos): no request
hangs or gets wrong tokens, every one is exact or a clean error, and the deployment serves again
within a bound."""

from __future__ import annotations

import pytest

from pddflow.testing.chaos import FAULTS, drill

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", list(FAULTS))
def test_fault_under_load(pdd, reference, name):
    res = drill(pdd, name, FAULTS[name], reference, burst=6, after=2)
    assert res.hung == 0 and res.wrong == 0, res
    assert res.exact + res.clean_errors == res.sent == 8, res
    assert res.recover_s is not None and res.recover_s < 60, res
