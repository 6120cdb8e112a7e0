"""Compute kernels for the engine, each with a torch reference implementation.

- `paged_attention`: attention of any set of query rows over a paged KV pool (decode rows and
  prefill/extend chunks alike). Torch path: batch-invariant tiled attention (CPU). Triton path: one
  program per (query row, KV head) walking the block table (CUDA).
- `kv_copy`: gather a sequence's blocks into one contiguous buffer (KV export) and scatter a
  received buffer into fresh blocks (KV import).

Triton is a dev dependency and imported lazily: the `_triton_*` modules load only on a CUDA device
or in kernel tests, so the engine runs where triton is not installed.
"""
