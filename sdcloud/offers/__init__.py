"""What can run a job and what it would cost: workload tiers, GPU speeds, the price catalog and the optimizer."""
