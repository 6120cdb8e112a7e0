"""Generated protobuf modules for pddflow's channels (see pddflow.proto; regenerate with
`python -m pddflow.regen_protos`)."""
