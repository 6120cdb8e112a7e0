"""What every policy shares: instance choice, transfer prediction, handoff resolution, `build`."""

from __future__ import annotations

from typing import Any

from pddflow.core.policies import POLICIES
from pddflow.graph.plan import Plan
from pddflow.scheduler.decision import Decision
from pddflow.scheduler.features import RequestFeatures
from pddflow.scheduler.output_lengths import OutputLengths
from pddflow.scheduler.state import SchedulerState
from pddflow.scheduler.topology import PathInfo, Topology


class Policy:
    """Subclasses implement `decide`; the only state: two counters bounding the singular share."""

    name = ""
    # a whole prompt cached on an instance is worth this much extra load there (1.0: a full batch)
    hit_worth_load = 0.25

    def __init__(self, plan: Plan, params: dict[str, Any] | None = None):
        self.plan = plan
        self.topo = Topology(plan)
        declared = POLICIES.get(self.name).params if self.name in POLICIES else {}
        self.params = {k: p.default for k, p in declared.items()}
        if plan.scheduler.policy == self.name:
            self.params.update(plan.scheduler.params)
        self.params.update(params or {})
        # transfers are sized by the KV that moves: the plan's production architecture (plan,
        # simulate); the runtime's frontend sets the served model's, which its workers report
        self.kv_bytes_per_token = plan.model.arch.kv_bytes_per_token
        self.decided = 0
        self.singular_count = 0
        self.outputs = OutputLengths()  # fed by the runtime's frontend and the simulator

    def finished(self, prompt_tokens: int, output_tokens: int) -> None:
        """A request ended with this many output tokens (for the next ones' expected length)."""
        self.outputs.finished(prompt_tokens, output_tokens)

    def decide(self, req: RequestFeatures, state: SchedulerState) -> Decision:
        raise NotImplementedError

    def pick_cached(
        self, operator: str, req: RequestFeatures, state: SchedulerState
    ) -> tuple[str, int]:
        """(instance, hit blocks): best hit share against load; ties to the lowest index."""
        insts = self.plan.operators[operator].instances
        best, best_key, best_hit = insts[0], None, 0
        scale = 1.0 / max(req.prompt_tokens, 1)
        for inst in insts:
            m = state.mirrors.get(inst)
            hit = m.match(req.block_hashes) if m is not None else 0
            score = req.cached_tokens(hit) * scale - state.load(inst) / self.hit_worth_load
            if best_key is None or score > best_key:
                best, best_key, best_hit = inst, score, hit
        return best, best_hit

    def pick_prefill(self, operator: str, req: RequestFeatures, state: SchedulerState) -> str:
        """The prefill instance with the fewest queued + uncached tokens; ties to the lowest."""
        insts = self.plan.operators[operator].instances
        best, best_key = insts[0], None
        for idx, inst in enumerate(insts):
            ld = state.loads.get(inst)
            m = state.mirrors.get(inst)
            hit = req.cached_tokens(m.match(req.block_hashes)) if m is not None else 0
            key = ((ld.queued_tokens if ld is not None else 0) + req.prompt_tokens - hit, idx)
            if best_key is None or key < best_key:
                best, best_key = inst, key
        return best

    def prefill_wait_s(self, prefill: str, req: RequestFeatures, state: SchedulerState) -> float:
        """Predicted seconds until instance `prefill` has prefilled the request: the tokens queued
        ahead of it and its own uncached ones, at the instance's measured rate (0 until one was
        measured)."""
        rate = state.prefill_s_per_token.get(prefill, 0.0)
        if not rate:
            return 0.0
        ld = state.loads.get(prefill)
        m = state.mirrors.get(prefill)
        hit = req.cached_tokens(m.match(req.block_hashes)) if m is not None else 0
        queued = ld.queued_tokens if ld is not None else 0
        return (queued + req.prompt_tokens - hit) * rate

    def tier_load_s(
        self, instance: str, req: RequestFeatures, hit_blocks: int, state: SchedulerState
    ) -> float:
        """Seconds to load the part of a hit that `instance` holds below its device (host
        memory, disk) into device blocks, at each tier's rate."""
        m, rates = state.mirrors.get(instance), state.tier_s_per_byte.get(instance)
        if m is None or not rates or not hit_blocks:
            return 0.0
        return sum(
            req.cached_tokens(n) * self.kv_bytes_per_token * rates.get(tier, 0.0)
            for tier, n in m.lower(req.block_hashes, hit_blocks).items()
        )

    def pick_least_loaded(self, operator: str, state: SchedulerState) -> str:
        insts = self.plan.operators[operator].instances
        return min(insts, key=lambda i: (state.load(i), insts.index(i)))

    def transfer(
        self,
        path: PathInfo,
        hit_tokens: int,
        req: RequestFeatures,
        state: SchedulerState,
        quantile: str = "p90",
    ) -> tuple[float, float]:
        """(bytes, seconds at `quantile`) of the prompt KV the finishing decoder lacks."""
        ch = path.kv_to_main
        if ch is None:
            return 0.0, 0.0
        nbytes = float(max(req.prompt_tokens - hit_tokens, 0) * self.kv_bytes_per_token)
        if ch.link is not None and ch.link in state.links:
            return nbytes, state.links[ch.link].transfer_s(nbytes, quantile)
        return nbytes, nbytes / self.topo.rdma_bytes_per_s(path.prefill, path.main)

    def handoff_mode(
        self, path: PathInfo, relay_instance: str | None, state: SchedulerState
    ) -> str | None:
        if not path.has_handoff:
            return None
        mode = path.variant.handoff or "one_shot"
        if mode == "adaptive":
            # a busy relay sheds work at once; an idle one keeps generating while main catches up
            return (
                "one_shot"
                if state.load(relay_instance) >= self.params.get("catch_up_load", 0.7)
                else "catch_up"
            )
        return mode

    def build(
        self,
        path: PathInfo,
        req: RequestFeatures,
        state: SchedulerState,
        *,
        main_instance: str | None = None,
        hit_blocks: int | None = None,
        singular: bool = False,
        reason: str = "",
    ) -> Decision:
        if main_instance is None:
            main_instance, hit_blocks = self.pick_cached(path.main, req, state)
        hit_tokens = req.cached_tokens(hit_blocks or 0)
        nbytes, seconds = self.transfer(path, hit_tokens, req, state)
        targets = []
        relay_inst = None
        for op in path.variant.path:
            if op == path.main:
                inst = main_instance
            elif op == path.prefill:
                inst = self.pick_prefill(op, req, state)
            else:
                inst = self.pick_least_loaded(op, state)
            if op == path.relay:
                relay_inst = inst
            targets.append((op, inst))
        self.decided += 1
        self.singular_count += singular
        return Decision(
            path.name,
            tuple(targets),
            self.handoff_mode(path, relay_inst, state),
            singular,
            hit_tokens / max(req.prompt_tokens, 1),
            hit_tokens,
            nbytes,
            seconds,
            reason,
        )
