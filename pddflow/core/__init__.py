"""Shared vocabulary below every layer (payloads, signatures, registries); no torch or grpc."""
