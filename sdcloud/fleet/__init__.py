"""The host lifecycle: keep N hosts alive for one owner (a training run, a batch job) through the spot policy.

Choose an offer, launch it (tagged, idempotent), watch heartbeats and reclaims, replace lost hosts,
cool down zones (kept in the state store), adopt after a controller restart and sweep strays. What
the hosts do (steps, checkpoints, deadlines, budgets) belongs to the owner: runs/ or batch/.
"""
