"""A decoder layer's feed-forward block: the dense gated MLP, or a mixture of experts (Qwen3-MoE,
Mixtral). Both return the down projection's output before any tensor-parallel sum (a rank holds
a slice of every expert's intermediate columns, so its output is a partial sum too)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

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


@dataclass
class MixtureOfExperts:
    """The router's softmax picks `top_k` experts per token (their weights renormalised over the
    chosen when `renormalize`); each expert is a GatedMLP. Tokens are grouped by expert: one
    matmul pair per expert with tokens this step, no per-token loop. A token's output is its
    experts' weighted outputs added in expert order, each computed by a batch-invariant Linear
    on its own row, so a row never depends on which other tokens share the step. Under expert
    parallelism a rank adds its own experts' outputs; the all-reduce adds the ranks'."""

    router: Linear  # [num_experts, hidden]
    experts: list[GatedMLP | None]  # None: an expert another rank holds (expert parallel)
    top_k: int
    renormalize: bool

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.router(x).float(), dim=-1)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype).view(-1)
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
        return out
