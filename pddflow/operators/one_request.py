"""One request on the colocated reference engine, tensor parallel or not, for `pddflow generate`:
a KV pool sized to the request, the followers started on this machine, and a lost rank reported
with the followers' own last lines."""

from __future__ import annotations

import time
from collections.abc import Callable

from pddflow.core.payloads import SamplingParams
from pddflow.operators.engine import Engine, EngineConfig
from pddflow.operators.follower import local_group
from pddflow.operators.tensor_parallel import TPPeerLost, check_layout
from pddflow.operators.weights import ModelSource


def generate_one(
    spec: str,
    source: ModelSource,
    prompt_ids: list[int],
    params: SamplingParams,
    tensor_parallel: int = 1,
    expert_parallel: bool = False,
    say: Callable[[str], None] = lambda _: None,
) -> tuple[list[int], float]:
    """The output token IDs and the generation's seconds. A layout the model does not split over
    is a ValueError, a pool too small KVCacheFull, a rank lost TPPeerLost (its message with the
    followers' last stderr lines)."""
    check_layout(source.config, tensor_parallel, expert_parallel)
    tokens_needed = len(prompt_ids) + params.max_tokens + EngineConfig().block_size
    kv_bytes = max(tokens_needed * source.config.kv_bytes_per_token(4), 2**20)
    cfg = EngineConfig(kv_cache_bytes=kv_bytes, expert_parallel=expert_parallel)
    with local_group(spec, cfg, tensor_parallel) as group:
        try:
            engine = Engine(source, cfg, group.tp)
            try:
                ranks = f" on {tensor_parallel} ranks" if tensor_parallel > 1 else ""
                say(
                    f"generating up to {params.max_tokens} tokens after {len(prompt_ids)} "
                    f"prompt tokens{ranks}"
                )
                started = time.monotonic()
                seq = engine.generate([prompt_ids], params)[0]
                return seq.output_ids, time.monotonic() - started
            finally:
                engine.close()
        except TPPeerLost as exc:
            logs = group.follower_logs()
            raise TPPeerLost(f"{exc}" + (f"; {logs}" if logs else "")) from None
