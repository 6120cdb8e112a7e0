"""Generated protobuf modules of the channels (`python -m pddflow.regen_protos`)."""
