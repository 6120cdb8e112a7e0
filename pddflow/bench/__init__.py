"""The measured benchmarks behind `pddflow bench` (the runtime never imports this package)."""
