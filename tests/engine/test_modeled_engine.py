"""The modeled engine (operators/modeled_engine.py): its tokens depend on the context alone, its
KV carries them (a transfer that loses or alters a block changes the answer), its time is the
device model's, and a worker running it never imports torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pddflow.core.device_model import DeviceModel
from pddflow.core.payloads import SamplingParams
from pddflow.graph.load import load_plan
from pddflow.operators.engine_config import EngineConfig
from pddflow.operators.modeled_engine import ModeledEngine
from pddflow.operators.weights import model_config_of

GRAPH = Path(__file__).resolve().parents[2] / "graphs" / "pdd.yaml"
PLAN = load_plan(str(GRAPH))
STOPS = (0, 1, 2)
PROMPTS = [[(i * 7 + j * 13) % 250 + 3 for j in range(40 + 37 * i)] for i in range(5)]
GREEDY = SamplingParams(max_tokens=24, stop_token_ids=STOPS)


def engine(op: str = "main", chunk: int = 512, time_scale: float = 1e-6) -> ModeledEngine:
    o = PLAN.operators[op]
    arch = PLAN.model.arch
    config = EngineConfig(chunk_size=chunk, kv_cache_bytes=int(arch.kv_bytes_per_token) * 16 * 512)
    step = DeviceModel(PLAN.device_classes[o.device], o.devices_per_replica, arch)
    model = model_config_of(PLAN.model.weights)
    return ModeledEngine(
        config, model, step, int(arch.kv_bytes_per_token * 16), 1 / 256, time_scale
    )


def outputs(e: ModeledEngine, batch: int) -> list[list[int]]:
    return [s.output_ids for s in e.generate(PROMPTS, GREEDY, max_batch=batch)]


def test_tokens_depend_on_the_context_alone():
    want = outputs(engine(), 5)
    assert outputs(engine(), 1) == want  # batching
    assert outputs(engine(chunk=16), 3) == want  # chunking
    assert outputs(ModeledEngine.reference(PLAN.model.weights, 1 << 20), 5) == want  # no timing
    warm = engine()
    outputs(warm, 5)
    assert outputs(warm, 2) == want  # from the prefix cache
    assert len({tuple(o) for o in want}) == len(want)  # different contexts, different answers
    for o in want:  # never a stop token: every answer runs to max_tokens
        assert len(o) == GREEDY.max_tokens and not set(o) & set(STOPS)


def test_kv_moved_between_engines_carries_the_answer():
    prefill, decode = engine("prefill"), engine("main")
    want = outputs(engine(), 5)
    true_block = PLAN.model.arch.kv_bytes_per_token * 16
    for prompt, ref in zip(PROMPTS, want, strict=True):
        seq = prefill.add_sequence(prompt, GREEDY)
        first = prefill.prefill(seq)
        kv = prefill.export_kv(seq)
        assert kv.data.shape[1] * 4 == prefill.block_bytes == pytest.approx(true_block / 256, 1e-3)
        got = decode.add_sequence(prompt, GREEDY)
        decode.import_kv(got, kv, cache=False)
        decode.append_tokens(got, [first])
        while not got.finished:
            decode.decode([got])
        assert [first] + got.output_ids[1:] == ref and got.output_ids == ref
        # the same KV with one value altered, anywhere, gives another answer
        bad = prefill.export_kv(seq)
        bad.data[len(prompt) % 3, 5] ^= 1
        other = decode.add_sequence(prompt, GREEDY)
        decode.import_kv(other, bad, cache=False)
        decode.append_tokens(other, [first])
        decode.decode([other])
        assert other.output_ids[1] != ref[1]
        decode.free(got), decode.free(other), prefill.free(seq)


def test_a_step_takes_the_device_models_time():
    e = engine("main")
    seqs = [e.add_sequence(p, GREEDY) for p in PROMPTS]
    for s in seqs:
        e.prefill(s)
    before, ctx = e.busy_s, sum(s.num_computed for s in seqs)
    e.decode(seqs)
    want = e.step_model.step_s(len(seqs), ctx + len(seqs) / 2, ctx + len(seqs), len(seqs))
    assert e.busy_s - before == pytest.approx(want, rel=1e-9)
    # a 70B model's decode step on four bandwidth-heavy devices: weights over HBM, milliseconds
    assert 0.005 < want < 0.1


def test_structured_output_is_refused():
    with pytest.raises(ValueError, match="structured output"):
        engine().add_sequence([5, 6, 7], SamplingParams(grammar='{"type": "json"}'))


def test_a_modeled_worker_never_imports_torch():
    code = (
        "import sys\n"
        "from pddflow.graph.load import load_plan\n"
        "from pddflow.runtime.wiring import wire\n"
        "from pddflow.runtime.workers.ranks import build_engine\n"
        "from pddflow.runtime.workers.roster import worker_class\n"
        "for t in ('prefill', 'relay_decode', 'main_decode'): worker_class(t)\n"
        f"w = wire(load_plan({str(GRAPH)!r}).scaled_to_local())\n"
        "w.engine, w.time_scale = 'modeled', 1e-6\n"
        "build_engine(w, 'main/0', 0).generate([[5, 6, 7]])\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
