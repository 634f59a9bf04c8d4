"""The bucket that holds a run's or a batch job's history, found from its row in the state store.

`logs` reads the hosts' logs from it, `status` the host's status.json, `watch --drive` the journal.
"""

from __future__ import annotations


def store_of(run: dict):
    """The open store of `run` (a row of the runs table): a batch job's spec holds its store's config
    itself; a training run's comes from its spec and the stack's outputs saved on this machine."""
    from .controller import store_url
    from .spec import RunSpec
    from .state import BATCH, StateStore, run_kind
    from .store import open_run_store

    if run_kind(run) == BATCH:
        return open_run_store(run["spec"]["store"])
    spec = RunSpec(**run["spec"])
    return open_run_store(store_url(spec, StateStore().infra(spec.provider, spec.region or "")))
