"""Handing a run to another driver: whether the cloud driver can take it (`up --unattended`), and
giving it back when the user stops driving it here (Ctrl-C in `watch RUN --drive`).

The cloud driver is the provider's function (traits(name).function), deployed by its stack
(`driver_function` among the stack's outputs) and reading the stack's bucket only: a run elsewhere
(another provider, a stack without the function, a `--store` bucket of its own) would be handed to
nobody and wait `pending` for ever, so it is refused before anything is recorded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import UserError
from ..providers.traits import names, traits

if TYPE_CHECKING:
    from ..runs.driving.controller import Controller

DRIVER_OUTPUT = "driver_function"


def check_cloud_driver(spec: Any, infra: dict | None) -> None:
    """One UserError line unless the cloud driver of the run's provider can take the run."""
    if traits(spec.provider).function is None:
        with_one = ", ".join(names(where=lambda t: t.function is not None)) or "none"
        raise UserError(f"--unattended: provider {spec.provider} has no cloud driver (providers with one: {with_one}); "
                        f"drive the run from here, or in the background with --detach")
    if not infra:  # `up` would create the stack first; an unattended run needs the one with a driver
        raise UserError(f"--unattended: no {spec.provider} stack is deployed from this machine, and the cloud "
                        f"driver is part of it: run `sdcloud infra up --provider {spec.provider}` first")
    if not infra.get(DRIVER_OUTPUT):
        raise UserError(f"--unattended: the {spec.provider} stack has no cloud driver deployed; "
                        f"run `sdcloud infra up --provider {spec.provider}` first")
    if spec.store:
        from ..runs.records.store import store_config

        stack = store_config(spec.provider, None, spec.region, infra)["url"].rstrip("/")
        if str(spec.store).rstrip("/") != stack:
            raise UserError(f"--unattended: the cloud driver reads the stack's bucket ({stack}) only, and --store "
                            f"{spec.store} is another; drop --store, or drive the run with --detach")


def cloud_drives(ctl: Controller) -> bool:
    """Whether the run was handed to the cloud driver (its setting, recorded with its inputs)."""
    from ..runs.inputs import staging as inputs

    rec, _ = inputs.recorded(ctl.state, ctl.run_id)
    return bool(rec and rec.get("drive") == "cloud") and traits(ctl.spec.provider).function is not None


def hand_back(ctl: Controller) -> str:
    """This driver stops driving the run and gives it back (the cloud driver, or a background
    controller of this machine); who has it now, in words. A second Ctrl-C meanwhile does not cut
    it short (that would leave a run nobody drives): it says so, and the hand-back goes on (the
    caller puts the default handler back once it is done)."""
    import signal

    from ..render import note

    signal.signal(signal.SIGINT, lambda *_: note(f"still handing run {ctl.run_id} back; it continues, then this stops"))
    if cloud_drives(ctl):
        ctl.hand_over(stage=False)
        ctl.lease.release()
        return "the cloud driver, which takes it within its next invocation"
    from ..runs.driving.background import detach

    ctl.state.update_run(ctl.run_id, controller_pid=None)
    ctl.journal.flush()
    ctl.lease.release()  # before the background controller asks for it
    pid = detach(ctl.run_id)
    ctl.state.update_run(ctl.run_id, controller_pid=pid)
    return f"a background controller on this machine (pid {pid})"
