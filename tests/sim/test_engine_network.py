"""The batch loop and the WAN model against straightforward references."""

from __future__ import annotations

import random

import pytest

from pddflow.core.arch import ARCHS
from pddflow.core.device import DeviceClass
from pddflow.core.device_model import DeviceModel
from pddflow.core.link import Jitter, LinkModel
from pddflow.sim.engine import Job, Seq, SimEngine, StepKind
from pddflow.sim.events import EventLoop
from pddflow.sim.network import SharedLink

GPU = DeviceClass("g", 989, 80, 3.35, 400, 2.0)


def _model(arch: str = "llama-3-70b", gpu: DeviceClass = GPU):
    return DeviceModel(gpu, 4, ARCHS.get(arch))


# DeepSeek-V3 on a slow device class: compute-bound steps, priced by decode attention's term
@pytest.mark.parametrize(
    "arch, gpu", [("llama-3-70b", GPU), ("deepseek-v3", DeviceClass("slow", 1, 80, 3.35, 400, 1))]
)
def test_planned_decode_steps_equal_one_event_per_step(arch, gpu):
    """Sequences arriving mid-run join at the next step boundary; finishing times must match a
    step-by-step reference exactly, although the engine plans runs of steps at once (and prices
    them as decode_step_s does: DeepSeek-V3's decode attention is MLA's absorbed form)."""
    arrivals = [
        (0.0, 1000, 50),
        (0.1037, 3000, 30),
        (0.2, 500, 80),
        (0.2001, 700, 5),
        (1.5, 100, 20),
    ]
    loop = EventLoop()
    eng = SimEngine(loop, "e", _model(arch, gpu), max_batch=64, chunk_tokens=512)
    got = {}
    for i, (t, ctx, out) in enumerate(arrivals):
        seq = Seq(None, i, ctx, 0, out, None, lambda s, t: got.__setitem__(s.rid, t))
        loop.at(t, eng.submit_seq, seq)
    loop.run()
    m = _model(arch, gpu)
    want, running, t, pending = {}, {}, 0.0, list(enumerate(arrivals))
    while pending or running:
        for i, (ta, ctx, out) in list(pending):
            if ta <= t + 1e-12:
                running[i] = [ctx, out]
                pending.remove((i, (ta, ctx, out)))
        if not running:
            t = pending[0][1][0]
            continue
        t += m.decode_step_s(len(running), sum(c for c, _ in running.values()))
        for i in list(running):
            running[i][0] += 1
            running[i][1] -= 1
            if running[i][1] == 0:
                want[i] = t
                del running[i]
    assert got == pytest.approx(want, rel=1e-9)
    assert eng.decode_tokens == sum(o for _, _, o in arrivals)
    assert loop.processed < sum(o for _, _, o in arrivals)  # fewer events than steps


def test_prefill_chunks_and_first_token():
    loop = EventLoop()
    eng = SimEngine(loop, "p", _model(), max_batch=8, chunk_tokens=2048)
    done = []
    eng.submit_job(Job("a", 5000, 0, lambda j, t: done.append(("a", t))))
    eng.submit_job(Job("b", 100, 1000, lambda j, t: done.append(("b", t))))
    loop.run()
    assert [d[0] for d in done] == ["a", "b"]  # FIFO
    assert eng.job_tokens == 5100
    m = _model()
    t1 = m.step_s(2048, 2048**2 / 2, 2048)
    assert done[0][1] > 2 * t1  # three chunks, not one


def test_exclusive_jobs_run_alone_and_whole_as_the_runtime_loop():
    """As the runtime's worker loop: one call at a time. Two prompts queued together finish one
    after the other at their own whole-prefill cost (no chunk packs both), a decoding sequence makes
    no progress while a job runs, and a job's shipping time keeps the engine busy after it."""
    m = _model()
    loop = EventLoop()
    eng = SimEngine(loop, "p", m, max_batch=8, chunk_tokens=512, exclusive_jobs=True)
    done, finished = {}, {}
    eng.submit_seq(Seq(None, 0, 1000, 0, 3, None, lambda s, t: finished.__setitem__(s.rid, t)))
    loop.at(
        1e-9, eng.submit_job, Job("a", 300, 0, lambda j, t: done.__setitem__("a", t), after_s=0.5)
    )
    loop.at(1e-9, eng.submit_job, Job("b", 200, 100, lambda j, t: done.__setitem__("b", t)))
    loop.run()
    step1 = m.decode_step_s(1, 1000)
    assert done["a"] == pytest.approx(step1 + m.prefill_s(300, 0), rel=1e-9)
    assert done["b"] == pytest.approx(done["a"] + 0.5 + m.prefill_s(200, 100), rel=1e-9)
    # the sequence's first step ran before the jobs arrived; its other two wait for both jobs
    assert finished[0] == pytest.approx(
        done["b"] + m.decode_step_s(1, 1001) + m.decode_step_s(1, 1002), rel=1e-9
    )
    assert eng.decode_tokens == 3 and eng.steps == 3

    packed = EventLoop()
    mixed = SimEngine(packed, "p", m, max_batch=8, chunk_tokens=512)
    ends = {}
    mixed.submit_job(Job("a", 300, 0, lambda j, t: ends.__setitem__("a", t)))
    mixed.submit_job(Job("b", 200, 100, lambda j, t: ends.__setitem__("b", t)))
    packed.run()
    assert ends["a"] == ends["b"]  # production engines: one chunk carries both


