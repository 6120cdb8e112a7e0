"""Engine kernels, each with a torch reference (docs/engine.md, Kernels). Triton is imported only
in the `_triton_*` modules, so the engine runs without it."""

# tokens of KV one attention tile spans (a multiple of the block size); here, not in
# paged_attention, so an engine's settings are read without importing torch
DEFAULT_TILE = 64
