"""Generated protobuf module of the runtime control plane (runtime.proto)."""
