"""The boot side of a cloud launch: the per-run user-data (with the agent wheel uploaded first),
and what the controller does when a host reports a failed boot phase.

A boot failure (a phase of the user-data, the agent's model or dataset staging, or a GPU the agent
cannot use) ends that attempt and cools down that offer, not the run; after `max_failed_boots`
failed boots in a row the run ends with one line.
"""

from __future__ import annotations


from sdcloud_agent import wheel as agent_wheel

# What a tier's run file may override with `max-failed-boots:`.
DEFAULT_MAX_FAILED_BOOTS = 3
BOOT_FAILURES = ("boot-failed", "boot-timeout")
# The driver series Tencent hosts install when their image has none (the stack's default).
TENCENT_DRIVER = "535-server"


def cloud_user_data(provider: str, store, agent: dict, infra: dict | None = None) -> str:
    """The per-run user-data for an AWS or Tencent host; uploads the agent wheel if needed."""
    from sdcloud_agent.userdata import render_user_data

    from .network import host_network

    store_conf = agent.get("store") if isinstance(agent.get("store"), dict) else {}
    region = (infra or {}).get("region") or store_conf.get("region")
    net = host_network(region)
    if net and "network" not in agent:  # config.toml's mirrors (sdcloud/runs/network.py)
        agent = {**agent, "network": net}
    wheel = agent_wheel.ensure_uploaded(store)
    driver = ""
    if provider == "tencent":  # the per-run user-data replaces the template's, driver install included
        driver = str((infra or {}).get("nvidia_driver") or TENCENT_DRIVER)
    return render_user_data(agent, wheel_key=wheel.key, driver=driver)


def is_boot_failure(status: dict | None) -> bool:
    return bool(status and status.get("phase") == "failed" and status.get("boot_phase"))


def failed_boots_in_a_row(attempts) -> int:
    n = 0
    for a in reversed([a for a in attempts if a.end_reason]):
        if not a.end_reason.startswith(BOOT_FAILURES):
            break
        n += 1
    return n


def on_boot_failure(ctrl, cur, status: dict) -> None:
    """End the attempt, cool down its offer, and end the run after N failed boots in a row."""
    phase = status.get("boot_phase")
    reason = (status.get("reason") or "").strip()
    ctrl.event("boot-failed", {"attempt": cur.n, "instance": cur.instance_id, "boot_phase": phase,
                               "reason": reason[-2000:]})
    # The phase in the attempt's end reason, so that `sdcloud status` shows it.
    ctrl._end_attempt(cur, f"boot-failed:{phase}")
    ctrl.fleet.cool_down(f"{cur.provider}/{cur.region}/{cur.zone or '*'}/{cur.instance_type}", "boot-failed")
    check_limit(ctrl, phase)


def check_limit(ctrl, phase: str | None = None) -> None:
    # A training run's spec is a RunSpec, a batch job's a dict (sdcloud.batch.jobs.submit).
    spec = ctrl.spec
    limit = (spec.get("max_failed_boots") if isinstance(spec, dict) else getattr(spec, "max_failed_boots", None))
    limit = limit or DEFAULT_MAX_FAILED_BOOTS
    n = failed_boots_in_a_row(ctrl.attempts())
    if n >= limit:
        where = f" (last: phase {phase})" if phase else ""
        ctrl._end_run("failed", f"{n} failed boots in a row{where}; see: sdcloud logs {ctrl.run_id}")
    else:
        ctrl.state.update_run(ctrl.run_id, state="recovering")

