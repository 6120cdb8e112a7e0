"""The broken-graph corpus: each case is one mistake made to a valid graph (tests/graph/base.yaml).
`pddflow validate` must exit 1, print no traceback, and name the line of the mistake with a
message that says what is wrong."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pddflow.cli import app

BASE = (Path(__file__).parent / "base.yaml").read_text()
EDGE_PM = "  - {from: prefill.kv, to: main.kv, channel: wan_flight}\n"

# (case, old text, new text, expected line, expected words in that line's message)
CASES = [
    ("misspelt_top_key", "device_classes:", "device_clases:", 7, "did you mean 'device_classes'"),
    (
        "misspelt_operator_key",
        "replicas: 2, devices_per_replica: 4}\n  relay",
        "relicas: 2, devices_per_replica: 4}\n  relay",
        16,
        "did you mean 'replicas'",
    ),
    (
        "wrong_type",
        "prefill, cluster: A, device: gpu_a, replicas: 2",
        "prefill, cluster: A, device: gpu_a, replicas: four",
        16,
        "valid integer",
    ),
    (
        "missing_required",
        "prefill: {op: prefill, cluster",
        "prefill: {cluster",
        16,
        "missing required key 'op'",
    ),
    ("unknown_op_type", "{op: prefill,", "{op: prefil,", 16, "did you mean 'prefill'"),
    ("unknown_cluster", "main_decode, cluster: B", "main_decode, cluster: C", 18, "cluster 'C'"),
    (
        "unknown_device_class",
        "cluster: B, device: gpu_b",
        "cluster: B, device: gpu_c",
        18,
        "'gpu_c', which is not defined",
    ),
    (
        "device_not_in_cluster",
        "cluster: B, device: gpu_b",
        "cluster: B, device: gpu_a",
        18,
        "cluster B has no gpu_a",
    ),
    (
        "too_many_replicas",
        "replicas: 2, devices_per_replica: 4}\n  relay",
        "replicas: 4, devices_per_replica: 4}\n  relay",
        17,
        "cluster A has 16 gpu_a devices but its operators need 20",
    ),
    (
        "weights_do_not_fit",
        "replicas: 2, devices_per_replica: 4}\n  relay",
        "replicas: 2, devices_per_replica: 1}\n  relay",
        16,
        "weights need",
    ),
    ("edge_unknown_operator", "to: main.kv", "to: mian.kv", 21, "did you mean 'main'"),
    ("edge_unknown_port", "to: main.kv", "to: main.kvv", 21, "did you mean 'kv'"),
    (
        "edge_wrong_direction",
        "from: relay.handoff",
        "from: relay.kv",
        22,
        "is an input of relay_decode",
    ),
    (
        "payload_type_mismatch",
        "to: main.kv",
        "to: main.handoff",
        21,
        "prefill.kv sends KVBlocks but main.handoff takes TokenIds",
    ),
    (
        "channel_does_not_carry",
        "main.handoff, channel: token_ids",
        "main.handoff, channel: wan_flight",
        22,
        "wan_flight carries KVBlocks but relay.handoff sends TokenIds",
    ),
    (
        "rdma_across_clusters",
        "main.kv, channel: wan_flight",
        "main.kv, channel: rdma_tensor",
        21,
        "cannot cross clusters",
    ),
    (
        "no_link",
        "  A-B: {gbps: 100, rtt_ms: 30, jitter: {p50_ms: 50, p99_ms: 2000}}",
        "  {}",
        21,
        "no link joins them",
    ),
    (
        "unknown_channel_kind",
        "channel: wan_flight",
        "channel: wan_flite",
        21,
        "did you mean 'wan_flight'",
    ),
    (
        "variant_not_entry",
        "p_md: {path: [prefill, main]}",
        "p_md: {path: [relay, main], handoff: one_shot}",
        24,
        "does not take requests",
    ),
    (
        "variant_ends_at_relay",
        "p_md: {path: [prefill, main]}",
        "p_md: {path: [prefill, relay]}",
        24,
        "ends at the relay",
    ),
    (
        "variant_unknown_operator",
        "p_md: {path: [prefill, main]}",
        "p_md: {path: [prefill, mian]}",
        24,
        "did you mean 'main'",
    ),
    ("variant_missing_handoff", ", handoff: adaptive}", "}", 25, "say how it hands off"),
    (
        "variant_bad_handoff",
        "handoff: adaptive",
        "handoff: oneshot",
        25,
        "'one_shot', 'catch_up' or 'adaptive'",
    ),
    ("variant_without_edge", EDGE_PM, "", 23, "no edge joins them"),
    (
        "handoff_without_relay",
        "p_md: {path: [prefill, main]}",
        "p_md: {path: [prefill, main], handoff: catch_up}",
        24,
        "has no effect",
    ),
    (
        "unknown_policy",
        "policy: predicted_hit_rate",
        "policy: predicted_hitrate",
        27,
        "did you mean 'predicted_hit_rate'",
    ),
    (
        "duplicate_key",
        "  main: {op: main_decode",
        "  relay: {op: relay_decode, cluster: A, device: gpu_a}\n  main: {op: main_decode",
        18,
        "duplicate key 'relay'",
    ),
    (
        "yaml_syntax",
        "  - {from: prefill.kv, to: relay.kv, channel: rdma_tensor}",
        "  - {from: prefill.kv, to: relay.kv, channel: rdma_tensor",
        21,
        "YAML syntax",
    ),
    ("unknown_anchor", "weights: builtin:tiny-llama", "weights: *w", 4, "undefined alias"),
    ("tab_indent", "  arch: llama-3-70b", "\tarch: llama-3-70b", 5, "tabs"),
    (
        "jitter_p99_below_p50",
        "p50_ms: 50, p99_ms: 2000",
        "p50_ms: 500, p99_ms: 20",
        14,
        "below p50_ms",
    ),
    ("link_to_unknown_cluster", "  A-B: {gbps", "  A-C: {gbps", 14, "cluster 'C'"),
    ("format_version", "pddflow: 1", "pddflow: 2", 1, "this pddflow reads `pddflow: 1`"),
    (
        "unknown_operator_param",
        "devices_per_replica: 4}\nedges",
        "devices_per_replica: 4, params: {radix_cach: true}}\nedges",
        18,
        "did you mean 'radix_cache'",
    ),
    (
        "channel_param_type",
        "channel: wan_flight}",
        "channel: wan_flight, params: {streams: four}}",
        21,
        "must be int",
    ),
    (
        "channel_param_choice",  # xsum64 was the default checksum before xxh3_64
        "channel: wan_flight}",
        "channel: wan_flight, params: {checksum: xsum64}}",
        21,
        "must be one of 'xxh3_64', 'crc32', got 'xsum64'",
    ),
    (
        "local_unknown_operator",
        "device_classes:",
        "local: {replicas: {prefil: 1}}\ndevice_classes:",
        7,
        "did you mean 'prefill'",
    ),
    ("unknown_arch", "arch: llama-3-70b", "arch: llama-3-7b", 5, "did you mean"),
    ("recursive_alias", "name: broken", "name: &n [*n]", 2, "recursive YAML alias"),
    ("two_documents", "scheduler:", "---\nscheduler:", 27, "more than one YAML document"),
    ("edge_not_operator_port", "to: main.kv", "to: main", 21, "not `operator.port`"),
    ("duplicate_edge", EDGE_PM, EDGE_PM * 2, 22, "declared twice"),
    (
        "choice_unknown_device",
        "gpu_b, replicas: 2, devices_per_replica: 4}",
        "gpu_b, replicas: 2, devices_per_replica: 4, choices: [{device: gpu_c}]}",
        18,
        "names device class 'gpu_c', which is not defined",
    ),
    (
        "choice_device_not_in_cluster",
        "gpu_b, replicas: 2, devices_per_replica: 4}",
        "gpu_b, replicas: 2, devices_per_replica: 4, choices: [{device: gpu_a}]}",
        18,
        "cluster B has no gpu_a devices",
    ),
    (
        "choice_too_small_for_the_weights",
        "relay_decode, cluster: A, device: gpu_a, replicas: 1, devices_per_replica: 4}",
        "relay_decode, cluster: A, device: gpu_a, replicas: 1, devices_per_replica: 4, "
        "choices: [{devices_per_replica: 2}, {devices_per_replica: 1}]}",
        17,
        "choice 1 of relay: the llama-3-70b weights need",
    ),
    (
        "choice_zero_devices",
        "gpu_b, replicas: 2, devices_per_replica: 4}",
        "gpu_b, replicas: 2, devices_per_replica: 4, choices: [{devices_per_replica: 0}]}",
        18,
        "greater than or equal to 1",
    ),
    (
        "host_cache_without_a_cache",
        "relay: {op: relay_decode, cluster: A, device: gpu_a, replicas: 1, devices_per_replica: 4}",
        "relay: {op: relay_decode, cluster: A, device: gpu_a, replicas: 1, devices_per_replica: 4,"
        " host_cache: {gib: 64, usd_per_gib_hour: 0.005}}",
        17,
        "no prefix cache to sit under",
    ),
    (
        "host_cache_max_below_gib",
        "replicas: 2, devices_per_replica: 4}\nedges",
        "replicas: 2, devices_per_replica: 4,"
        " host_cache: {gib: 64, max_gib: 32, usd_per_gib_hour: 0.005}}\nedges",
        18,
        "max_gib (32) is below host_cache.gib (64)",
    ),
    (
        "host_cache_negative_price",
        "replicas: 2, devices_per_replica: 4}\nedges",
        "replicas: 2, devices_per_replica: 4, host_cache: {gib: 64, usd_per_gib_hour: -1}}\nedges",
        18,
        "greater than or equal to 0",
    ),
    (
        "host_cache_zero_bandwidth",
        "replicas: 2, devices_per_replica: 4}\nedges",
        "replicas: 2, devices_per_replica: 4,"
        " host_cache: {gib: 64, usd_per_gib_hour: 0.005, gbytes_per_s: 0}}\nedges",
        18,
        "greater than 0",
    ),
    (
        "disk_cache_without_a_cache",
        "relay: {op: relay_decode, cluster: A, device: gpu_a, replicas: 1, devices_per_replica: 4}",
        "relay: {op: relay_decode, cluster: A, device: gpu_a, replicas: 1, devices_per_replica: 4,"
        " disk_cache: {gib: 64}}",
        17,
        "no prefix cache to sit under",
    ),
    (
        "disk_cache_persists_in_the_run_directory",
        "replicas: 2, devices_per_replica: 4}\nedges",
        "replicas: 2, devices_per_replica: 4, params: {radix_cache: true},"
        " disk_cache: {gib: 64, persist: true}}\nedges",
        18,
        "without disk_cache.dir",
    ),
    (
        "local_cache_mib_sizes_an_undeclared_tier",
        "device_classes:",
        "local:\n  cache_mib: {main: {kv: 64, host: 8}}\ndevice_classes:",
        8,
        "add operators.main.host_cache",
    ),
    (
        "host_cache_unpriced",
        "replicas: 2, devices_per_replica: 4}\nedges",
        "replicas: 2, devices_per_replica: 4, host_cache: {gib: 64}}\nedges",
        18,
        "missing required key 'usd_per_gib_hour'",
    ),
]

WHOLE_FILE_CASES = [
    ("empty_file", b"", 1, "file is empty"),
    ("comments_only", b"# nothing here\n", 1, "file is empty"),
    ("binary_junk", bytes(range(256)) * 4, 2, "not UTF-8"),  # byte 10 is a newline
    ("control_characters", b"pddflow: 1\nname: \x07bell\n", 2, "not a YAML text file"),
    ("top_level_list", b"- pddflow: 1\n", 1, "a graph file is a mapping"),
    ("scalar", b"hello\n", 1, "a graph file is a mapping"),
]

runner = CliRunner()


def _diagnostics(output: str, path: Path) -> list[str]:
    """The FILE:LINE:COL: lines about `path`."""
    return [ln for ln in output.splitlines() if re.match(rf"{re.escape(str(path))}:\d+:\d+: ", ln)]


def _validate(path: Path):
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result


@pytest.mark.parametrize("case,old,new,line,words", CASES, ids=[c[0] for c in CASES])
def test_broken_graph_names_the_line(tmp_path: Path, case, old, new, line, words):
    assert old in BASE, f"case {case}: the base graph no longer contains {old!r}"
    path = tmp_path / f"{case}.yaml"
    path.write_text(BASE.replace(old, new, 1))
    result = _validate(path)
    assert result.exit_code == 1, result.output
    lines = _diagnostics(result.output, path)
    assert lines, result.output
    hits = [ln for ln in lines if ln.startswith(f"{path}:{line}:") and words in ln]
    assert hits, f"expected line {line} with {words!r}; got:\n" + "\n".join(lines)


@pytest.mark.parametrize(
    "case,raw,line,words", WHOLE_FILE_CASES, ids=[c[0] for c in WHOLE_FILE_CASES]
)
def test_junk_files(tmp_path: Path, case, raw, line, words):
    path = tmp_path / f"{case}.yaml"
    path.write_bytes(raw)
    result = _validate(path)
    assert result.exit_code == 1
    assert any(
        ln.startswith(f"{path}:{line}:") and words in ln for ln in result.output.splitlines()
    ), result.output


def test_base_graph_is_valid(tmp_path: Path):
    path = tmp_path / "base.yaml"
    path.write_text(BASE)
    assert _validate(path).exit_code == 0


def test_one_mistake_one_message(tmp_path: Path):
    """A missing link is reported on the edge; the variants and inputs that edge serves do not
    cascade into more errors."""
    path = tmp_path / "no_link.yaml"
    path.write_text(
        BASE.replace("  A-B: {gbps: 100, rtt_ms: 30, jitter: {p50_ms: 50, p99_ms: 2000}}", "  {}")
    )
    errors = _diagnostics(_validate(path).output, path)
    assert len(errors) == 2 and all("no link joins them" in e for e in errors), errors


def test_every_error_at_once(tmp_path: Path):
    text = BASE.replace("{op: prefill,", "{op: prefil,").replace(
        "policy: predicted_hit_rate", "policy: nope"
    )
    text = text.replace("to: main.kv", "to: main.kvv")
    path = tmp_path / "many.yaml"
    path.write_text(text)
    out = _validate(path).output
    assert f"{path}:16:" in out and f"{path}:27:" in out


def test_usage_errors_exit_2(tmp_path: Path):
    assert runner.invoke(app, ["validate", str(tmp_path / "missing.yaml")]).exit_code == 2
    assert runner.invoke(app, ["validate"]).exit_code == 2
