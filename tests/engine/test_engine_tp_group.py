"""Tensor parallelism's machinery around the numerics (test_engine_tp.py): layouts and refusals,
the step messages, lost ranks (killed, stuck, a killed leader) surfacing as TPPeerLost within the
deadline, `pddflow generate --tensor-parallel`, and followers that never outlive their leader."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, replace

import pytest
import torch
from conftest import SMALL
from typer.testing import CliRunner

from pddflow.cli import app
from pddflow.core.payloads import SamplingParams
from pddflow.core.ports import free_port
from pddflow.operators.engine import Engine, EngineConfig, KVShardMissing
from pddflow.operators.follower import local_group
from pddflow.operators.tensor_parallel import Shard, TPConfig, TPPeerLost, check_layout, join
from pddflow.operators.tp_steps import ForwardBatch
from pddflow.testing.tp_harness import CONFIG as HARNESS_CONFIG

CFG = EngineConfig(kv_cache_bytes=2**21, block_size=4, attention_tile=16, chunk_size=32)
PROMPT = [1, 17, 99, 3, 150, 42, 8, 8, 200, 5, 61, 77, 13, 190, 4, 33, 120, 9]


@pytest.mark.parametrize(
    "heads, kv, inter, size, message",
    [
        (8, 2, 128, 3, "8 attention heads do not split over 3 ranks"),
        (8, 4, 128, 8, None),  # past the KV heads: 2 ranks share each
        (12, 4, 128, 6, "6 ranks do not share 4 KV heads evenly"),
        (8, 8, 100, 8, "intermediate size 100 does not split over 8 ranks"),
        (8, 2, 128, 16, "16 attention heads|8 attention heads do not split over 16"),
        (8, 2, 128, 0, "must be >= 1"),
    ],
)
def test_check_layout(heads, kv, inter, size, message):
    c = replace(SMALL, num_heads=heads, num_kv_heads=kv, intermediate_size=inter)
    if message is None:
        check_layout(c, size)
        return
    with pytest.raises(ValueError, match=message) as err:
        check_layout(c, size)
    if size:
        assert "use one of: 1, 2" in str(err.value)


def test_shards_cover_the_model_once():
    for kv, size in [(2, 1), (2, 2), (4, 2), (2, 4), (8, 4), (1, 4)]:
        c = replace(SMALL, num_heads=8, num_kv_heads=kv, intermediate_size=128)
        shards = [Shard.of(c, size, r) for r in range(size)]
        assert [(s.h0, s.h1) for s in shards] == [
            (r * 8 // size, (r + 1) * 8 // size) for r in range(size)
        ]
        for s in shards:  # each rank's query heads read its own KV heads
            g = c.group_size
            assert s.h0 // g >= s.k0 and (s.h1 - 1) // g < s.k1
            assert s.local.num_heads * size == 8 and s.local.intermediate_size * size == 128
        full = torch.randn(3, 2, 2, 4, kv, 16)
        parts = shards[0].split(full)
        assert all(p.shape[4] == s.k1 - s.k0 for p, s in zip(parts, shards))
        assert torch.equal(shards[0].canonical(parts), full)


def test_forward_batch_packs_to_int64_and_back():
    b = ForwardBatch([5, 6, 7, 8, 9], [0, 12], [3, 14], [[4], [1, 2, 3, 7]], all_rows=True)
    packed = b.pack()
    assert packed.dtype == torch.long and packed.dim() == 1
    assert ForwardBatch.unpack(packed) == b


def test_join_at_size_one_is_none_and_bad_configs_refused():
    assert join(TPConfig(), torch.device("cpu")) is None
    with pytest.raises(ValueError, match="host:port"):
        join(TPConfig(size=2, init_address="nowhere"), torch.device("cpu"))
    with pytest.raises(ValueError, match="rank 2 of 2"):
        join(TPConfig(size=2, rank=2, init_address="127.0.0.1:1"), torch.device("cpu"))


def _reference(path) -> list[int]:
    eng = Engine.from_spec(str(path), CFG)
    return eng.generate([PROMPT], SamplingParams(max_tokens=6))[0].output_ids


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_lost_follower_fails_the_leaders_next_step(tiny_llama_dir, how):
    """Killed: the closed connection fails the step at once. Stopped (alive, unresponsive): the
    step fails at the deadline. Either way TPPeerLost, never a hang, and every later step too."""
    deadline = 3.0
    with local_group(str(tiny_llama_dir), CFG, 2, timeout_s=deadline) as group:
        engine = Engine.from_spec(str(tiny_llama_dir), CFG, group.tp)
        assert engine.is_leader and group.tp is not None and group.tp.size == 2
        seq = engine.add_sequence(PROMPT, SamplingParams(max_tokens=20))
        engine.prefill(seq)
        engine.decode([seq])
        follower = group.procs[0]
        os.kill(follower.pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        time.sleep(0.2)
        t = time.monotonic()
        with pytest.raises(TPPeerLost, match="gone or stuck"):
            engine.decode([seq])
        took = time.monotonic() - t
        assert took < (1.0 if how == "killed" else deadline + 2.0), took
        with pytest.raises(TPPeerLost):
            engine.decode([seq])
        engine.close()  # quietly: the follower is gone
        follower.kill()
    assert follower.poll() is not None


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_killed_leader_ends_its_follower(tiny_llama_dir):
    """The follower waits for the leader's next step with no deadline (an idle instance is not a
    lost one), but a killed leader's closed connection ends it at once: exit 3, one line."""
    init = f"127.0.0.1:{free_port()}"
    models = json.dumps([["m", str(tiny_llama_dir)]])
    leader = subprocess.Popen(
        [sys.executable, "-m", "pddflow.testing.tp_harness", "--rank", "0", "--size", "2"]
        + ["--init", init, "--models", models, "--hold", "--timeout", "5"],
        stdout=subprocess.PIPE,
        text=True,
    )
    follower = subprocess.Popen(
        [sys.executable, "-m", "pddflow.operators.follower", "--model", str(tiny_llama_dir)]
        + ["--tp-config", json.dumps({"size": 2, "rank": 1, "init_address": init, "timeout_s": 5})]
        + ["--engine-config", json.dumps(asdict(HARNESS_CONFIG))],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert leader.stdout is not None and leader.stdout.readline().strip() == "ready"
        time.sleep(6)  # longer than the deadline: still following
        assert follower.poll() is None
        leader.kill()
        t = time.monotonic()
        assert follower.wait(timeout=10) == 3
        assert time.monotonic() - t < 3
        assert follower.stderr is not None
        said = follower.stderr.read()
        assert "follower rank 1: tensor-parallel rank 1 of 2: waiting for the leader's step" in said
        assert "Traceback" not in said
    finally:
        for p in (leader, follower):
            p.kill()
            p.wait()


def _followers_of(pid: int) -> list[int]:
    out = subprocess.run(
        ["ps", "-o", "pid=,args=", "--ppid", str(pid)], capture_output=True, text=True
    )
    return [
        int(line.split()[0]) for line in out.stdout.splitlines() if "operators.follower" in line
    ]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_generate_tensor_parallel_2_equals_tp1(tiny_llama_dir):
    args = ["generate", "--model", str(tiny_llama_dir), "--prompt-ids", ",".join(map(str, PROMPT))]
    args += ["--max-tokens", "6", "--json"]
    res = CliRunner().invoke(app, [*args, "--tensor-parallel", "2"])
    assert res.exit_code == 0, res.output
    ref = CliRunner().invoke(app, args)
    assert json.loads(res.stdout)["token_ids"] == json.loads(ref.stdout)["token_ids"]
    assert _followers_of(os.getpid()) == []
    bad = CliRunner().invoke(app, [*args, "--tensor-parallel", "3"])
    assert bad.exit_code == 2 and "use one of: 1, 2, 4" in bad.output


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_followers_die_with_their_leader():
    """kill -9 of `pddflow generate --tensor-parallel 2` mid-run takes its follower down too."""
    cmd = [sys.executable, "-m", "pddflow.cli", "generate", "--model", "builtin:tiny-llama"]
    cmd += ["--prompt-ids", "1,2,3", "--max-tokens", "4000", "--tensor-parallel", "2"]
    leader = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert leader.stderr is not None
        for line in leader.stderr:  # the follower has joined and loaded: steps are running
            if line.startswith("generating"):
                break
        followers = _followers_of(leader.pid)
        assert len(followers) == 1
        leader.kill()
        leader.wait()
        end = time.monotonic() + 10
        while os.path.exists(f"/proc/{followers[0]}") and time.monotonic() < end:
            time.sleep(0.1)
        assert not os.path.exists(f"/proc/{followers[0]}")
    finally:
        leader.kill()
        leader.wait()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_rank_to_rank_kv_lands_on_every_rank_or_none(tiny_llama_dir):
    """SHIP hands each rank its own heads (the leader's are returned); LAND with a rank lacking
    its heads (this follower has no runtime to receive them) lands nothing on any rank: the
    blocks go back, KVShardMissing names it, and the group serves on."""
    with local_group(str(tiny_llama_dir), CFG, 2) as group:
        engine = Engine.from_spec(str(tiny_llama_dir), CFG, group.tp)
        seq = engine.add_sequence(PROMPT, SamplingParams(max_tokens=4))
        engine.prefill(seq)
        whole = engine.export_kv(seq)
        a, b = engine.kv_heads
        assert (a, b) == (0, engine.model_config.num_kv_heads // 2)
        own = engine.ship_kv(seq, b"route", start_block=1)
        assert own.heads == (a, b) and own.token_start == CFG.block_size
        assert own.block_hashes == whole.block_hashes[1:]
        assert torch.equal(own.data, whole.data[1:].narrow(4, a, b - a))
        again = engine.add_sequence(PROMPT, SamplingParams(max_tokens=4))
        free = engine.allocator.num_free
        first = engine.ship_kv(seq, b"route")
        with pytest.raises(KVShardMissing, match="lacks its heads"):
            engine.import_kv(again, first, cache=False)
        assert engine.allocator.num_free == free and again.block_table == []
        with pytest.raises(ValueError, match="heads"):  # another rank's heads: refused
            engine.import_kv(again, replace(first, heads=(b, b + 1)), cache=False)
        engine.decode([seq])  # the group is intact
        engine.close()
