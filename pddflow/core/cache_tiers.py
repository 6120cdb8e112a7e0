"""The tiers a KV cache may have, fastest first: the device pool, host memory, local disk (the
engine's kv_tiers.py, the router's mirror and /metrics name them so)."""

DEVICE, HOST, DISK = 0, 1, 2
TIER_NAMES = ("device", "host", "disk")
