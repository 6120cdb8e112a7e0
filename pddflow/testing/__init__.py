"""Harnesses that drive the channels from outside (peer processes, faulty parts, the channel
benchmark); the runtime never imports this package."""
