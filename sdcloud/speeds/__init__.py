"""Rates and start-up times that runs measured or the user recorded (docs/offers.md, "Recorded and
observed figures"): kept in the state store, listed by `sdcloud speeds`, used by the optimizer in the
catalog's place, and by a running job to replan on what it measures."""