def test_slowdown_stretches_each_kind_of_step():
    """A shared host's slowdown is asked per kind of step (decode only, prefill, extend) and
    stretches that step; each engine reports its steps' wall over model time by kind, as the
    calibration's settling reads them."""
    m = _model()
    loop = EventLoop()
    eng = SimEngine(loop, "p", m, max_batch=8, chunk_tokens=512, exclusive_jobs=True)
    eng.slowdown = {StepKind.DECODE: 2.0, StepKind.PREFILL: 1.5, StepKind.EXTEND: 1.0}.get
    done, finished = {}, {}
    eng.submit_job(Job("a", 300, 0, lambda j, t: done.__setitem__("a", t)))
    eng.submit_job(Job("x", 40, 300, lambda j, t: done.__setitem__("x", t), StepKind.EXTEND))
    loop.at(
        1e-9,
        eng.submit_seq,
        Seq(None, 0, 1000, 0, 2, None, lambda s, t: finished.__setitem__(s.rid, t)),
    )
    loop.run()
    assert done["a"] == pytest.approx(1.5 * m.prefill_s(300, 0), rel=1e-9)
    assert done["x"] == pytest.approx(done["a"] + m.extend_s(40, 300), rel=1e-9)
    assert finished[0] == pytest.approx(
        done["x"] + 2.0 * (m.decode_step_s(1, 1000) + m.decode_step_s(1, 1001)), rel=1e-9
    )
    assert eng.wall_over_model(StepKind.PREFILL) == pytest.approx(1.5)
    assert eng.wall_over_model(StepKind.DECODE) == pytest.approx(2.0)
    assert eng.wall_over_model(StepKind.EXTEND) == pytest.approx(1.0)


def _link(gbps=8.0, jitter=Jitter(0, 0, "constant")):
    return LinkModel("A-B", "A", "B", gbps, rtt_ms=0.0, jitter=jitter)


def test_link_shares_bandwidth_and_cancels():
    loop = EventLoop()
    link = SharedLink(loop, _link(), random.Random(0))  # 1 GB/s
    done = {}
    link.send(1e9, lambda t: done.__setitem__("a", t))
    link.send(1e9, lambda t: done.__setitem__("b", t))
    loop.run()
    assert done["a"] == pytest.approx(2.0) and done["b"] == pytest.approx(2.0)
    loop2 = EventLoop()
    link2 = SharedLink(loop2, _link(), random.Random(0))
    f = link2.send(2e9, lambda t: done.__setitem__("c", t))
    loop2.at(0.5, lambda: done.__setitem__("sent", link2.cancel(f)))
    loop2.run()
    assert "c" not in done and done["sent"] == pytest.approx(0.5e9)
    assert link2.bytes_sent == pytest.approx(0.5e9) and link2.in_flight == 0


def test_flow_cap_and_jitter():
    loop = EventLoop()
    # 10 GB/s link, 1 GB/s per flow
    link = SharedLink(loop, _link(gbps=80), random.Random(0), flow_cap_gbps=8.0)
    done = []
    for _ in range(5):
        link.send(1e9, done.append)
    loop.run()
    assert done == pytest.approx([1.0] * 5)  # five capped flows fit side by side
    loop = EventLoop()
    link = SharedLink(loop, _link(jitter=Jitter(50, 2000)), random.Random(7))
    times = []
    for i in range(400):
        loop.at(i * 30.0, link.send, 0.0, times.append)
    loop.run()
    delays = sorted(t - i * 30.0 for i, t in enumerate(times))
    assert 0.02 < delays[200] < 0.12 and delays[-1] > 0.5  # p50 near 50 ms, a heavy tail


def test_replay_draws_the_emulated_links_delays():
    """Common random numbers: a replay of a deployment (`wan_jitter_seed`) gives its k-th WAN
    transfer the delay the deployment's emulated KV link drew for its k-th message on stream 0."""
    from pathlib import Path

    from pddflow.channels.emulation import EmulatedLink
    from pddflow.core.link import LinkModel, kv_link_seed
    from pddflow.graph import load_plan
    from pddflow.sim.simulator import Simulation
    from pddflow.sim.workload import Workload

    plan = load_plan(
        str(Path(__file__).resolve().parents[2] / "graphs" / "pdd.yaml")
    ).scaled_to_local()
    model = next(iter(plan.links.values()))
    sim = Simulation(plan, Workload("empty", [], plan.model.block_size), wan_jitter_seed=3)
    link = next(iter(sim.links.values()))
    clock = [0.0]
    emu = EmulatedLink(
        LinkModel("x", "a", "b", 1e6, model.rtt_ms, model.jitter),
        seed=kv_link_seed(3),
        clock=lambda: clock[0],
        sleep=lambda s: clock.__setitem__(0, clock[0] + s),
    )
    for k in range(20):
        clock[0] = 100.0 * k  # far apart: each arrival is depart + one delay
        depart, arrival = emu.schedule(1000)
        link.loop.now = 100.0 * k
        t = []
        link.send(0.0, t.append)
        link.loop.run()
        assert t[0] - 100.0 * k == pytest.approx(
            model.rtt_ms / 1e3 + (arrival - depart - model.rtt_ms / 2e3), abs=1e-9
        ), k
