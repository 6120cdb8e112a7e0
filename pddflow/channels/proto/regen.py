"""Regenerate pddflow_pb2.py from pddflow.proto:

    python -m pddflow.channels.proto.regen

Needs grpcio-tools (the `dev` extra). The generated module is committed, so the runtime needs only
the protobuf runtime (the gencode checks it is at least the version that generated it). No gRPC
stub is generated: `token_ids.py` registers its one streaming method by hand with the message
serializers below, which keeps grpcio free of a generated-code version pin."""

from __future__ import annotations

import pathlib
import sys


def main() -> int:
    from grpc_tools import protoc  # dev dependency only

    here = pathlib.Path(__file__).resolve().parent
    rc = protoc.main(["grpc_tools.protoc", f"-I{here}", f"--python_out={here}", str(here / "pddflow.proto")])
    if rc != 0:
        print(f"protoc failed with exit code {rc}", file=sys.stderr)
        return rc
    print(f"regenerated {here / 'pddflow_pb2.py'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
