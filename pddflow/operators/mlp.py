"""A decoder layer's feed-forward block: the dense gated MLP, or a mixture of experts (Qwen3-MoE,
Mixtral, DeepSeek-V2/V3 with their group-limited routers and shared experts). Both return the
down projection's output before any tensor-parallel sum (a rank holds a slice of every expert's
intermediate columns, so its output is a partial sum too)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pddflow.core.model_config import ModelConfig
from pddflow.operators.linear import Linear


def silu(x: torch.Tensor) -> torch.Tensor:
    # not F.silu: its vector and scalar-tail paths round differently
    return x / (1 + torch.exp(-x))


@dataclass
class GatedMLP:
    gate_up: Linear  # gate and up projections, fused: [2 * inter, hidden]
    down: Linear
    inter: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gu = self.gate_up(x)
        return self.down(silu(gu[:, : self.inter]) * gu[:, self.inter :])


@dataclass(frozen=True)
class Routing:
    """How the router's logits become each token's `top_k` experts and their weights (the
    config's `router`, see core.model_config.ROUTERS), as transformers computes each."""

    top_k: int
    renormalize: bool
    method: str = "softmax"
    groups: int = 1
    topk_groups: int = 1
    scaling: float = 1.0

    @classmethod
    def of(cls, c: ModelConfig) -> Routing:
        return cls(
            c.experts_per_token,
            c.norm_topk_prob,
            c.router,
            c.router_groups,
            c.router_topk_groups,
            c.routed_scaling_factor,
        )

    def __call__(
        self, logits: torch.Tensor, bias: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 logits [T, E] -> (weights [T, k], chosen experts [T, k])."""
        if self.method == "noaux_tc":  # V3: sigmoid; the bias steers the choice, not the weight
            scores = logits.sigmoid()
            choice = scores + bias if bias is not None else scores
            by_group = choice.view(len(logits), self.groups, -1).topk(2, dim=-1)[0].sum(-1)
            choice = choice.masked_fill(~self._kept(by_group, choice.shape[1]), float("-inf"))
            chosen = torch.topk(choice, self.top_k, dim=-1)[1]
            weights = scores.gather(1, chosen)
            if self.renormalize:
                weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
            return weights * self.scaling, chosen
        probs = torch.softmax(logits, dim=-1)
        if self.method == "group_limited_greedy":  # V2: groups ranked by their best expert
            by_group = probs.view(len(logits), self.groups, -1).amax(dim=-1)
            probs = probs.masked_fill(~self._kept(by_group, probs.shape[1]), 0.0)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights * self.scaling, chosen  # x 1.0 is exact: Qwen3-MoE's bits unchanged

    def _kept(self, by_group: torch.Tensor, experts: int) -> torch.Tensor:
        """[T, E] True where the expert's group is among each token's `topk_groups` best."""
        best = torch.topk(by_group, self.topk_groups, dim=-1)[1]
        kept = torch.zeros_like(by_group, dtype=torch.bool).scatter_(1, best, True)
        return kept.repeat_interleave(experts // self.groups, dim=1)


@dataclass
class MixtureOfExperts:
    """`routing` picks each token's experts and weights from the router's logits; each expert
    is a GatedMLP, and a `shared` one (DeepSeek) every token takes at weight 1. Tokens are
    grouped by expert: one matmul pair per expert with tokens this step, no per-token loop. A
    token's output is its experts' weighted outputs added in expert order, each computed by a
    batch-invariant Linear on its own row, so a row never depends on which other tokens share
    the step. Under expert parallelism a rank adds its own experts' outputs (and its columns of
    the shared expert); the all-reduce adds the ranks'."""

    router: Linear  # [num_experts, hidden]
    experts: list[GatedMLP | None]  # None: an expert another rank holds (expert parallel)
    routing: Routing
    router_bias: torch.Tensor | None = None  # DeepSeek-V3's e_score_correction_bias (fp32)
    shared: GatedMLP | None = None

    @property
    def top_k(self) -> int:
        return self.routing.top_k

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = self.routing(self.router(x).float(), self.router_bias)
        weights = weights.to(x.dtype).reshape(-1)
        slots = chosen.view(-1)  # slot j: token j // top_k's choice j % top_k
        order = torch.argsort(slots, stable=True)
        counts = torch.bincount(slots, minlength=len(self.experts)).tolist()
        out = torch.zeros_like(x)
        start = 0
        for expert, n in zip(self.experts, counts):
            picked = order[start : start + n]
            start += n
            if not n or expert is None:
                continue
            rows = picked // self.top_k
            y = expert(x.index_select(0, rows))
            out.index_add_(0, rows, y * weights[picked].unsqueeze(1))
        return out if self.shared is None else out + self.shared(x)
