"""Gated hub models (the SD3 / SD3.5 repositories): the user's Hugging Face token, checked against the
model's gate before anything launches, and how it reaches the host.

The token comes from the environment (``HF_TOKEN``, or huggingface_hub's older ``HUGGING_FACE_HUB_TOKEN``)
or from config.toml::

    [huggingface]
    token = "hf_..."

Before launch the hub's own access check (``GET /api/models/<repo>/auth-check``, huggingface_hub's
``auth_check``, at ``HF_ENDPOINT`` when set) answers for the token: accepted, no token, a token whose
account has not accepted the licence, an unknown repository -- each refusal one line, exit 2. A hub
that cannot be reached is not a refusal: the host fetches through its own network (a mirror) and
its model phase says so if the gate stops it there.

The token never enters the agent's config, user-data, the state store, the run's journal or a log:
the controller puts it in the run's bucket at ``runs/<run>/secrets/hf-token`` (the bucket is the
run's, reached with the run's own credentials), the host's agent reads it into memory for the model
fetch only (sdcloud_agent/models.py). It lives as long as the run does: whoever ends the run (the
controller here, its background process, the cloud function, a `status` that closes a run whose
host ended itself) deletes `runs/<run>/secrets/` as it records the end, in every end state, and a
driver that takes an unfinished run up again puts it back from its own machine's token when the
bucket has none (`put_back`). In a local folder store the object is 0600.
"""

from __future__ import annotations


import os
from typing import Any, Sequence

from ... import config
from ...errors import UserError

ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
SECRET_KEY = "secrets/hf-token"  # under the run's prefix, runs/<run>/


def token() -> str | None:
    """The user's Hugging Face token: the environment first, then config.toml [huggingface] token."""
    for var in ENV_VARS:
        value = os.environ.get(var, "").strip()
        if value:
            return value
    value = (config.settings().get("huggingface") or {}).get("token")
    return str(value).strip() or None if value else None


def gated_family(family: str | None) -> bool:
    """The families whose published repositories are gated (every SD3 / SD3.5 one)."""
    return family == "sd3"


def check_access(model: str) -> None:
    """Refuse, before launch, a hub model the user's token cannot download (one line each)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    repo = model.partition("@")[0]
    tok = token()
    try:
        HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None).auth_check(repo, token=tok or False)
    except GatedRepoError:
        if not tok:
            raise UserError(f"--model {model} is gated on the Hugging Face hub and no token is set: accept its "
                            "licence on the model's page, then set HF_TOKEN or [huggingface] token in "
                            "config.toml") from None
        raise UserError(f"--model {model} is gated and the account of your Hugging Face token has not accepted "
                        f"its licence: accept it at https://huggingface.co/{repo}") from None
    except RepositoryNotFoundError:
        raise UserError(f"--model {model}: no such repository on the Hugging Face hub (or your token cannot "
                        "see it)") from None
    except HfHubHTTPError as exc:
        status = getattr(exc.response, "status_code", None)
        if status == 401:
            raise UserError(f"--model {model}: the Hugging Face hub refuses your token (HTTP 401): is it "
                            "revoked or mistyped?") from None
        return  # another answer (a mirror without the check, 5xx): the host's fetch decides
    except Exception:  # noqa: BLE001 - no route to the hub from here (OSError, httpx): the host's fetch decides
        return


def put_for_host(store, run_id: str) -> bool:
    """The token, where the run's host reads it (runs/<run>/secrets/hf-token); whether one was put."""
    tok = token()
    if not tok:
        return False
    store.put(f"runs/{run_id}/{SECRET_KEY}", tok.encode())
    return True


def put_back(store, run_id: str, model: str | None) -> bool:
    """A driver taking up an unfinished run of a hub model: the token put again when the bucket has
    none (its end deleted it, and the user resumed it); whether one was put."""
    from sdcloud_agent.trainers.models import looks_like_hub_id

    if not model or not looks_like_hub_id(model) or store.head(f"runs/{run_id}/{SECRET_KEY}") is not None:
        return False
    return put_for_host(store, run_id)


def drop(store, run_id: str) -> int:
    """Delete every secret the run's hosts read (runs/<run>/secrets/): the run has ended. How many."""
    keys = [o.key for o in store.list(f"runs/{run_id}/secrets/")]
    if keys:
        store.delete(keys)
    return len(keys)


def drop_at_end(state, run_id: str, stores: Sequence[Any]) -> None:
    """The run has ended (the controller's end_run, whoever drives): its secrets deleted from its
    `stores` (across clouds, the home store's copy too). A store out of reach now leaves them to `sdcloud gc`."""
    from ...events import Kind
    from ..records.store import StoreError

    try:
        for store in {id(s): s for s in stores}.values():
            drop(store, run_id)
    except (StoreError, OSError) as exc:
        state.event(run_id, Kind.JOURNAL_DEFERRED, {"error": f"secrets not deleted: {exc}"[:200]})


def taken_up(store, run_id: str, run_state: str, record: dict | None) -> dict | None:
    """A run a driver takes up from its inputs record: its token, deleted at its last end, put back
    from this machine's own (a driver without one leaves the host's model phase to say so)."""
    from ..records.run_state import ACTIVE_RUN_STATES

    if record and run_state in ACTIVE_RUN_STATES:
        try:
            put_back(store, run_id, record.get("model"))
        except Exception:  # noqa: BLE001 - the token is the host's need, said by its model phase
            pass
    return record

