"""The cloud driver: the scheduled function's entry (unattended.py), which takes the steps of the
runs (sdcloud.runs) and of the batch jobs (batch_jobs.py, over sdcloud.batch) whose driver lease has
lapsed. It sits above both, so it imports each plainly."""
