"""Training runs: the run spec, the state store, the run's object store and the run controller."""
