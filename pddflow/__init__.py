"""pddflow: cross-datacenter prefill/decode disaggregated LLM serving from YAML dataflow graphs."""

__version__ = "0.1.0"
