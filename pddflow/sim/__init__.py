"""The cluster-scale discrete-event simulator (`pddflow simulate`)."""
