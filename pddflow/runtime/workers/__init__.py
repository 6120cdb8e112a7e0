"""A deployment's workers: one class per role over the shared loop (docs/runtime.md, Workers)."""
