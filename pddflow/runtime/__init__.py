"""The real deployment (`pddflow deploy`): deployer backends, workers, API, metrics. Built by the runtime issue."""
