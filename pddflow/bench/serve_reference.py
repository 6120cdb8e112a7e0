"""`bench serve --exact`: the colocated engine's greedy answer to every turn of the workload, each
turn's context built from the reference's own earlier answers, to check every served token."""

from __future__ import annotations

from pddflow.core.serve_sessions import WorkloadSpec


def reference_outputs(
    weights: str, workload: WorkloadSpec, engine_kind: str = "real"
) -> dict[tuple[int, int], list[int]]:
    """(session, turn) -> the greedy tokens, the sessions of one turn in one batch."""
    from pddflow.core.payloads import Request, SamplingParams
    from pddflow.operators.weights import model_config_of

    longest = max(
        len(s.first_prompt) + sum(map(len, s.user_turns)) + sum(s.output_tokens)
        for s in workload.sessions
    )
    tokens = longest * len(workload.sessions) + 64 * len(workload.sessions)
    kv_bytes = tokens * model_config_of(weights).kv_bytes_per_token(4)  # fp32: room at any dtype
    engine = reference_engine(weights, engine_kind, kv_bytes)
    stops = tuple(engine.tokenizer.eos_token_ids) if engine.tokenizer else ()
    contexts = [list(s.first_prompt) for s in workload.sessions]
    out: dict[tuple[int, int], list[int]] = {}
    for turn in range(max(len(s.output_tokens) for s in workload.sessions)):
        live = [i for i, s in enumerate(workload.sessions) if turn < len(s.output_tokens)]
        for i in live:
            if turn:
                contexts[i] += workload.sessions[i].user_turns[turn - 1]
        reqs = [
            Request(
                f"s{i}t{turn}",
                list(contexts[i]),
                SamplingParams(
                    max_tokens=workload.sessions[i].output_tokens[turn], stop_token_ids=stops
                ),
            )
            for i in live
        ]
        for i, seq in zip(live, engine.generate(reqs, max_batch=len(reqs)), strict=True):
            out[(i, turn)] = list(seq.output_ids)
            contexts[i] += seq.output_ids
    return out


def reference_engine(spec: str, engine: str = "real", kv_cache_bytes: int = 512 << 20):
    """The colocated engine a deployment of `spec` on `engine` ("real" or "modeled") must agree
    with, its tokenizer set."""
    if engine == "modeled":
        from pddflow.operators.modeled_engine import ModeledEngine

        # a modeled reference's block is 64 bytes: this many hold plenty of contexts
        return ModeledEngine.reference(spec, min(kv_cache_bytes, 64 << 20))
    from pddflow.operators.engine import Engine, EngineConfig

    return Engine.from_spec(spec, EngineConfig(kv_cache_bytes=kv_cache_bytes))
