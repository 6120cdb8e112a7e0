"""`pddflow bench serve`'s report from measured samples: percentiles, and with --per-request the
rows that set each request beside the simulator's."""

from __future__ import annotations

import pytest

from pddflow.bench.serve import GraphResult, Sample, summarize


def _result(with_timelines: bool) -> GraphResult:
    res = GraphResult(
        "graphs/pdd.yaml",
        wall_s=10.0,
        metrics={"pddflow_wan_bytes_sent_total": 100.0, "pddflow_wan_bytes_saved_total": 300.0},
    )
    for session in range(2):
        for turn in range(3):
            tl = {
                "variant": "p_rld_md",
                "handoff": "catch_up",
                "tokens_by_operator": {"relay": 2, "main": 6},
                "events": [
                    {"event": "arrival", "t_ms": 0.0},
                    {"event": "first_token", "t_ms": 250.0},
                ],
            }
            res.samples.append(
                Sample(
                    0.1 * (turn + 1),
                    0.02,
                    8,
                    0.5,
                    f"r{session}{turn}",
                    session,
                    turn,
                    start_s=session * 0.5 + turn * 2.0,
                    prompt_tokens=100 + 50 * turn,
                    timeline=tl if with_timelines else None,
                )
            )
    res.samples.reverse()  # as they finish, not in session order
    return res


def test_summary_without_per_request_has_no_rows():
    out = summarize(_result(False), sla_ttft_s=1.0, sla_tpot_s=0.05)
    assert "per_request" not in out
    assert out["host_cpu"] is None  # not measured (off Linux, or a result built by hand)
    assert out["requests"] == 6 and out["ttft_s"]["p50"] == pytest.approx(0.2)
    assert out["wan_share_of_full_kv"] == 0.25


def test_per_request_rows_in_session_turn_order():
    rows = summarize(_result(True), sla_ttft_s=1.0, sla_tpot_s=0.05)["per_request"]
    assert [(r["session"], r["turn"]) for r in rows] == [(s, t) for s in range(2) for t in range(3)]
    r = rows[4]
    assert r["request_id"] == "r11" and r["start_s"] == 2.5 and r["prompt_tokens"] == 150
    assert r["ttft_s"] == 0.2 and r["variant"] == "p_rld_md" and r["handoff"] == "catch_up"
    assert [e["event"] for e in r["events"]] == ["arrival", "first_token"]


def test_host_cpu_per_streamed_token():
    res = _result(False)
    res.frontend_cpu_s, res.client_cpu_s = 0.06, 0.036
    host = summarize(res, sla_ttft_s=1.0, sla_tpot_s=0.05)["host_cpu"]
    assert host == {"frontend_s": 0.06, "client_s": 0.036, "output_tokens": 48, "ms_per_token": 2.0}


def test_process_cpu_reads_a_live_process():
    import os

    from pddflow.bench.control_plane import process_cpu_s

    sum(i * i for i in range(300_000))  # some CPU of our own
    got = process_cpu_s(os.getpid())
    if got is None:
        pytest.skip("no /proc here")
    assert got > 0
    assert process_cpu_s(2**22 + 12345) is None  # no such process


def test_degrade_scenario_splits_what_came_after_it():
    res = _result(False)
    res.variants = {"p_md": 4, "p_rld_md": 2}
    res.degrade = {
        "at_s": 2.0,
        "gbps": 0.01,
        "jitter_p99_ms": None,
        "applied_at_s": 2.1,
        "variants_before": {"p_md": 3},
    }
    d = summarize(res, sla_ttft_s=1.0, sla_tpot_s=0.05)["wan_degrade"]
    # sent at 2.0 (before the degrade landed), 2.5, 4.0, 4.5 s: the last three came after it
    assert d["requests_after"] == 3 and d["ttft_after_s"]["p50"] == pytest.approx(0.3)
    assert d["variants_after"] == {"p_md": 1, "p_rld_md": 2}
    assert "variants_before" not in d and res.degrade["variants_before"] == {"p_md": 3}


def test_a_degrade_due_after_the_run_says_so():
    res = _result(False)
    res.degrade = {"at_s": 99.0, "gbps": 0.01, "jitter_p99_ms": None, "applied_at_s": None}
    d = summarize(res, sla_ttft_s=1.0, sla_tpot_s=0.05)["wan_degrade"]
    assert d["applied_at_s"] is None and "ended before" in d["note"]


def test_control_plane_row_brackets_the_workload():
    """Reports per second and routing time count only what happened between the two scrapes."""
    from pddflow.bench.control_plane import row

    before = {"reports:status": 10, "reports:tokens": 5, "pddflow_route_seconds_count": 2}
    before |= {"pddflow_route_seconds_sum": 0.002, "route_le:0.001": 2, "route_le:0.0025": 2}
    before["route_le:+Inf"] = 2
    after = {"reports:status": 30, "reports:tokens": 105, "reports:event": 10}
    after |= {"pddflow_route_seconds_count": 12, "pddflow_route_seconds_sum": 0.012}
    after |= {"route_le:0.001": 10, "route_le:0.0025": 11, "route_le:+Inf": 12}
    mem = {"instances": 3, "worker_rss_mib": {"mean": 100.0}, "frontend_rss_mib": 250.0}
    cpu = {"router": 0.3, "api": 0.2, "workers": 1.28}
    r = row(before, after, 10.0, 4.0, mem, cpu, 10, 640)
    assert r["reports_per_s"] == {"all": 13.0, "event": 1.0, "status": 2.0, "tokens": 10.0}
    assert r["route_ms"]["mean"] == pytest.approx(1.0)
    # 9 of the run's 10 routings within 2.5 ms, the tenth beyond every bound
    assert r["route_ms"]["p99_at_most"] is None
    assert r["frontend_cpu_ms_per_request"] == 50.0 and r["startup_s"] == 4.0
    assert r["frontend_cpu_us_per_token"] == pytest.approx(781.2)
    assert r["streamed_tokens_per_s"] == 64.0
    assert r["cpu_us_per_token"] == {"router": 468.8, "api": 312.5, "workers": 2000.0}


def test_cpu_delta_names_a_part_it_could_not_read():
    """A part whose process could not be read (gone, or off Linux) is None, not a wrong figure."""
    from pddflow.bench.control_plane import cpu_delta

    got = cpu_delta(
        {"router": 1.0, "api": 0.5, "workers": None}, {"router": 1.25, "api": 0.5, "workers": 3.0}
    )
    assert got == {"router": 0.25, "api": 0.0, "workers": None}
