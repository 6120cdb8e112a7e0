"""Regenerate the committed `*_pb2.py` from their .proto files (needs grpcio-tools; no gRPC stubs):

python -m pddflow.regen_protos
"""

from __future__ import annotations

import pathlib
import sys

PROTOS = ("channels/proto/pddflow.proto", "runtime/proto/runtime.proto")


def main() -> int:
    from grpc_tools import protoc  # dev dependency only

    root = pathlib.Path(__file__).resolve().parent
    for rel in PROTOS:
        proto = root / rel
        rc = protoc.main(
            ["grpc_tools.protoc", f"-I{proto.parent}", f"--python_out={proto.parent}", str(proto)]
        )
        if rc != 0:
            print(f"protoc failed on {proto} with exit code {rc}", file=sys.stderr)
            return rc
        print(f"regenerated {proto.with_name(proto.stem + '_pb2.py')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
