"""Shared vocabulary below every layer: payload types, operator signatures, channel kinds, link and
device models, model architecture presets, the plugin registries. No torch, pyarrow or grpc.
"""
