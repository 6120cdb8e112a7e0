"""The `pddflow` command line; command modules import heavy libraries inside their functions, so
`pddflow validate` and `pddflow viz` start instantly."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="pddflow",
    help="Serve LLMs with cross-datacenter prefill/decode disaggregation (Prefill -> RelayDecode "
    "-> MainDecode), declared as YAML dataflow graphs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(
    help="Measured benchmarks, each side by side with its baseline; --json for machines.",
    no_args_is_help=True,
)
app.add_typer(bench_app, name="bench")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"pddflow {version('pddflow')}")
        raise typer.Exit()


@app.callback()
def _options(
    _: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="print the version and exit"
    ),
) -> None:
    pass


# Each module defines register(app, bench_app). Order is the order of `pddflow --help`.
COMMAND_MODULES = [
    "graph_cmds",
    "runtime_cmds",
    "elastic_cmds",
    "engine_cmds",
    "channel_cmds",
    "handoff_cmds",
    "sim_cmds",
    "size_cmds",
]

for _name in COMMAND_MODULES:
    importlib.import_module(f"pddflow.commands.{_name}").register(app, bench_app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
