"""Engine kernels, each with a torch reference: `paged_attention` (decode rows and prefill/extend
chunks over the paged KV pool) and `kv_copy` (block gather/scatter for KV export and import).

Triton is imported only inside the `_triton_*` modules, which load on CUDA or in kernel tests, so
the engine runs where triton is not installed.
"""
