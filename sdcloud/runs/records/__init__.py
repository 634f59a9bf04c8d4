"""What is kept of a run: the state store (state.db), the journal in the run's bucket that rebuilds
it, the driver lease, the object store and which bucket holds a run, a stop asked through the
bucket, earlier pulls, the finished model's place, and the summary read from them all."""
