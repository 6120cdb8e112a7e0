"""`pddflow bench channels`: the typed channels next to their baselines, on 127.0.0.1."""

from __future__ import annotations

import json

import typer


def bench_channels(
    as_json: bool = typer.Option(False, "--json", help="print one JSON object on stdout"),
    size_mb: int = typer.Option(
        256, "--size-mb", min=2, help="KV set size for the throughput runs (MiB)"
    ),
    reps: int = typer.Option(
        5, "--reps", min=1, help="measured runs per figure (median), after three warm-ups"
    ),
    streams: int = typer.Option(4, "--streams", min=1, help="wan_flight parallel streams"),
    shaped_gbps: float = typer.Option(
        1.0, "--shaped-gbps", help="emulated link rate for the shaped run"
    ),
    shaped_rtt_ms: float = typer.Option(
        20.0, "--shaped-rtt-ms", help="emulated link RTT for the shaped run"
    ),
    ring_slots: int = typer.Option(4, "--ring-slots", min=1, help="rdma_tensor ring slots"),
    slot_mb: float = typer.Option(2.0, "--slot-mb", help="rdma_tensor slot size (MiB)"),
    rtt_samples: int = typer.Option(
        1000, "--rtt-samples", min=10, help="token_ids round trips to time"
    ),
) -> None:
    """Measure wan_flight against a raw TCP socket, rdma_tensor against memcpy, the token_ids
    handoff's wire size and round trip, and a shaped wan_flight transfer against its link rate.
    Receivers run in their own processes; everything stays on 127.0.0.1."""
    from rich.console import Console

    from pddflow.bench.channels import run_all
    from pddflow.commands.progress import progress_bar

    err = Console(stderr=True)
    with progress_bar(err) as bar:
        task = bar.add_task("starting")
        res = run_all(
            size_mb=size_mb,
            reps=reps,
            streams=streams,
            shaped_gbps=shaped_gbps,
            shaped_rtt_ms=shaped_rtt_ms,
            ring_slots=ring_slots,
            slot_mb=slot_mb,
            rtt_samples=rtt_samples,
            progress=lambda s: bar.update(task, description=s),
        )
    if as_json:
        print(json.dumps(res, indent=2))
        return
    _table(res)


def _table(res: dict) -> None:
    from rich.table import Table

    from pddflow.commands.progress import console

    t = Table(
        title=f"pddflow channels on 127.0.0.1 ({res['size_mb']} MiB KV set, "
        f"median of {res['reps']})"
    )
    t.add_column("channel")
    t.add_column("measured", justify="right")
    t.add_column("baseline", justify="right")
    t.add_column("ratio", justify="right")
    r = res["ratios"]
    t.add_row(
        f"wan_flight ({res['wan_flight']['streams']} streams)",
        f"{res['wan_flight']['gbps']:.2f} Gbps",
        f"raw TCP {res['raw_tcp']['gbps']:.2f} Gbps",
        f"{r['wan_flight_vs_raw_tcp']:.2f}x",
    )
    t.add_row(
        "rdma_tensor (2 processes, direct)",
        f"{res['rdma_tensor']['gbps']:.2f} Gbps",
        f"memcpy {res['memcpy']['gbps']:.2f} Gbps",
        f"{r['rdma_tensor_vs_memcpy']:.2f}x",
    )
    t.add_row(
        "rdma_tensor (2 processes, ring)",
        f"{res['rdma_tensor_ring']['gbps']:.2f} Gbps",
        f"memcpy {res['memcpy']['gbps']:.2f} Gbps",
        f"{r['rdma_tensor_ring_vs_memcpy']:.2f}x",
    )
    t.add_row(
        "rdma_tensor (2 processes, direct, tcp)",
        f"{res['rdma_tensor_tcp']['gbps']:.2f} Gbps",
        f"shared memory {res['rdma_tensor']['gbps']:.2f} Gbps",
        f"{res['rdma_tensor_tcp']['gbps'] / res['rdma_tensor']['gbps']:.2f}x",
    )
    tok = res["token_ids"]
    t.add_row(
        "token_ids 100-token handoff",
        f"{tok['bytes_per_100_tokens']:.0f} B on the wire",
        "PDD: 1.5 KB",
        f"{tok['bytes_per_100_tokens'] / 1536:.2f}x",
    )
    t.add_row(
        "token_ids round trip",
        f"P50 {tok['rtt_p50_ms']:.3f} ms / P99 {tok['rtt_p99_ms']:.3f} ms",
        "target P50 < 1 ms",
        "",
    )
    s = res["shaped"]
    t.add_row(
        f"wan_flight shaped (rtt {s['rtt_ms']} ms)",
        f"{s['gbps']:.3f} Gbps",
        f"link {s['target_gbps']} Gbps",
        f"{s['error_pct']:+.1f}%",
    )
    out = console()
    out.print(t)
    for name, ok in res["targets"].items():
        out.print(f"  {'[green]met[/]' if ok else '[red]missed[/]'}  {name}")


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    bench_app.command("channels")(bench_channels)
