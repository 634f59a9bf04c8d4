"""A running job replans on what it measures: once an attempt is warm, the work left that the spot
policy sees is the steps left at the attempt's measured rate, not the catalog's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sdcloud.fleet.lifecycle import Progress
from sdcloud.runs.driving.controller import Controller
from sdcloud.runs.records.state import StateStore
from sdcloud.speeds.observe import steady_rate
from sdcloud.speeds.replan import measured_rate, replanned
from sdcloud.spot.policy import ON_DEMAND, SPOT, WAIT, Observation, ZoneView, get_policy

CATALOG_RATE = 1.0  # steps/s the catalog promised
HOST_RATE = 0.5  # what the hosts report: half of it
STEPS = 14_400  # 4 h at the catalog's rate, 8 h at the hosts'
DEADLINE = 10.0
RESTART = 0.2
TICK = 0.05
SPOT_UNTIL = 3.0  # spot is gone everywhere after 3 h, for good


def drive(replan: bool) -> tuple[float, float | None]:
    """The sdcloud policy over a run whose hosts train at HOST_RATE, fed the controller's Progress:
    planned on the catalog's rate, or replanned by speeds.replan once the attempt is warm.
    (when it finished, when it went on-demand)."""
    policy = get_policy("sdcloud")
    catalog_hours = STEPS / CATALOG_RATE / 3600
    t, step, market, booting, on_demand_at = 0.0, 0.0, None, 0.0, None
    first = None
    while step < STEPS and t < 3 * DEADLINE:
        spot_up = t < SPOT_UNTIL - 1e-9
        if market == SPOT and not spot_up:
            market = None  # reclaimed; the work is checkpointed
        planned = Progress(elapsed_hours=t, done_hours=catalog_hours * step / STEPS, job_hours=catalog_hours,
                           deadline_hours=DEADLINE)
        progress = planned
        if replan and first is not None:
            # The ledger row the controller keeps of the attempt: the host's it/s after its first step.
            rate = steady_rate({"start_step": first, "last_step": int(step), "it_per_s": HOST_RATE})
            progress = replanned(planned, rate, int(step), STEPS)
        obs = Observation(t, progress.done_hours, progress.job_hours, DEADLINE, RESTART, "a" if market or step else None,
                          market, [ZoneView("a", spot_up, 0.3, 1.0)], TICK)
        action = policy.decide(obs)
        if action.kind == WAIT:
            market = None
        elif action.kind != market:
            market, booting = action.kind, RESTART
            if action.kind == ON_DEMAND and on_demand_at is None:
                on_demand_at = t
        if market is not None:
            if booting > 1e-9:
                booting -= TICK
            else:
                first = int(step) if first is None else first
                step += HOST_RATE * TICK * 3600
        t += TICK
    return t, on_demand_at


def test_a_run_on_slow_hosts_meets_its_deadline_by_going_on_demand_in_time():
    finished, switched = drive(replan=True)
    assert finished <= DEADLINE, finished
    assert switched is not None and switched < 4.0


def test_the_same_run_planned_on_the_catalogs_rate_misses_it():
    finished, switched = drive(replan=False)
    assert finished > DEADLINE, finished
    replanned_switch = drive(replan=True)[1]
    assert switched is not None and switched > replanned_switch + 2.0


def test_replanned_keeps_the_done_hours_and_sets_the_work_left():
    p = Progress(elapsed_hours=1.0, done_hours=1.0, job_hours=4.0, deadline_hours=10.0)
    q = replanned(p, 0.5, 3600, 14_400)
    assert q.done_hours == 1.0 and q.job_hours == pytest.approx(1.0 + 10_800 / 0.5 / 3600)
    assert replanned(p, None, 3600, 14_400) == p
    assert replanned(p, 0.0, 3600, 14_400) == p


def test_the_newest_warm_attempt_gives_the_measured_rate(sdcloud_home):
    state = StateStore()
    state.create_run("r-1", "sdxl-lora", {"tier": "sdxl-lora"}, 1000)
    assert measured_rate(state, "r-1") is None
    state.set_attempt_costs("r-1", 1, first_step_at=10.0, start_step=1, last_step=40, last_step_at=70.0, it_per_s=0.6)
    state.set_attempt_costs("r-1", 2, first_step_at=100.0, start_step=38, last_step=39, last_step_at=101.0, it_per_s=2.0)
    assert measured_rate(state, "r-1") == (1, 0.6)  # attempt 2 is not warm yet
    state.set_attempt_costs("r-1", 2, last_step=45, last_step_at=110.0)
    assert measured_rate(state, "r-1") == (2, 2.0)


def test_the_controllers_progress_is_replanned_on_the_measured_rate(sdcloud_home):
    from sdcloud.runs.driving.run_row import RunRow

    state = StateStore()
    state.create_run("r-1", "sdxl-lora", {"tier": "sdxl-lora"}, 3000)
    state.update_run("r-1", step=600)
    fake = SimpleNamespace(state=state, run_id="r-1", total_steps=3000, spec=SimpleNamespace(deadline_hours=5.0),
                           expected_job_hours=lambda: 1.0, row=RunRow(state, "r-1"))
    before = Controller.progress(fake)
    assert before.job_hours == 1.0 and before.done_hours == pytest.approx(0.2)
    state.set_attempt_costs("r-1", 1, first_step_at=10.0, start_step=1, last_step=600, last_step_at=1210.0, it_per_s=0.25)
    after = Controller.progress(fake)
    assert after.done_hours == pytest.approx(0.2)
    assert after.job_hours == pytest.approx(0.2 + 2400 / 0.25 / 3600)
