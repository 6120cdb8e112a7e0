"""Tensor parallelism (docs/engine.md, Tensor parallelism): tiny random Llama checkpoints with 2, 4
and 8 KV heads (of 8 query heads) at TP 1, 2 and 4, TP 4 over 2 KV heads included, a Qwen3 (its
q/k norms) with 2, a Qwen3-MoE (2 KV heads: every expert's intermediate columns split over the
ranks) and a DeepSeek-V3 (8 heads over one latent every rank keeps whole; routed and shared
experts split).
Logits within 1e-4 of TP 1 and of transformers, greedy tokens identical, through chunked prefill,
continuous batching with radix-cache hits, extends beside decodes, and KV moved between degrees
(1 -> 4, 1 -> 2, 4 -> 2, 2 -> 1, 4 -> 1) continuing exactly. The TP runs are processes
(pddflow.testing.tp_harness); one TP 4 and one TP 2 instance walk all six checkpoints."""

from __future__ import annotations

import pytest
import torch

from pddflow.operators.engine import Engine
from pddflow.operators.weights import load_model_source
from pddflow.testing.tp_harness import CONFIG, CONTINUATION, PROMPT, run_harness, run_scenarios

pytestmark = pytest.mark.slow
TOL = 1e-4
# every KV layout on Llama; Qwen3's q/k norms (per head, whatever the KV heads) on one; MLA's
# latent is its one KV head. Each checkpoint's seed: one whose greedy continuation is varied.
SEEDS = {
    "llama-kv2": 20,
    "llama-kv4": 21,
    "llama-kv8": 22,
    "qwen3-kv2": 23,
    "qwen3_moe-kv2": 26,
    "deepseek_v3-kv1": 27,
}
NAMES = list(SEEDS)
DEGREES = [2, 4]


@pytest.fixture(scope="session")
def tp_checkpoints(tmp_path_factory) -> dict[str, str]:
    pytest.importorskip("transformers")
    from pddflow.testing import tiny_checkpoints as tiny

    out = {}
    for name, seed in SEEDS.items():
        arch, kv = name.split("-kv")
        path = tmp_path_factory.mktemp(name)
        if arch == "deepseek_v3":
            out[name] = str(tiny.tiny_deepseek_v3(path, seed=seed, heads=8))
            continue
        make = getattr(tiny, f"tiny_{arch}")
        out[name] = str(make(path, seed=seed, heads=8, kv_heads=int(kv)))
    return out


@pytest.fixture(scope="session")
def tp1(tp_checkpoints) -> dict[str, dict]:
    return {
        name: run_scenarios(Engine(load_model_source(path), CONFIG))
        for name, path in tp_checkpoints.items()
    }


@pytest.fixture(scope="session")
def tp_runs(tp_checkpoints, tp1) -> dict[int, dict[str, dict]]:
    """TP 4 imports TP 1's export; TP 2 imports TP 1's and TP 4's."""
    models = list(tp_checkpoints.items())
    runs = {1: tp1}
    runs[4] = run_harness(4, models, {n: {"1": tp1[n]["export"]} for n in NAMES})
    runs[2] = run_harness(
        2, models, {n: {"1": tp1[n]["export"], "4": runs[4][n]["export"]} for n in NAMES}
    )
    return runs


@pytest.fixture(scope="session")
def hf_reference(tp_checkpoints) -> dict[str, dict]:
    transformers = pytest.importorskip("transformers")
    out = {}
    for name, path in tp_checkpoints.items():
        hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        hf.generation_config.eos_token_id = None  # CONTINUATION tokens, EOS an ordinary one
        with torch.inference_mode():
            logits = hf(torch.tensor([PROMPT])).logits[0]
            gen = hf.generate(
                torch.tensor([PROMPT]), max_new_tokens=CONTINUATION, do_sample=False, pad_token_id=0
            )
        out[name] = {"logits": logits, "greedy": gen[0, len(PROMPT) :].tolist()}
    return out


def _close(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a - b).abs().max().item()


@pytest.mark.parametrize("degree", [1, *DEGREES])
@pytest.mark.parametrize("name", NAMES)
def test_logits_match_tp1_and_transformers(tp_runs, hf_reference, name, degree):
    got, ref = tp_runs[degree][name], tp_runs[1][name]
    assert _close(got["score"], hf_reference[name]["logits"]) < TOL
    assert _close(got["score"], ref["score"]) < TOL
    # greedy continuation of the exported prompt == transformers' generate
    assert got["continuation"] == hf_reference[name]["greedy"]
    assert len(set(got["continuation"])) > 3, "degenerate test model"


@pytest.mark.parametrize("degree", DEGREES)
@pytest.mark.parametrize("name", NAMES)
def test_batches_radix_hits_and_extends_match_tp1(tp_runs, name, degree):
    got, ref = tp_runs[degree][name], tp_runs[1][name]
    assert got["batch_tokens"] == ref["batch_tokens"]
    assert got["steps_tokens"] == ref["steps_tokens"]
    assert got["radix_hit_tokens"] == ref["radix_hit_tokens"] > 0
    for part in ("batch_logits", "steps_logits"):
        assert got[part].keys() == ref[part].keys()
        for key in ref[part]:
            assert _close(got[part][key], ref[part][key]) < TOL, (part, key)
    assert _close(got["continuation_logits"], ref["continuation_logits"]) < TOL


