"""`pddflow generate` and `pddflow bench engine` through the typer app (in process)."""

import json
import os
import subprocess

import pytest
from typer.testing import CliRunner

from pddflow.cli import app
from pddflow.core.payloads import SamplingParams
from pddflow.operators.engine import Engine, EngineConfig

runner = CliRunner()


def run(*args: str):
    res = runner.invoke(app, list(args))
    assert "Traceback" not in (res.output or ""), res.output
    return res


@pytest.mark.slow
def test_generate_json_matches_engine(tiny_llama_dir):
    res = run(
        "generate",
        "--model",
        str(tiny_llama_dir),
        "--prompt-ids",
        "1,5,9,120",
        "--max-tokens",
        "7",
        "--json",
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["text"] is None  # no tokenizer.json in this checkpoint
    ref = (
        Engine.from_spec(str(tiny_llama_dir), EngineConfig(kv_cache_bytes=2**20))
        .generate([[1, 5, 9, 120]], SamplingParams(max_tokens=7, stop_token_ids=(2,)))[0]
        .output_ids
    )
    assert out["token_ids"] == ref and 1 <= len(ref) <= 7


@pytest.mark.slow
def test_generate_an_moe_expert_parallel_equals_one_rank(tiny_qwen3_moe_dir):
    """generate on a Qwen3-MoE checkpoint, 2 ranks with whole experts each: transformers' and
    the single engine's greedy tokens."""
    res = run(
        "generate",
        "--model",
        str(tiny_qwen3_moe_dir),
        "--prompt",
        "Hello there! How are you?",
        "--max-tokens",
        "12",
        "--tensor-parallel",
        "2",
        "--expert-parallel",
        "--json",
    )
    assert res.exit_code == 0, res.output
    eng = Engine.from_spec(str(tiny_qwen3_moe_dir), EngineConfig(kv_cache_bytes=2**20))
    ids = eng.tokenizer.encode("Hello there! How are you?")
    stop = tuple(eng.tokenizer.eos_token_ids)
    ref = eng.generate([ids], SamplingParams(max_tokens=12, stop_token_ids=stop))[0].output_ids
    assert json.loads(res.stdout)["token_ids"] == ref


@pytest.mark.slow
@pytest.mark.parametrize(
    "fixture, ranks", [("tiny_deepseek_v2_dir", "1"), ("tiny_deepseek_v3_dir", "2")]
)
def test_generate_deepseek_equals_transformers(fixture, ranks, request):
    """generate on DeepSeek-V2-Lite and V3 shapes (the V3 one on 2 ranks: heads split, the
    latent whole on each): transformers' greedy tokens, to its EOS."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = request.getfixturevalue(fixture)
    prompt = "Hello there! How are you today?"
    res = run(
        "generate", "--model", str(path), "--prompt", prompt, "--max-tokens", "12",
        "--tensor-parallel", ranks, "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    tok = transformers.AutoTokenizer.from_pretrained(path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = tok.encode(prompt, add_special_tokens=False)
    with torch.inference_mode():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, pad_token_id=0)
    ref = out[0, len(ids) :].tolist()
    eos = hf.generation_config.eos_token_id
    ref = ref[: ref.index(eos) + 1] if eos in ref else ref
    assert json.loads(res.stdout)["token_ids"] == ref


@pytest.mark.slow
def test_generate_builtin_text_prompt():
    res = run(
        "generate",
        "--model",
        "builtin:tiny-llama",
        "--prompt",
        "Hello",
        "--max-tokens",
        "4",
        "--json",
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert len(out["token_ids"]) <= 4 and isinstance(out["text"], str)


@pytest.mark.slow
def test_generate_with_tokenizer_and_seeded_sampling(tiny_llama_with_tokenizer):
    args = [
        "generate",
        "-m",
        str(tiny_llama_with_tokenizer),
        "--prompt",
        "w1 w2 w3",
        "--max-tokens",
        "6",
        "--temperature",
        "0.8",
        "--top-p",
        "0.9",
        "--seed",
        "7",
        "--json",
    ]
    a, b = run(*args), run(*args)
    assert a.exit_code == 0, a.output
    assert json.loads(a.stdout) == json.loads(b.stdout)
    assert isinstance(json.loads(a.stdout)["text"], str)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "builtin:tiny-lama", "--prompt-ids", "1"], "did you mean 'tiny-llama'"),
        (["--model", "/no/such/dir", "--prompt-ids", "1"], "neither builtin"),
        (["--prompt-ids", "1,x,3"], "'x' is not an integer"),
        (["--prompt-ids", ""], "empty"),
        pytest.param(
            ["--prompt-ids", "1,2,100000"],
            "outside the vocabulary",
            marks=pytest.mark.slow,  # loads the built-in model first
        ),
        (["--prompt", "a", "--prompt-ids", "1"], "exactly one of"),
        ([], "exactly one of"),
        (["--prompt-ids", "1", "--max-tokens", "0"], "--max-tokens"),
    ],
)
def test_generate_errors_are_clear(args, message):
    res = run("generate", *args)
    assert res.exit_code == 2
    assert message in res.output


@pytest.mark.slow
def test_text_prompt_without_tokenizer(tiny_llama_dir):
    res = run("generate", "--model", str(tiny_llama_dir), "--prompt", "hi")
    assert res.exit_code == 2 and "--prompt-ids" in res.output


@pytest.mark.slow
def test_bench_engine_quick_json(tiny_llama_dir):
    res = run(
        "bench",
        "engine",
        "--model",
        str(tiny_llama_dir),
        "--quick",
        "--json",
        "--batch",
        "3",
        "--tensor-parallel",
        "1,2,3",
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert set(out["mixed"]) >= {"engine_tok_s", "hf_tok_s", "ratio"}
    # HF's static batches run every row to the batch's longest output: never fewer tokens.
    assert out["mixed"]["hf_generated_tokens"] >= out["mixed"]["output_tokens"] > 0
    assert set(out["prefill"]) == {"64", "128"} and {"1", "4"} <= set(out["decode"])
    assert out["batch_invariant"] is True
    assert out["decode_long"]["batch"] == 4 and out["decode_long"]["context"] == 768
    assert (out["extend_long"]["tokens"], out["extend_long"]["context"]) == (128, 768)
    tp = out["tensor_parallel"]  # the same steps at TP 1 and 2; 3 does not split this model
    assert tp["same_greedy_tokens"] is True and "skipped" in tp["degrees"]["3"]
    assert tp["degrees"]["2"]["decode_step_ms"] > 0 and tp["degrees"]["1"]["prefill_vs_tp1"] == 1
    grid = out["prefill_grid"]["points"]  # prompts over a cached prefix, the prefix really reused
    assert {(p["tokens"], p["cached"]) for p in grid} >= {(32, 0), (128, 256), (256, 768)}
    from pddflow.bench.corun import cores_for_corun

    if cores_for_corun() is None:
        assert "corun" not in out
    else:  # measured next to a decoding companion, which is gone again; our affinity is restored
        co = out["corun"]
        assert co["companion"] == "decode batch 4 over 768 tokens"
        assert co["cores"][0] != co["cores"][1]
        assert len(os.sched_getaffinity(0)) >= 2
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert "pddflow.bench.corun" not in ps


def test_module_import_is_light():
    import subprocess
    import sys

    code = (
        "import sys, pddflow.commands.engine_cmds; "
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


def test_corun_companion_start_has_a_deadline():
    """A companion that never says "ready" (hung, or crashed) is given up on at the deadline."""
    import sys
    import time

    from pddflow.bench.corun import _started

    silent = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], stdout=subprocess.PIPE, text=True
    )
    t = time.monotonic()
    try:
        assert _started(silent, 0.5) is False and time.monotonic() - t < 5
    finally:
        silent.kill()
        silent.wait()
    crashed = subprocess.Popen(
        [sys.executable, "-c", "raise SystemExit(3)"], stdout=subprocess.PIPE, text=True
    )
    assert _started(crashed, 10) is False and crashed.wait() == 3
