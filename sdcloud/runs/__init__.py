"""Training runs, in three rooms: what a run is asked to do and what it needs from the user's
machine (inputs/), the controller that drives it (driving/), and what is kept of it (records/: the
state store, the journal, the driver lease, the run's bucket). The user's verbs on a run are
sdcloud/verbs/; the cloud driver's entry is sdcloud/driver/."""
