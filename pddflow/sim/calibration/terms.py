"""`Calibration`: all a calibration changes in a simulation; `Calibration()` changes nothing."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from pddflow.core.arch import ModelArch
from pddflow.core.device import DeviceClass
from pddflow.core.device_model import DeviceModel, Efficiency
from pddflow.sim.calibration.host import HostSpec


@dataclass(frozen=True)
class Calibration:
    # the fit's step costs (its FLOP/s and bandwidth are in the plan's device classes)
    efficiency: Efficiency = Efficiency()
    # the deployment's prefill (decode-step) CPU over the engine fit's: divides the FLOP/s
    # (bandwidth) and multiplies the fixed costs
    prefill_host_factor: float = 1.0
    decode_host_factor: float = 1.0
    # each prefill's cost factor is drawn from these (measured over model, median 1)
    prefill_spread: tuple[float, ...] = ()
    # seconds per KV byte a prefill worker stays busy after each prefill, drawn per prefill
    prefill_shipping: tuple[float, ...] = ()
    # the host's cores (None: every instance on a device of its own)
    host: HostSpec | None = None
    # what `settle.py` replays towards, per instance
    prefill_wall_over_cpu: Mapping[str, float] = field(default_factory=dict)

    def device_model(self, device: DeviceClass, devices: int, arch: ModelArch) -> DeviceModel:
        eff, f, fd = self.efficiency, self.prefill_host_factor, self.decode_host_factor
        if f != 1.0 or fd != 1.0:
            eff = replace(
                eff,
                prefill_overhead_s=eff.prefill_overhead_s * f,
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
        self._shipping = random.Random(f"{seed}/prefill-shipping")

    def prefill_factor(self) -> float:
        spread = self.cal.prefill_spread
        return self._spread.choice(spread) if spread else 1.0

    def shipping_s_per_byte(self) -> float:
        return (
            self._shipping.choice(self.cal.prefill_shipping) if self.cal.prefill_shipping else 0.0
        )
