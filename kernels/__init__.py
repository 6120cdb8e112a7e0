"""Engine kernels, each with a torch reference (docs/engine.md, Kernels). Triton is imported only
in the `_triton_*` modules, so the engine runs without it."""
