"""Each worker killed under a burst of concurrent requests (pddflow.testing.chaos): no request
hangs or gets wrong tokens, every one is exact or a clean error, and the deployment serves again
within a bound. The link's faults under load are the partition drills' (test_partitions.py; a
cut and a black hole alone: test_wan_faults.py); benchmarks/chaos.py runs every fault."""

from __future__ import annotations

import pytest

from pddflow.testing.chaos import FAULTS, drill

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", [f for f in FAULTS if f.startswith("kill")])
def test_fault_under_load(pdd, reference, name):
    res = drill(pdd, name, FAULTS[name], reference, burst=6, after=2)
    assert res.hung == 0 and res.wrong == 0, res
    assert res.exact + res.clean_errors == res.sent == 8, res
    assert res.recover_s is not None and res.recover_s < 60, res
