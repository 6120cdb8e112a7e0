"""Scheduling policy: pure objects, features in, decision out; used by the runtime and the simulator."""
