"""A replica's capacity within the SLA (planner/capacity.py) and the load's sliding window
(planner/meter.py)."""

from __future__ import annotations

import pytest

from pddflow.core.arch import ARCHS
from pddflow.core.device import DeviceClass
from pddflow.core.device_model import DeviceModel
from pddflow.planner.capacity import StepFit, batch_within, modeled_decode
from pddflow.planner.meter import Meter


def test_batch_within_finds_the_largest_batch_inside_the_tpot():
    step = lambda b: 0.010 + 0.001 * b  # noqa: E731
    assert batch_within(step, 0.050, 128) == 40
    assert batch_within(step, 0.050, 16) == 16  # max_batch bounds it
    assert batch_within(step, 0.005, 128) == 1  # too slow for the SLA: still one


def test_step_fit_recovers_a_line_and_is_flat_with_one_batch_seen():
    fit = StepFit()
    assert fit.step_s(4) is None and fit.batch_within(0.05, 64) is None
    for batch in (1, 2, 4, 8):
        steps = 100
        fit.add(steps, batch * steps, steps * (0.004 + 0.002 * batch))
    assert fit.step_s(16) == pytest.approx(0.036)
    assert fit.batch_within(0.050, 64) == 23
    flat = StepFit()
    flat.add(50, 150, 50 * 0.02)  # batch 3 only: 20 ms whatever the batch
    assert flat.step_s(60) == pytest.approx(0.02) and flat.batch_within(0.05, 64) == 64


def test_modeled_capacity_follows_the_device_model():
    m = DeviceModel(DeviceClass("g", 989, 80, 3.35, 400, 2.0), 4, ARCHS.get("llama-3-70b"))
    b = modeled_decode(m, 8000, 0.050, 256)
    assert m.decode_step_s(b, b * 8000) <= 0.050 < m.decode_step_s(b + 1, (b + 1) * 8000)


def test_meter_rates_over_its_window():
    meter = Meter(window_s=10)
    for t in range(20):
        meter.arrived(float(t), "prefill", 100.0)
        meter.held(float(t), "main", 4 if t < 15 else 8, 4000.0)
        meter.sent(float(t), "A-B", 1e6 * t)
    assert meter.prompt_rate(19.0, "prefill") == pytest.approx(1100 / 10)  # t = 9..19
    seqs, ctx = meter.sequences(19.0, "main")
    assert seqs == pytest.approx((6 * 4 + 5 * 8) / 11)
    assert meter.link_rate(19.0, "A-B") == pytest.approx(1e6)
    assert meter.prompt_rate(19.0, "relay") == 0.0 and meter.link_rate(19.0, "C-D") == 0.0
    early = Meter(window_s=10)
    early.arrived(0.0, "prefill", 50.0)
    assert early.prompt_rate(2.0, "prefill") == pytest.approx(25.0)  # the window so far
