"""The batch workers' calls, judged as AWS judges them: a worker host holds the host role
(stacks/aws/aws_host_policy.py), so its workers sign with keys that hold exactly that policy, against
moto's S3 with IAM enforced (tests/support/authz/authz_moto_iam.py), and each recorded call is expanded and decided with
its conditions by the evaluator (tests/support/authz/authz_judge.py), which is stricter than moto (s3:prefix,
tagging, per-key deletes).

Calls are attributed by the access key that signs them (authz_record.as_principal): the job's
submission is the user's, the workers' (and their s3transfer threads') the worker's. Least privilege
for the workers: each action of the host policy is needed by some worker call or listed in
NOT_FOR_WORKERS with what needs it instead.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from tests.support.fake_batch import FakeGenerator

from tests.support.authz.authz_judge import host_policy, needs, refusals
from tests.support.authz.authz_record import as_principal, record_calls

BUCKET, PREFIX, REGION = "sdcloud-batch-authz", "sdcloud", "us-east-1"

# Host-policy grants no worker call needs: the host agent's training run needs them (test_authz_aws
# proves each of those against the host's own calls).
NOT_FOR_WORKERS = {
    "s3:DeleteObject": "the training host rotates its checkpoints; a worker's writes are create-only and never deleted",
    "s3:PutObjectTagging": "the training host's checkpoint and log uploads carry the sdcloud-class tag; images do not",
    "s3:AbortMultipartUpload": "a failed multipart upload's clean-up; a worker's images and markers are single PUTs",
}


def _keys_file(tmp_path, name: str, key: str, secret: str) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"AccessKeyId": key, "SecretAccessKey": secret, "Expiration": "2099-01-01T00:00:00Z"}))
    return f"file:{path}"


def _items(n: int, seeds: int = 2) -> list[dict]:
    base = {"model": "tiny-sd15", "lora": None, "negative_prompt": "", "steps": 2, "guidance": 5.0,
            "width": 64, "height": 64, "scheduler": "ddim"}
    return [{"id": f"i{k:04d}", "settings": {**base, "prompt": f"a photo of thing {k}"}, "seeds": list(range(seeds))}
            for k in range(n)]


@pytest.fixture(scope="module")
def worker_calls(moto_server, tmp_path_factory):
    """A job's workers on the host role's keys: two workers share the job, one is stopped as on a
    reclaim notice (its lease released) and a fresh one finishes; each reads the driver's heartbeat."""
    from tests.support.authz import authz_moto_iam
    from sdcloud_agent.batch.lifetime import DriverWatch
    from sdcloud_agent.batch.verify import verify
    from sdcloud_agent.batch.worker import Worker, write_job
    from sdcloud_agent.store import open_store

    tmp_path = tmp_path_factory.mktemp("authz-batch")
    with authz_moto_iam.enforced(moto_server, BUCKET) as keys_for, pytest.MonkeyPatch.context() as monkeypatch:
        user = keys_for(authz_moto_iam.owner_policy(BUCKET))
        host = keys_for(json.dumps(host_policy(BUCKET, PREFIX)))
        as_principal(user[0], "user")
        as_principal(host[0], "batch-worker")
        url = f"s3://{BUCKET}/{PREFIX}/batch"
        cfg = {"url": url, "endpoint_url": moto_server, "region": REGION}
        users = open_store({**cfg, "credentials": _keys_file(tmp_path, "user", *user)})
        calls = record_calls(monkeypatch)
        write_job(users, "j1", {"tier": "batch-sd15"}, _items(8))
        hosts = open_store({**cfg, "credentials": _keys_file(tmp_path, "host", *host)})
        assert not DriverWatch(hosts, "runs/j1", 3600.0, 0.0, clock=lambda: 1.0).unattended()
        slow = Worker(hosts, "j1", FakeGenerator(batch_size=1, delay=5.0), worker_id="w-stopped", ttl=30)
        t = threading.Thread(target=slow.run)
        t.start()
        for _ in range(200):  # until it holds an item's lease (a bounded wait)
            if any(c.operation == "PutObject" and "/leases/" in c.params.get("Key", "") for c in calls if c.ok):
                break
            time.sleep(0.02)
        slow.stop.set()  # a reclaim notice: the item is given back
        t.join(10)
        assert not t.is_alive()
        workers = [Worker(hosts, "j1", FakeGenerator(), worker_id=f"w{n}", ttl=30, idle_wait=0.05, index_every=0.0)
                   for n in range(2)]
        with ThreadPoolExecutor(2) as pool:
            stats = list(pool.map(lambda w: w.run(), workers))
        assert sum(s.items_done for s in stats) == 8 and slow.stats.items_done == 0, stats
        assert verify(users, "j1").ok
        return list(calls), host_policy(BUCKET, PREFIX)


def test_every_call_of_the_batch_workers_is_authorized_by_the_host_role(worker_calls):
    calls, policy = worker_calls
    mine = [c for c in calls if c.principal == "batch-worker"]
    ops = {c.operation for c in mine}
    assert {"PutObject", "GetObject", "HeadObject", "ListObjectsV2"} <= ops, ops
    assert any(c.params.get("IfNoneMatch") == "*" for c in mine), "the create-only writes are among those judged"
    assert any(c.params.get("IfMatch") for c in mine), "the lease's compare-and-swap writes are among those judged"
    # moto (IAM enforced) refused none of them; the misses (a taken lease, an absent marker) are S3's
    # answers after the authorization, judged too (AWS authorizes a HEAD before it says 404).
    assert not [c for c in mine if c.error in ("AccessDenied", "403")], [c for c in mine if not c.ok][:3]
    assert {c.error for c in mine if not c.ok} <= {"PreconditionFailed", "404", "NoSuchKey"}, {c.error for c in mine}
    found = refusals(mine, policy)
    assert not found, "\n".join(found)
    assert {c.principal for c in calls} == {"user", "batch-worker"}, "every call is attributed by its key"


def test_each_grant_the_workers_do_not_need_is_listed_with_what_needs_it(worker_calls):
    calls, policy = worker_calls
    needed = needs([c for c in calls if c.principal == "batch-worker"], policy)
    unlisted = [a for a, n in needed.items() if not n and a not in NOT_FOR_WORKERS]
    wrongly = [a for a in NOT_FOR_WORKERS if needed.get(a)]
    stale = [a for a in NOT_FOR_WORKERS if a not in needed]
    assert not unlisted and not wrongly and not stale, (unlisted, wrongly, stale)
    assert needed["s3:PutObject"] and needed["s3:GetObject"] and needed["s3:ListBucket"]


def test_the_same_workers_are_refused_a_listing_outside_the_prefix(worker_calls):
    """The check can fail: a worker whose store were one level up would list outside the prefix."""
    calls, policy = worker_calls
    from tests.support.authz.authz_record import Call

    outside = [Call("batch-worker", "s3", "ListObjectsV2", {"Bucket": BUCKET, "Prefix": "batch/j1/done/"})]
    [why] = refusals(outside, policy)
    assert "s3:ListBucket" in why and "s3:prefix" in why and "source:" in why, why