@pytest.mark.parametrize("degree", [1, *DEGREES])
@pytest.mark.parametrize("name", NAMES)
def test_tp_is_batch_invariant(tp_runs, name, degree):
    """The reduction adds the ranks' partial sums in rank order, elementwise: the prompt's last
    row has the same bits teacher-forced in chunks of 16 (score), prefilled in a batch over
    cached blocks (generate) and computed alone over cached blocks (the exported sequence)."""
    got = tp_runs[degree][name]
    last = got["score"][-1]
    assert torch.equal(got["batch_logits"]["g2"][0], last)
    assert torch.equal(got["continuation_logits"][0], last)


@pytest.mark.parametrize("degree", DEGREES)
@pytest.mark.parametrize("name", NAMES)
def test_export_is_canonical(tp_runs, name, degree):
    for part in ("export", "export_tail"):
        got, ref = tp_runs[degree][name][part], tp_runs[1][name][part]
        assert {k: v for k, v in got.items() if k != "data"} == {
            k: v for k, v in ref.items() if k != "data"
        }
        assert _close(got["data"], ref["data"]) < TOL


@pytest.fixture(scope="session")
def tp1_imports(tp_checkpoints, tp_runs) -> dict[str, dict]:
    """TP 1 engines continue TP 2's and TP 4's exports."""
    return {
        name: run_scenarios(
            Engine(load_model_source(path), CONFIG),
            {str(d): tp_runs[d][name]["export"] for d in DEGREES},
        )["imports"]
        for name, path in tp_checkpoints.items()
    }


@pytest.mark.parametrize("name", NAMES)
def test_kv_moves_between_degrees(tp_runs, tp1_imports, name):
    ref = tp_runs[1][name]
    moves = {
        "1 -> 4": tp_runs[4][name]["imports"]["1"],
        "1 -> 2": tp_runs[2][name]["imports"]["1"],
        "4 -> 2": tp_runs[2][name]["imports"]["4"],
        "2 -> 1": tp1_imports[name]["2"],
        "4 -> 1": tp1_imports[name]["4"],
    }
    for move, got in moves.items():
        assert got["tokens"] == ref["continuation"], move
        # the first token came with the KV: logits of the 7 decoded after it
        assert _close(got["logits"], ref["continuation_logits"][1:]) < TOL, move


MOE = "qwen3_moe-kv2"


@pytest.fixture(scope="session")
def ep_runs(tp_checkpoints) -> dict[int, dict]:
    """The Qwen3-MoE with whole experts per rank: 4 of its 8 at EP 2 (EP 4 differs only in
    which experts a rank holds; generate --expert-parallel and the deployed test cover more)."""
    model = [(MOE, tp_checkpoints[MOE])]
    return {2: run_harness(2, model, expert_parallel=True)[MOE]}


@pytest.mark.parametrize("degree", [2])
def test_expert_parallel_equals_one_rank(ep_runs, tp_runs, hf_reference, degree):
    """Attention split by heads, experts whole on their rank: logits within 1e-4 of TP 1 and of
    transformers, the same greedy tokens through batches, radix hits and extends."""
    got, ref = ep_runs[degree], tp_runs[1][MOE]
    assert _close(got["score"], ref["score"]) < TOL
    assert _close(got["score"], hf_reference[MOE]["logits"]) < TOL
    assert got["continuation"] == ref["continuation"] == hf_reference[MOE]["greedy"]
    assert got["batch_tokens"] == ref["batch_tokens"]
    assert got["steps_tokens"] == ref["steps_tokens"]
    assert got["radix_hit_tokens"] == ref["radix_hit_tokens"] > 0
    last = got["score"][-1]  # batch invariant at this layout too
    assert torch.equal(got["batch_logits"]["g2"][0], last)


def test_expert_parallel_layouts_are_checked():
    from pddflow.core.model_config import ModelConfig
    from pddflow.operators.tensor_parallel import Shard, check_layout

    moe = ModelConfig(
        arch="mixtral",
        vocab_size=10,
        hidden_size=8,
        intermediate_size=6,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        head_dim=2,
        num_experts=6,
        experts_per_token=2,
        moe_intermediate_size=6,
    )
    with pytest.raises(ValueError, match="6 experts do not split over 4 ranks"):
        check_layout(moe, 4, expert_parallel=True)
    with pytest.raises(ValueError, match="expert intermediate size 6 does not split over 4"):
        check_layout(moe, 4)
    shards = [Shard.of(moe, 2, r, expert_parallel=True) for r in range(2)]
    assert [[e for e in range(6) if s.holds_expert(e)] for s in shards] == [[0, 1, 2], [3, 4, 5]]
    assert {s.local.moe_intermediate_size for s in shards} == {6}
