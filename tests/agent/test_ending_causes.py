"""Why a host saved and ended, in words that match the cause (sdcloud_agent/agent_reclaim.py): only a
cloud's notice is a reclaim; a SIGTERM is the host being shut down (its driver ended the instance:
`sdcloud down`, a budget, a move), an end asked through the bucket is its driver's, the cap the
host's own. Fast: the agent's reclaim path on a stand-in, no trainer."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sdcloud_agent import selfend
from sdcloud_agent.agent_reclaim import ENDINGS, ReclaimPath
from sdcloud_agent.end_request import ENDED_BY
from sdcloud_agent.outcome import EXIT_PREEMPTED
from sdcloud_agent.watchers import Notice


class _Status:
    def __init__(self, **state):
        self.state = dict(state)


class _Host(ReclaimPath):
    """The parts of the Agent its reclaim path reads."""

    def __init__(self, **status):
        self.notice, self.cap_reason, self.status = None, None, _Status(**status)

        class _Event:
            def set(self):
                pass

        self.notice_event = _Event()


def _cloud_notice() -> Notice:
    now = time.time()
    return Notice("terminate", now + 120, now, "spot terminate")


@pytest.mark.parametrize("arrive, status, cause", [
    (lambda h: h._on_sigterm(15, None), {}, "host-shutdown"),
    (lambda h: h._on_notice(_cloud_notice()), {}, "reclaim-notice"),
    # The cloud's notice came first; the OS shutdown's SIGTERM that follows it is that reclaim's.
    (lambda h: (h._on_notice(_cloud_notice()), h._on_sigterm(15, None)), {}, "reclaim-notice"),
    (lambda h: h._on_notice(Notice("terminate", time.time() + 90, time.time(), "asked to end by pc: stopped")),
     {"ended_by": ENDED_BY}, "asked-to-end"),
])
def test_the_cause_is_the_notice_that_came_first(arrive, status, cause):
    host = _Host(**status)
    arrive(host)
    assert host._ending_cause() == cause


def test_a_shutdown_is_no_reclaim_in_any_words():
    words = " ".join(ENDINGS["host-shutdown"])
    assert "reclaim" not in words and "notice" not in words
    assert ENDINGS["reclaim-notice"][2] == selfend.REASONS[EXIT_PREEMPTED]  # the words a reclaim always had


def test_the_self_end_says_the_cause_it_saved_on(monkeypatch):
    """end_host's reason (status.json's self_end, `logs`' "the host ended itself (...)") follows the
    attempt's cause, not its exit code alone."""
    seen = {}

    def finish(se, store, prefix, attempt, reason, **kw):
        seen["reason"] = reason
        return {"reason": reason}

    monkeypatch.setattr(selfend, "finish", finish)

    class _Cfg:
        run_prefix, attempt, node_rank = "runs/r-1", 1, 0

    for cause in ENDINGS:
        if cause == "lifetime-cap":
            continue  # its reason names the cap and its figure (agent_reclaim.end_host)
        host = _Host(failure_cause=cause)
        host.self_end = selfend.SelfEnd.from_dict({"provider": "local"})
        host.attendance, host.store, host._started_wall = object(), None, time.time()
        host.cfg, host.workdir = _Cfg(), Path("/nonexistent")
        host.node_prefix = _Cfg.run_prefix  # a single host (rank 0) reports under the run's own prefix
        host.end_host(EXIT_PREEMPTED)
        assert seen["reason"] == ENDINGS[cause][2], cause
