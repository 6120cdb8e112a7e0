"""One instance's batch loop, an event per step boundary: chunked prefill/extend jobs plus a
continuous decode batch (docs/simulator.md, Engines and events). Controls run at the next
boundary, where token counts are exact."""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from enum import IntEnum
from heapq import heappop, heappush

from pddflow.core.device_model import DeviceModel
from pddflow.sim.events import EventLoop

MAX_PLANNED_STEPS = 1 << 16


class StepKind(IntEnum):
    """What a step runs: decode only, prefill chunks (decoders may ride along), or any extend."""

    DECODE = 0
    PREFILL = 1
    EXTEND = 2


class Job:
    """`tokens` new tokens to compute over `ctx` tokens already held."""

    __slots__ = (
        "flight",
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
        flight,
        tokens: int,
        ctx: int,
        on_done: Callable,
        kind: StepKind = StepKind.PREFILL,
        factor: float = 1.0,
        after_s: float = 0.0,
    ):
        self.flight, self.tokens, self.ctx, self.on_done, self.kind = (
            flight,
            max(1, tokens),
            ctx,
            on_done,
            kind,
        )
        self.factor = factor  # this job's cost against the model
        self.after_s = after_s  # exclusive: the engine stays busy this long after it (shipping KV)
        self.sched = 0
        self.done = 0
        self.started: float | None = None


class Seq:
    """`tokens0` output tokens already emitted when it joined, `output` in all."""

    __slots__ = (
        "flight",
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
        flight,
        rid: int,
        ctx0: int,
        tokens0: int,
        output: int,
        on_first: Callable | None,
        on_finish: Callable,
    ):
        self.flight, self.rid, self.ctx0, self.tokens0, self.output = (
            flight,
            rid,
            ctx0,
            tokens0,
            output,
        )
        self.on_first, self.on_finish = on_first, on_finish
        self.join_step = -1
        self.finish_step = -1


class SimEngine:
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
        self.after_step: list[Callable[[float], None]] = []  # controls once a step has run
        self._finish: list[tuple[int, int]] = []
        self.steps = 0
        self.ctx_sum = 0
        self.busy = False
        self._ver = 0
        self._k = 0
        self._times: list[float] | None = None
        self._t_plan = 0.0
        self._step_jobs: list[tuple[Job, int]] = []
        self._in_boundary = False
        self.busy_s = 0.0
        self.decode_tokens = 0
        self.job_tokens = 0
        # on a shared host (calibration/host.py) a step takes slowdown(kind) x the model's time
        self.slowdown: Callable[[StepKind], float] | None = None
        self.on_busy: Callable[[SimEngine], None] | None = None
        # per StepKind: simulated seconds, and the same steps at the model's time
        self.wall_s = [0.0, 0.0, 0.0]
        self.model_s = [0.0, 0.0, 0.0]
        self._plan_f = 1.0
        self._plan_kind = StepKind.DECODE

    def wall_over_model(self, kind: StepKind) -> float | None:
        return self.wall_s[kind] / self.model_s[kind] if self.model_s[kind] > 0 else None

    def submit_job(self, job: Job) -> None:
        self.jobs.append(job)
        self._poke()

    def submit_seq(self, seq: Seq) -> None:
        self.waiting.append(seq)
        self._poke()

    def submit_control(self, fn: Callable[[float], None]) -> None:
        self.controls.append(fn)
        self._poke()

    def submit_after_step(self, fn: Callable[[float], None]) -> None:
        """`fn` at the first step boundary after at least one more step (a relay that waits for
        its next token; a plain control queued from a control runs in the same boundary)."""
        self.after_step.append(fn)
        self._poke()

    def generated(self, seq: Seq) -> int:
        return seq.tokens0 + (self.steps - seq.join_step) if seq.join_step >= 0 else seq.tokens0

    def is_running(self, seq: Seq) -> bool:
        return self.running.get(seq.rid) is seq

    def remove(self, seq: Seq) -> int:
        """Returns the tokens it had emitted here."""
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

    def replan(self) -> None:
        """Cut a multi-step decode plan at its next boundary (the host's CPU share changed)."""
        if self.busy:
            self._poke()

    def _poke(self) -> None:
        if self._in_boundary:
            return
        loop = self.loop
        if not self.busy:
            self.busy = True
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
        if k and self.after_step:
            self.controls += self.after_step
            self.after_step = []
        if k:
            b = 0 if self._job_alone else len(self.running)  # an exclusive job: decoders waited
            if not self._job_alone:
                self.steps += k
            self.ctx_sum += b * k
            self.decode_tokens += b * k
            took = now - self._t_plan
            self.busy_s += took
            if self.slowdown is not None:
                self.wall_s[self._plan_kind] += took
                self.model_s[self._plan_kind] += took / self._plan_f
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
            kind = job.kind
            call = m.extend_s(n, pos) if kind is StepKind.EXTEND else m.prefill_s(n, pos)
            times = [now + call * job.factor]
        elif self.jobs:
            budget, new, pairs, kv = self.chunk, b, float(c), float(c)
            fixed = 0.0
            weighted = 0.0
            sj = self._step_jobs
            jobs = self.jobs
            kind = StepKind.PREFILL
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
                if job.kind is StepKind.EXTEND:
                    kind = StepKind.EXTEND
                    fixed = max(fixed, m.extend_overhead_s)
                else:
                    fixed = max(fixed, m.prefill_overhead_s)
                sj.append((job, n))
                if job.sched >= job.tokens:
                    jobs.popleft()
                else:
                    break
            jobs_new = new - b
            f = weighted / jobs_new if jobs_new > 0 else 1.0
            times = [now + (m.step_s(new, pairs, kv, b, float(c)) + fixed) * f]
        elif b:
            while heap and (
                running.get(heap[0][1]) is None or running[heap[0][1]].finish_step != heap[0][0]
            ):
                heappop(heap)
            k = min(heap[0][0] - steps, MAX_PLANNED_STEPS)
            kind = StepKind.DECODE
            # decode-only steps: compute and memory both grow linearly with the batch's context
            fixed = m.step_overhead_s + b * m.seq_overhead_s
            c0 = m.flops_per_token * b / m.flops_s + fixed
            c1 = m.decode_attn_flops_per_pair / m.flops_s
            m0 = m.weight_bytes / m.bytes_s + fixed
            m1 = m.kv_read_bytes_per_token / m.bytes_s
            t, times, ctx = now, [], c
            append = times.append
            for _ in range(k):
                comp, mem = c0 + ctx * c1, m0 + ctx * m1
                t += comp if comp > mem else mem
                append(t)
                ctx += b
        else:
            self.busy = False
            self._times = None
            if self.on_busy is not None:
                self.on_busy(self)
            return
        f = self.slowdown(kind) if self.slowdown is not None else 1.0
        self._plan_f, self._plan_kind = f, kind
        if f != 1.0:
            times = [now + (t - now) * f for t in times]
        for seq in first:
            seq.on_first(seq, times[0])
        self._k = len(times)
        self._times = times
        self._t_plan = now
        self._ver += 1
        self.loop.at(times[-1], self._boundary, self._ver)
