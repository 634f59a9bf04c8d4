"""Driving a run: the controller and the helpers it holds (boot failures, out-of-memory moves,
health, the budget, the agent's reports), what a host is launched with and told, and the
controller as a background process."""
