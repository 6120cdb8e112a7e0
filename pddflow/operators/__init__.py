"""The inference engine every PDD worker runs (docs/engine.md). Importing the package imports
nothing heavy; config, block_allocator, radix_cache, sequence and continuous_batching never
import torch."""
