"""The package's shape: `pddflow.channels` and each kind's subpackage load without pyarrow, grpc or
torch (the graph layer and the CLI import them), and every lazily exported name resolves."""

from __future__ import annotations

from pddflow.testing.imports import heavy_after


def test_package_and_kind_subpackages_are_light():
    code = (
        "import pddflow.channels, pddflow.channels.rdma_tensor, pddflow.channels.wan_flight, "
        "pddflow.channels.token_ids\n"
        # the params and codecs a deployer builds before it opens anything
        "import pddflow.channels.rdma_tensor.protocol, pddflow.channels.wan_flight.params, "
        "pddflow.channels.token_ids.codec"
    )
    assert heavy_after(code) == set()


def test_every_lazy_export_resolves():
    import pddflow.channels as ch

    for name in ch.__all__:
        assert getattr(ch, name).__name__ == name
