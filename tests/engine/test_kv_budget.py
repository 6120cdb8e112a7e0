"""The one "does this request's KV fit" arithmetic (pddflow.core.kv_budget) and the reference
loop that admits by it (pddflow.operators.continuous_batching)."""

from conftest import small_engine

from pddflow.core.kv_budget import blocks_for, kv_fit
from pddflow.core.payloads import SamplingParams
from pddflow.operators import continuous_batching


def test_blocks_for_rounds_a_partial_block_up():
    assert [blocks_for(n, 16) for n in (0, 1, 16, 17, 32, 33)] == [0, 1, 1, 2, 2, 3]
    assert blocks_for(-5, 16) == 0


def test_a_request_fits_when_prompt_and_max_tokens_fit_the_pool():
    fit = kv_fit(100, 28, 16, 8)  # 128 tokens: exactly 8 blocks
    assert fit.blocks == 8 and fit.fits
    assert not kv_fit(100, 29, 16, 8).fits
    assert kv_fit(100, -3, 16, 7).blocks == 7  # a negative max_tokens counts as none


def test_a_prefill_instance_holds_only_the_prompt():
    fit = kv_fit(100, 1000, 16, 7, holds_output=False)
    assert fit.blocks == 7 and fit.fits


def test_the_refusal_says_what_it_needs_and_what_the_instance_holds():
    fit = kv_fit(100, 200, 16, 10)
    assert fit.refusal("main/0") == (
        "the prompt (100 tokens) and max_tokens (200) need 19 KV blocks on main/0, which holds "
        "10 (160 tokens); lower max_tokens or shorten the prompt"
    )


def test_the_reference_loop_runs_on_any_engine_and_matches_engine_generate():
    prompts = [[1, 5, 9, 80], [7, 7, 7]]
    params = SamplingParams(max_tokens=6)
    direct = continuous_batching.generate(small_engine(), prompts, params, max_batch=2)
    method = small_engine().generate(prompts, params, max_batch=2)
    assert [s.output_ids for s in direct] == [s.output_ids for s in method]
    assert all(len(s.output_ids) == 6 for s in direct)
