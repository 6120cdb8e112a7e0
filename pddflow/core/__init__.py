"""Shared vocabulary below every layer: payload types, operator signatures, channel kinds,
link and device models, model architecture presets, and the plugin registries.

Nothing here imports torch, pyarrow or grpc, so the graph tools stay instant.
"""
