"""The real deployment (`pddflow deploy`): deployer, frontend, workers, API, metrics."""
