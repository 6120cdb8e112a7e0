"""Regenerate runtime_pb2.py from runtime.proto:

    python -m pddflow.runtime.proto.regen

Needs grpcio-tools (the `dev` extra). The generated module is committed; no gRPC stub is
generated (the services register their methods by hand, see pddflow/runtime/rpc.py)."""

from __future__ import annotations

import pathlib
import sys


def main() -> int:
    from grpc_tools import protoc  # dev dependency only

    here = pathlib.Path(__file__).resolve().parent
    rc = protoc.main(["grpc_tools.protoc", f"-I{here}", f"--python_out={here}", str(here / "runtime.proto")])
    if rc != 0:
        print(f"protoc failed with exit code {rc}", file=sys.stderr)
        return rc
    print(f"regenerated {here / 'runtime_pb2.py'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
