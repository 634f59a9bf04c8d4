"""A batch worker host: the agent config's "batch" section, a reclaim-notice watcher, one Worker.

The cloud's reclaim notice (or SIGTERM) sets the worker's stop flag: the current batch is
abandoned at the next denoising step, the lease released, and the process exits 0.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from typing import Any

from ..store import open_store
from ..clouds import make_watcher
from ..watchers import WatchThread
from .lifetime import DriverWatch, Lifetime
from .worker import Worker


def run_host(config_path: str) -> int:
    with open(config_path, encoding="utf-8") as f:
        conf: dict[str, Any] = json.load(f)
    b = conf["batch"]
    store = open_store(conf["store"])
    job = json.loads(store.get(f"{b['job']}/job.json"))
    from .__main__ import make_generator, prepare_job

    if b.get("generator", "diffusers") != "fake":
        job = prepare_job(store, job)
    gen = make_generator(b.get("generator", "diffusers"), job,
                         argparse.Namespace(fake_delay=float(b.get("fake_delay", 0.0)), compile=bool(b.get("compile")),
                                            vae_tiling=bool(b.get("vae_tiling"))))

    def log(msg: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)
    w = Worker(store, b["job"], gen, worker_id=b.get("worker_id") or f"{conf.get('run_id')}-a{conf.get('attempt')}",
               ttl=float(b.get("ttl", 60.0)), log=log)
    signal.signal(signal.SIGTERM, lambda *_: w.stop.set())
    from ..selfend import SelfEnd, finish

    se = SelfEnd.from_dict(conf.get("self_end"))
    run_prefix = f"runs/{conf.get('run_id')}"
    driver = DriverWatch(store, run_prefix, se.unattended_after_s, time.time())
    # The lifetime cap and the driver's attendance (lifetime.py), on a cloud host only.
    life = Lifetime(se, driver, w.stop, time.time(), log=log).start() if se.provider != "none" else None
    watcher = make_watcher(conf.get("metadata"))
    watch = None
    if watcher:
        def on_notice(notice: Any) -> None:
            log(f"reclaim notice: {notice}; abandoning the current batch")
            w.stop.set()
        watch = WatchThread(watcher, on_notice, float(conf.get("poll_seconds", 2))).start()
    try:
        stats = w.run()
    finally:
        if watch:
            watch.stop()
        if life:
            life.close()
    print(json.dumps({"worker": w.worker_id, **stats.__dict__}), flush=True)
    # Its work is over: after the grace for the job's driver (none when the job has no driver, or at
    # the cap), the host ends itself (selfend.py).
    if se.provider != "none":
        reason = (life.reason if life else None) or "batch worker done"
        finish(se, None, run_prefix, int(conf.get("attempt", 1)), reason, attendance=driver,
               grace=life is None or life.reason is None)
    return 0
