"""A batch job across clouds: `batch submit --provider aws,tencent` runs workers in both at once.

The first provider named is the job's home: its store holds the job as before (items, leases,
images, done markers, the workers' indexes), and that is where every image lands, exactly once.
Each other cloud gets a copy of the job in its own store (its stack's bucket): the job and its items,
and the LoRA. Its workers are the same agent workers, claiming items in that store with the hosts'
own role, so no host holds the other cloud's keys. This machine, which holds both clouds'
credentials (each checked before anything is recorded), relays between the stores every step
(`Relay.step`):

- a done marker in the home store is copied to every other store first, so their workers skip that item;
- a done marker in another store whose item is not done at home: each of its images is copied home
  create-only (content-keyed, so an image both clouds made lands once), then the marker, create-only
  (one winner, as between two workers of one store); the lines of the markers it won join the
  worker's index at home;
- a cancel at home reaches every store.

An item may be worked in both clouds at once until the relay has carried its marker (at most one
step of the controller): that costs a redone item, never a second image or a second marker at
home. A job across clouds is driven from this machine: no cloud driver holds the other cloud's keys,
so `batch schedule add` takes one provider.

Each cloud's hosts are a fleet of their own under the job's id: `CloudRecords` shows a fleet only
its own cloud's attempts and numbers them apart (the home's 1, 2, ...; the k-th other cloud's from
k x ATTEMPTS_APART + 1), so that worker ids, boot reports and the cost ledger never collide.
"""

from __future__ import annotations

import json
from typing import Any, Callable


# Attempt numbers of the k-th other cloud start at k x ATTEMPTS_APART + 1 (a fleet's launches are
# bounded far below this: sdcloud.fleet.lifecycle.MAX_FAILED_LAUNCHES and the job's workers).
ATTEMPTS_APART = 10_000


def resolve(text: str) -> list[str]:
    """`aws,tencent` -> the providers, each matched to a known name, repeats dropped. Several must
    all be clouds with a price catalog: another cloud's workers need that cloud's stack and store."""
    from ..runs.inputs.clouds import resolve as resolve_clouds

    return resolve_clouds(text, "a batch job")


def check(providers: list[str], store_conf: Callable[[str], dict]) -> dict[str, dict]:
    """Before anything is recorded: every named provider's credentials, then each other cloud's
    store (its stack's bucket). One line naming the first that is missing. Returns {cloud: store conf}."""
    from ..runs.inputs.clouds import check_credentials

    check_credentials(providers)
    return {name: store_conf(name) for name in providers[1:]}


def shares(workers: int, clouds: int) -> list[int]:
    """K workers over the clouds, the home first: as even as whole hosts allow, every cloud at least one."""
    base, extra = divmod(max(workers, clouds), clouds)
    return [base + (1 if k < extra else 0) for k in range(clouds)]


def attempt_base(k: int) -> int:
    return k * ATTEMPTS_APART


class CloudRecords:
    """The state store as one cloud's fleet of a job across clouds sees it (module docstring)."""

    def __init__(self, state: Any, provider: str, k: int):
        self.state, self.provider, self.base = state, provider, attempt_base(k)

    def attempts(self, owner_id: str) -> list[Any]:
        return [a for a in self.state.attempts(owner_id) if a.provider == self.provider]

    def _n(self, n: int) -> int:
        return n if n > self.base else n + self.base

    def add_attempt(self, owner_id: str, n: int, provider: str, token: str, **fields: Any) -> None:
        self.state.add_attempt(owner_id, self._n(n), provider, token, **fields)

    def update_attempt(self, owner_id: str, n: int, **fields: Any) -> None:
        self.state.update_attempt(owner_id, self._n(n), **fields)

    def __getattr__(self, name: str) -> Any:  # zone cooldowns and the rest: the state store's own
        return getattr(self.state, name)


class Relay:
    """Carries a job between its home store and one other cloud's store (module docstring)."""

    def __init__(self, home: Any, other: Any, prefix: str):
        self.home, self.other, self.prefix = home, other, prefix.strip("/")

    def seed(self, lora_key: str | None = None) -> None:
        """The job, its items and its LoRA in the other store, create-only (a second seed changes nothing)."""
        keys = [f"{self.prefix}/items.jsonl", f"{self.prefix}/job.json"] + ([lora_key] if lora_key else [])
        for key in keys:
            if self.other.head(key) is None:
                self.other.put_if_absent(key, self.home.get(key))

    def _done(self, store: Any) -> set[str]:
        return {o.key.rsplit("/", 1)[-1] for o in store.list(f"{self.prefix}/done/")}

    def step(self) -> dict[str, int]:
        """One pass both ways. Returns what moved: markers out, markers and images home."""
        moved = {"markers_out": 0, "markers_home": 0, "images_home": 0}
        home_done, other_done = self._done(self.home), self._done(self.other)
        for name in sorted(home_done - other_done):
            if self.other.put_if_absent(f"{self.prefix}/done/{name}", self.home.get(f"{self.prefix}/done/{name}")):
                moved["markers_out"] += 1
        won: dict[str, list[str]] = {}
        for name in sorted(other_done - home_done):
            body = self.other.get(f"{self.prefix}/done/{name}")
            marker = json.loads(body)
            for line in marker.get("images", []):
                key = f"{self.prefix}/images/{line['key']}.png"
                if self.home.head(key) is None and self.home.put_if_absent(key, self.other.get(key)) is not None:
                    moved["images_home"] += 1
            if self.home.put_if_absent(f"{self.prefix}/done/{name}", body) is not None:
                moved["markers_home"] += 1
                won.setdefault(str(marker.get("worker")), []).extend(
                    json.dumps(line, sort_keys=True) for line in marker.get("images", []))
        # A worker's index at home holds the lines of the markers it won at home, as a worker's own does.
        for worker, lines in sorted(won.items()):
            key = f"{self.prefix}/index/{worker}.jsonl"
            have = self.home.get(key).decode() if self.home.head(key) is not None else ""
            self.home.put(key, (have + "\n".join(lines) + "\n").encode())
        cancel = f"{self.prefix}/cancel"
        if self.home.head(cancel) is not None and self.other.head(cancel) is None:
            self.other.put_if_absent(cancel, self.home.get(cancel))
        return moved
