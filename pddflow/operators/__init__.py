"""Compute operators: the inference engine every PDD worker runs.

One concept per module:
  config.py           model architecture facts (HF config.json or builtin), pure Python
  weights.py          model sources: builtin:<name> (seeded weights) or a local HF checkpoint
  tokenizer.py        byte tokenizer / tokenizer.json
  rope.py             rotary embeddings (default, linear, llama3 scaling)
  linear.py           batch-invariant linear layers (oneDNN packed weights on CPU)
  model.py            the Llama/Qwen2 decoder over a paged KV pool
  block_allocator.py  KV block free list + reference counts, KVCacheFull (pure Python)
  kv_cache.py         the paged KV pool tensor and its geometry
  radix_cache.py      prefix cache keyed by chained block hashes (pure Python)
  sequence.py         one request's tokens, block table and progress (pure Python)
  sampling.py         greedy / temperature + top-p with stateless per-request seeds
  engine.py           prefill / decode / extend / KV export-import / free / match
  engine_bench.py     `pddflow bench engine` (engine vs HF transformers; corun_bench.py)
  hf_reference.py     HF transformers on the engine's weights (benchmark and parity tests)

Importing this package imports nothing heavy, and the pure-Python modules never import torch, so
the simulator can use them.
"""
