"""`bench serve --exact`: the colocated engine's greedy answer to every turn of the workload, each
turn's context built from the reference's own earlier answers, to check every served token."""

from __future__ import annotations

from pddflow.core.serve_sessions import WorkloadSpec


def reference_outputs(weights: str, workload: WorkloadSpec) -> dict[tuple[int, int], list[int]]:
    """(session, turn) -> the greedy tokens, the sessions of one turn in one batch."""
    from pddflow.core.payloads import Request, SamplingParams
    from pddflow.operators.engine import Engine, EngineConfig
    from pddflow.operators.weights import load_model_source

    longest = max(
        len(s.first_prompt) + sum(map(len, s.user_turns)) + sum(s.output_tokens)
        for s in workload.sessions
    )
    tokens = longest * len(workload.sessions) + 64 * len(workload.sessions)
    source = load_model_source(weights)
    kv_bytes = tokens * source.config.kv_bytes_per_token(4)  # fp32: room at any dtype
    engine = Engine(source, EngineConfig(kv_cache_bytes=kv_bytes))
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
