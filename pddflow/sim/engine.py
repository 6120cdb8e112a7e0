"""One instance's batch loop: chunked prefill/extend jobs plus a continuous decode batch.

Iteration-level: each event is a step boundary. A step that runs prefill or extend chunks is one
event; a run of pure decode steps with an unchanged batch is planned at once (the boundary times of
every step are computed, one event is scheduled at the first finish) and cut short at the next
boundary if new work arrives. The result is the same as one event per step; the event count is not.

With `exclusive_jobs` (the embedded runtime's worker loop: one model call at a time) a job runs
alone and whole, its chunks back to back, and the decode batch waits for it: no chunk mixes
requests, and a job step is not a decode step.

Hooks on a sequence: `on_first(seq, t)` when its first token is emitted, `on_finish(seq, t)` when its
last is. Hooks on a job: `on_done(job, t)`. Controls run at the next boundary, when token counts are
exact (the relay's handoff reads how many tokens it has generated there).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from heapq import heappop, heappush

from pddflow.sim.device import DeviceModel
from pddflow.sim.events import EventLoop

MAX_PLANNED_STEPS = 1 << 16


class Job:
    """`tokens` new tokens to compute over a context that already holds `ctx` tokens (a prompt's
    uncached part, or an extend over handed-off token IDs)."""

    __slots__ = (
        "run",
        "tokens",
        "ctx",
        "sched",
        "done",
        "on_done",
        "kind",
        "started",
        "factor",
        "after_s",
    )

    def __init__(
        self,
        run,
        tokens: int,
        ctx: int,
        on_done: Callable,
        kind: str = "prefill",
        factor: float = 1.0,
        after_s: float = 0.0,
    ):
        self.run, self.tokens, self.ctx, self.on_done, self.kind = (
            run,
            max(1, tokens),
            ctx,
            on_done,
            kind,
        )
        self.factor = factor  # this job's cost against the model (measured spread, 1 = model)
        self.after_s = after_s  # exclusive: the engine stays busy this long after it (shipping KV)
        self.sched = 0
        self.done = 0
        self.started: float | None = None  # when its first chunk's step began


class Seq:
    """A sequence decoding here: `tokens0` output tokens already emitted when it joined, `output` in all."""

    __slots__ = (
        "run",
        "rid",
        "ctx0",
        "tokens0",
        "output",
        "join_step",
        "finish_step",
        "on_first",
        "on_finish",
    )

    def __init__(
        self,
        run,
        rid: int,
        ctx0: int,
        tokens0: int,
        output: int,
        on_first: Callable | None,
        on_finish: Callable,
    ):
        self.run, self.rid, self.ctx0, self.tokens0, self.output = run, rid, ctx0, tokens0, output
        self.on_first, self.on_finish = on_first, on_finish
        self.join_step = -1
        self.finish_step = -1


class Engine:
    def __init__(
        self,
        loop: EventLoop,
        name: str,
        model: DeviceModel,
        max_batch: int,
        chunk_tokens: int,
        exclusive_jobs: bool = False,
    ):
        self.loop, self.name, self.model = loop, name, model
        self.exclusive_jobs = exclusive_jobs
        self._job_alone = False  # the planned step is one exclusive job (no decode step)
        self._busy_until = 0.0  # an exclusive job's work after it is done (shipping its KV)
        self.max_batch, self.chunk = max(1, max_batch), max(1, chunk_tokens)
        self.running: dict[int, Seq] = {}
        self.waiting: deque[Seq] = deque()
        self.jobs: deque[Job] = deque()
        self.controls: list[Callable[[float], None]] = []
        self._finish: list[tuple[int, int]] = []
        self.steps = 0
        self.ctx_sum = 0
        self._busy = False
        self._ver = 0
        self._k = 0
        self._times: list[float] | None = None
        self._t_plan = 0.0
        self._step_jobs: list[tuple[Job, int]] = []
        self._in_boundary = False
        self.busy_s = 0.0
        self.decode_tokens = 0
        self.job_tokens = 0
        # shared-host CPU model (simulator.CpuShare): step times are multiplied by `slowdown()` at
        # planning time; `on_busy` hears every idle <-> busy transition. None: a dedicated device.
        # argument: the step runs prefill/extend
        self.slowdown: Callable[[bool], float] | None = None
        self.on_busy: Callable[[Engine], None] | None = None
        # decode-only steps take this many times their time besides the host model (a deployment
        # calibration's measured wall over CPU that the CPU model does not explain); and what they
        # took: simulated wall seconds, and the same steps at the model's time (no host, no factor)
        self.decode_wall_factor = 1.0
        self.decode_wall_s = 0.0
        self.decode_model_s = 0.0
        # the same for steps that run a prefill (the deployment's measured prefill wall over CPU)
        self.prefill_wall_factor = 1.0
        self.prefill_wall_s = 0.0
        self.prefill_model_s = 0.0
        self._plan_f = 1.0

    @property
    def decode_wall_over_model(self) -> float | None:
        """Decode-only steps' simulated wall time over their model time (None before any)."""
        return self.decode_wall_s / self.decode_model_s if self.decode_model_s > 0 else None

    @property
    def prefill_wall_over_model(self) -> float | None:
        """Prefill-only steps' simulated wall time over their model time (None before any)."""
        return self.prefill_wall_s / self.prefill_model_s if self.prefill_model_s > 0 else None

    def _prefills_only(self) -> bool:
        return bool(self._step_jobs) and all(j.kind == "prefill" for j, _ in self._step_jobs)

    # ---- work arrives ---------------------------------------------------------------------------
    def submit_job(self, job: Job) -> None:
        self.jobs.append(job)
        self._poke()

    def submit_seq(self, seq: Seq) -> None:
        self.waiting.append(seq)
        self._poke()

    def submit_control(self, fn: Callable[[float], None]) -> None:
        self.controls.append(fn)
        self._poke()

    # ---- read or change a sequence at a boundary (from a control) ----------------------------------
    def generated(self, seq: Seq) -> int:
        return seq.tokens0 + (self.steps - seq.join_step) if seq.join_step >= 0 else seq.tokens0

    def is_running(self, seq: Seq) -> bool:
        return self.running.get(seq.rid) is seq

    def remove(self, seq: Seq) -> int:
        """Take a sequence out (handoff); returns the tokens it had emitted here."""
        if self.running.get(seq.rid) is seq:
            del self.running[seq.rid]
            n = self.generated(seq)
            self.ctx_sum -= seq.ctx0 + (self.steps - seq.join_step)
            return n
        try:
            self.waiting.remove(seq)
        except ValueError:
            pass
        return seq.tokens0

    def queued(self) -> int:
        return len(self.waiting) + len(self.jobs)

    def queued_tokens(self) -> int:
        return sum(j.tokens - j.sched for j in self.jobs)

    # ---- the loop -------------------------------------------------------------------------------
    def replan(self) -> None:
        """Cut a multi-step decode plan at its next boundary (the host's CPU share changed)."""
        if self._busy:
            self._poke()

    def _poke(self) -> None:
        if self._in_boundary:
            return
        loop = self.loop
        if not self._busy:
            self._busy = True
            self._k = 0
            self._times = None
            self._ver += 1
            loop.at(loop.now, self._boundary, self._ver)
            if self.on_busy is not None:
                self.on_busy(self)
            return
        times = self._times
        if times is not None and len(times) > 1:
            j = bisect_left(times, loop.now)
            if j < len(times) - 1:
                del times[j + 1 :]
                self._k = j + 1
                self._ver += 1
                loop.at(times[j], self._boundary, self._ver)

    def _boundary(self, ver: int) -> None:
        if ver != self._ver:
            return
        now = self.loop.now
        self._in_boundary = True
        k = self._k
        if k:
            b = 0 if self._job_alone else len(self.running)  # an exclusive job: decoders waited
            if not self._job_alone:
                self.steps += k
            self.ctx_sum += b * k
            self.decode_tokens += b * k
            self.busy_s += now - self._t_plan
            if b and not self._step_jobs:  # a run of decode-only steps
                self.decode_wall_s += now - self._t_plan
                self.decode_model_s += (now - self._t_plan) / self._plan_f
            elif (
                self._job_alone and self._prefills_only()
            ):  # one prefill call, as the runtime times it
                self.prefill_wall_s += now - self._t_plan
                self.prefill_model_s += (now - self._t_plan) / self._plan_f
            if self._step_jobs:
                done = self._step_jobs
                self._step_jobs = []
                for job, n in done:
                    job.done += n
                    self.job_tokens += n
                    if job.done >= job.tokens:
                        job.on_done(job, now)
                        if self.exclusive_jobs and job.after_s > 0:
                            self._busy_until = now + job.after_s
            heap, running, steps = self._finish, self.running, self.steps
            while heap and heap[0][0] <= steps:
                fs, rid = heappop(heap)
                seq = running.get(rid)
                if seq is None or seq.finish_step != fs:
                    continue
                del running[rid]
                self.ctx_sum -= seq.ctx0 + (steps - seq.join_step)
                seq.on_finish(seq, now)
        while self.controls:
            ctrl = self.controls
            self.controls = []
            for fn in ctrl:
                fn(now)
        self._in_boundary = False
        self._plan(now)

    def _plan(self, now: float) -> None:
        if self._busy_until > now:  # still shipping the last job's KV: no step until then
            self.busy_s += self._busy_until - now
            self._k, self._times, self._t_plan = 0, [self._busy_until], self._busy_until
            self._ver += 1
            self.loop.at(self._busy_until, self._boundary, self._ver)
            return
        running, heap, steps = self.running, self._finish, self.steps
        first: list[Seq] = []
        # an exclusive job runs before the batch changes: new sequences join the next decode step
        while (
            self.waiting
            and len(running) < self.max_batch
            and not (self.exclusive_jobs and self.jobs)
        ):
            seq = self.waiting.popleft()
            seq.join_step = steps
            seq.finish_step = steps + max(1, seq.output - seq.tokens0)
            running[seq.rid] = seq
            heappush(heap, (seq.finish_step, seq.rid))
            self.ctx_sum += seq.ctx0
            if seq.on_first is not None:
                first.append(seq)
        b, c = len(running), self.ctx_sum
        m = self.model
        self._job_alone = False
        if self.jobs and self.exclusive_jobs:
            job = self.jobs.popleft()
            n, pos = job.tokens - job.sched, job.ctx + job.sched
            if job.started is None:
                job.started = now
            job.sched = job.tokens
            self._step_jobs.append((job, n))
            self._job_alone = True
            call = m.extend_s(n, pos) if job.kind == "extend" else m.prefill_s(n, pos)
            times = [now + call * job.factor]
        elif self.jobs:
            budget, new, pairs, kv = self.chunk, b, float(c), float(c)
            job_ovh = 0.0
            weighted = 0.0  # the step's jobs' cost factors, weighted by their tokens
            sj = self._step_jobs
            jobs = self.jobs
            while budget > 0 and jobs:
                job = jobs[0]
                n = min(budget, job.tokens - job.sched)
                pos = job.ctx + job.sched
                if job.started is None:
                    job.started = now
                pairs += n * pos + n * n / 2
                kv += pos + n
                new += n
                budget -= n
                job.sched += n
                weighted += n * job.factor
                job_ovh = max(job_ovh, m.ext_ovh if job.kind == "extend" else m.job_ovh)
                sj.append((job, n))
                if job.sched >= job.tokens:
                    jobs.popleft()
                else:
                    break
            jobs_new = new - b
            f = weighted / jobs_new if jobs_new > 0 else 1.0
            times = [now + (m.step_s(new, pairs, kv, b) + job_ovh) * f]
        elif b:
            while heap and (
                running.get(heap[0][1]) is None or running[heap[0][1]].finish_step != heap[0][0]
            ):
                heappop(heap)
            k = min(heap[0][0] - steps, MAX_PLANNED_STEPS)
            # decode-only steps: compute and memory both grow linearly with the batch's context
            fixed = m.ovh + b * m.seq_ovh
            c0 = m.fpt * b / m.flops_s + fixed
            c1 = m.apf / m.flops_s
            m0 = m.wt / m.bytes_s + fixed
            m1 = m.kvb / m.bytes_s
            t, times, ctx = now, [], c
            append = times.append
            for _ in range(k):
                comp, mem = c0 + ctx * c1, m0 + ctx * m1
                t += comp if comp > mem else mem
                append(t)
                ctx += b
        else:
            self._busy = False
            self._times = None
            if self.on_busy is not None:
                self.on_busy(self)
            return
        f = self.slowdown(bool(self._step_jobs)) if self.slowdown is not None else 1.0
        if not self._step_jobs:
            f *= self.decode_wall_factor
        elif self.prefill_wall_factor != 1.0 and self._prefills_only():
            f *= self.prefill_wall_factor
        self._plan_f = f
        if f != 1.0:
            times = [now + (t - now) * f for t in times]
        for seq in first:
            seq.on_first(seq, times[0])
        self._k = len(times)
        self._times = times
        self._t_plan = now
        self._ver += 1
        self.loop.at(times[-1], self._boundary, self._ver)
