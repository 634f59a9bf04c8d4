"""Spot decisions: the policy object the controller and the simulator share, and the trace simulator."""
