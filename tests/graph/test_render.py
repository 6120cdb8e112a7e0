"""Renderers: each format shows every cluster, operator and edge; --variant highlights."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pddflow.cli import app
from pddflow.graph import load_plan
from pddflow.graph.render import RenderError, render

ROOT = Path(__file__).resolve().parents[2]
PDD = str(ROOT / "graphs" / "pdd.yaml")
runner = CliRunner()


def test_ascii_boxes_and_labels():
    text = render(load_plan(PDD), "ascii")
    assert "+-cluster A (48 x gpu_a)" in text and "+-cluster B (40 x gpu_b)" in text
    assert "prefill.kv --[rdma_tensor 400 Gbps]--> relay.kv" in text
    assert "link A-B: A <-> B  100 Gbps" in text and "prefill.kv ==[wan_flight]==> main.kv" in text
    assert "*" not in text


def test_ascii_variant_highlight():
    text = render(load_plan(PDD), "ascii", "p_md")
    assert "variant p_md: prefill -> main" in text
    assert "* prefill.kv ==[wan_flight]==> main.kv" in text
    assert "  prefill.kv --[rdma_tensor" in text and "* relay " not in text


def test_dot_and_mermaid():
    plan = load_plan(PDD)
    dot = render(plan, "dot", "p_rld_md")
    assert dot.startswith('digraph "pdd"') and 'subgraph "cluster_A"' in dot
    assert (
        '"prefill" -> "main" [label="wan_flight 100 Gbps (A-B)", style=bold, color=crimson' in dot
    )
    mer = render(plan, "mermaid", "p_md")
    assert mer.startswith("flowchart LR") and 'prefill ==>|"wan_flight 100 Gbps (A-B)"| main' in mer
    assert "linkStyle 1 stroke:crimson" in mer and "linkStyle 0" not in mer


def test_svg_uses_graphviz_or_says_how_to_get_it():
    plan = load_plan(PDD)
    if shutil.which("dot"):
        assert "<svg" in render(plan, "svg")
    else:
        with pytest.raises(RenderError, match="apt-get install graphviz"):
            render(plan, "svg")


def test_viz_cli(tmp_path: Path):
    out = tmp_path / "g.mmd"
    r = runner.invoke(app, ["viz", PDD, "--format", "mermaid", "--variant", "p_md", "-o", str(out)])
    assert r.exit_code == 0 and out.read_text().startswith("flowchart LR")
    r = runner.invoke(app, ["viz", PDD, "--variant", "p_mdd"])
    assert r.exit_code == 2 and "did you mean 'p_md'" in r.output
    r = runner.invoke(app, ["viz", PDD, "--format", "png"])
    assert r.exit_code == 2 and "formats: ascii, dot, mermaid, svg" in r.output


def test_plan_cli_json():
    import json

    r = runner.invoke(app, ["plan", PDD, "--json", "--rps", "5", "--hit-rate", "0.9"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert {"placement", "links", "feasible", "problems"} <= set(d)
    link = d["links"][0]
    assert {"name", "required_gbps", "available_gbps", "transfer_p50_s", "transfer_p99_s"} <= set(
        link
    )
    assert link["required_gbps"] == pytest.approx(link["required_gbps_without_drc"] * 0.1, rel=1e-3)
    assert [p["operator"] for p in d["placement"]] == ["prefill", "relay", "main"]
    r = runner.invoke(app, ["plan", PDD])
    assert r.exit_code == 0 and "verdict" in r.output


def test_plan_check_gates_on_the_verdict():
    ok = ["plan", PDD, "--rps", "1", "--check"]
    overloaded = ["plan", PDD, "--rps", "500", "--check"]
    assert runner.invoke(app, ok).exit_code == 0
    r = runner.invoke(app, overloaded)
    assert r.exit_code == 1 and "NOT FEASIBLE" in r.output
    assert runner.invoke(app, [*overloaded, "--json"]).exit_code == 1
    assert runner.invoke(app, overloaded[:-1]).exit_code == 0  # a report, not a gate


def test_piped_tables_are_not_cut_at_80_columns():
    r = runner.invoke(app, ["plan", PDD])  # CliRunner's output is not a terminal
    assert max(len(line) for line in r.output.splitlines()) > 100
    assert "KV tokens/replica" in r.output  # the widest column's header, whole


def test_version():
    from importlib.metadata import version

    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"pddflow {version('pddflow')}"


def test_schema_cli():
    import json

    r = runner.invoke(app, ["schema"])
    schema = json.loads(r.output)
    assert schema["title"].startswith("pddflow graph") and "operators" in schema["properties"]
    r = runner.invoke(app, ["schema", "--list"])
    assert (
        "relay_decode" in r.output and "wan_flight" in r.output and "predicted_hit_rate" in r.output
    )
