"""`Calibration`: everything a calibration changes in a simulation, as one frozen object. Every term
is neutral by default, so `Calibration()` is the uncalibrated device model.

The simulator only applies these terms (`device_model`, `Draws`, `HostCpus`); how they were
measured is `engine_fit.py`, `deployment.py` and `settle.py`.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from pddflow.core.arch import ModelArch
from pddflow.core.device import DeviceClass
from pddflow.sim.calibration.host import HostSpec
from pddflow.sim.calibration.serve_report import QUEUED_S
from pddflow.sim.device import DeviceModel, Efficiency


@dataclass(frozen=True)
class Calibration:
    # the engine fit's step costs (the plan's device classes carry its FLOP/s and bandwidth)
    efficiency: Efficiency = Efficiency()
    # the deployment's prefill (decode-step) CPU over the engine fit's: divides the FLOP/s
    # (bandwidth) and multiplies the fixed costs
    prefill_host_factor: float = 1.0
    decode_host_factor: float = 1.0
    # each prefill's cost factor is drawn from these (the measured prefills over the scaled
    # model, median 1)
    prefill_spread: tuple[float, ...] = ()
    # seconds from a prefill's end to its KV on the same-host relay, drawn per request (empty:
    # the RDMA model); a prefill that queued draws from the ones measured after queued prefills
    relay_handovers: tuple[float, ...] = ()
    relay_handovers_queued: tuple[float, ...] = ()
    # seconds per KV byte a prefill worker stays busy after each prefill, drawn per prefill
    prefill_shipping: tuple[float, ...] = ()
    # a request enters the deployment this long after its client sent it
    serving_latency_s: float = 0.0
    # the host's cores (None: every instance on a device of its own)
    host: HostSpec | None = None
    # what `settle.py` replays towards: the serving path's CPU per output token, and each
    # instance's measured decode (prefill) wall over CPU
    serving_cpu_per_token_s: float = 0.0
    decode_wall_over_cpu: Mapping[str, float] = field(default_factory=dict)
    prefill_wall_over_cpu: Mapping[str, float] = field(default_factory=dict)

    def device_model(self, device: DeviceClass, devices: int, arch: ModelArch) -> DeviceModel:
        eff, f, fd = self.efficiency, self.prefill_host_factor, self.decode_host_factor
        if f != 1.0 or fd != 1.0:
            eff = replace(
                eff,
                job_overhead_s=eff.job_overhead_s * f,
                seq_overhead_s=eff.seq_overhead_s * fd,
                extend_overhead_s=None
                if eff.extend_overhead_s is None
                else eff.extend_overhead_s * f,
            )
            device = replace(device, tflops=device.tflops / f, hbm_tbps=device.hbm_tbps / fd)
        return DeviceModel(device, devices, arch, eff)


class Draws:
    """A calibration's per-request draws in one simulation, each from its own seeded stream."""

    def __init__(self, cal: Calibration, seed: int):
        self.cal = cal
        self._spread = random.Random(f"{seed}/prefill-spread")
        self._handover = random.Random(f"{seed}/relay-handover")
        self._shipping = random.Random(f"{seed}/prefill-shipping")
        every = cal.relay_handovers
        queued = tuple(sorted(cal.relay_handovers_queued))
        rest = tuple(sorted((Counter(every) - Counter(queued)).elements()))
        self._handovers = (rest, queued) if queued and rest else (every, every)

    def prefill_factor(self) -> float:
        spread = self.cal.prefill_spread
        return self._spread.choice(spread) if spread else 1.0

    def relay_handover_s(self, prefill_waited_s: float) -> float | None:
        """The relay's copy time after a prefill that waited this long for its engine (a busy
        host copies slower), or None for the RDMA model."""
        if not self.cal.relay_handovers:
            return None
        return self._handover.choice(self._handovers[prefill_waited_s >= QUEUED_S])

    def shipping_s_per_byte(self) -> float:
        return (
            self._shipping.choice(self.cal.prefill_shipping) if self.cal.prefill_shipping else 0.0
        )
