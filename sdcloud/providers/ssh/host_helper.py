"""The host side of the SSH provider: one operation per run, JSON in on stdin, JSON out on stdout.

This file is not imported by sdcloud: provider.py reads it as text (a package resource) and runs it
on the user's box with the box's own Python (3.6+; Linux /proc), one SSH exec per operation. So it
uses no f-strings with `=`, no walrus, no type hints, and nothing from sdcloud; a file lock keeps
two controllers from starting two agents on one host.
"""
import base64, fcntl, json, os, signal, subprocess, sys, time

def stat(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError, ValueError):
        return None
    return rest  # rest[0] state, rest[1] ppid, rest[19] start time

def present(pid, start=None):
    """The process exists and has not exited (a zombie has), whatever it runs."""
    st = stat(pid)
    return st is not None and st[0] not in ("Z", "X") and not (start and st[19] != start)

def alive(pid, start=None):
    st = stat(pid)
    if st is None or st[0] in ("Z", "X") or (start and st[19] != start):
        return False
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return b"sdcloud_agent" in f.read()
    except OSError:
        return False

def table():
    out = {}
    for e in os.listdir("/proc"):
        if e.isdigit():
            st = stat(int(e))
            if st is not None and st[0] not in ("Z", "X"):
                out[int(e)] = (int(st[1]), st[19])
    return out

def descendants(pid, procs):
    found, todo = {}, [pid]
    while todo:
        p = todo.pop()
        for c, (ppid, start) in procs.items():
            if ppid == p and c not in found:
                found[c] = start
                todo.append(c)
    return found

def records(wd):
    out = []
    if not os.path.isdir(wd):
        return out
    for tok in sorted(os.listdir(wd)):
        p = os.path.join(wd, tok, "instance.json")
        try:
            with open(p) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            continue
        rec["alive"] = not rec.get("ended") and alive(rec["pid"], rec.get("start"))
        out.append(rec)
    return out

def write_json(path, obj, mode=0o600):
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)

def main():
    req = json.loads(sys.stdin.read())
    wd = os.path.abspath(os.path.expanduser(req["workdir"]))
    op = req["op"]
    if op == "scan":
        return {"workdir": wd, "records": records(wd)}
    if op == "tail":
        path = os.path.join(wd, req["token"], "agent.log")
        try:
            with open(path, "rb") as f:
                f.seek(req["offset"])
                data = f.read(req["limit"])
        except OSError:
            data = b""
        return {"text": data.decode("utf-8", "replace"), "offset": req["offset"] + len(data)}
    if op == "start":
        os.makedirs(wd, 0o700, exist_ok=True)
        lock = open(os.path.join(wd, ".lock"), "a")
        fcntl.flock(lock, fcntl.LOCK_EX)  # one start at a time on this host
        for rec in records(wd):
            if rec["alive"]:
                return {"adopted": rec} if rec["token"] == req["token"] else {"busy": rec}
        tdir = os.path.join(wd, req["token"])
        os.makedirs(tdir, 0o700, exist_ok=True)
        zpath = os.path.join(tdir, req.get("wheel_name") or "agent.zip")
        with open(zpath + ".tmp", "wb") as f:
            f.write(base64.b64decode(req["zip"]))
        os.replace(zpath + ".tmp", zpath)
        cfg = req["config"]
        cfg.setdefault("workdir", os.path.join(tdir, "work"))
        if req.get("credentials"):
            # Short-lived keys for the store: a 0600 file the agent re-reads, never its config or argv.
            cpath = os.path.join(tdir, "store-credentials.json")
            write_json(cpath, req["credentials"])
            cfg["store"] = dict(cfg["store"], credentials="file:" + cpath)
        write_json(os.path.join(tdir, "cfg.json"), cfg)
        env = dict(os.environ)
        env["PYTHONPATH"] = zpath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        argv = [sys.executable] + (req.get("argv") or ["-m", "sdcloud_agent", "run", "--config", "cfg.json"])
        logf = open(os.path.join(tdir, "agent.log"), "ab")
        # Its own session (setsid): survives the SSH channel, and terminate can signal its group.
        proc = subprocess.Popen(argv, cwd=tdir, env=env, stdin=subprocess.DEVNULL, stdout=logf,
                                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        st = stat(proc.pid)
        rec = {"token": req["token"], "pid": proc.pid, "start": st[19] if st else None, "tags": req["tags"],
               "market": req["market"], "price_per_hour": req["price_per_hour"], "created": time.time(),
               "dir": tdir}
        write_json(os.path.join(tdir, "instance.json"), rec)
        time.sleep(req["check_seconds"])
        code = proc.poll()
        if code is not None:
            rec["ended"] = time.time()
            write_json(os.path.join(tdir, "instance.json"), rec)
            with open(os.path.join(tdir, "agent.log"), "rb") as f:
                f.seek(max(0, os.path.getsize(f.name) - 2000))
                tail = f.read().decode("utf-8", "replace")
            return {"exited": code, "log": tail, "dir": tdir}
        rec["alive"] = True
        return {"started": rec}
    if op == "credentials":
        for r in records(wd):
            if r["pid"] == req["pid"] and r["alive"]:
                write_json(os.path.join(wd, r["token"], "store-credentials.json"), req["credentials"])
                return {"renewed": r["pid"]}
        return {"gone": req["pid"]}
    if op == "terminate":
        want = set(req["pids"])
        recs = [r for r in records(wd) if r["pid"] in want and r["alive"]]
        procs = table()
        kids = {}
        for r in recs:
            kids.update(descendants(r["pid"], procs))
            try:
                os.killpg(r["pid"], signal.SIGTERM)  # the agent saves a checkpoint on SIGTERM
            except OSError:
                pass
        deadline = time.time() + req["grace"]
        while time.time() < deadline and any(alive(r["pid"], r.get("start")) for r in recs):
            procs = table()
            for r in recs:
                kids.update(descendants(r["pid"], procs))
            time.sleep(0.2)
        killed = []
        for r in recs:
            if alive(r["pid"], r.get("start")):
                killed.append(r["pid"])
                try:
                    os.killpg(r["pid"], signal.SIGKILL)
                except OSError:
                    pass
        # The trainer runs in a session of its own: kill what the agent left behind.
        procs = table()
        for pid, start in kids.items():
            if pid in procs and procs[pid][1] == start:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        # SIGKILL takes effect when the process next runs, which on a busy host can be after this
        # answer: wait (10 s at most) until each is gone, so that "terminated" means gone.
        pending = [(r["pid"], r.get("start")) for r in recs] + list(kids.items())
        gone_by = time.time() + 10
        while time.time() < gone_by and any(present(pid, start) for pid, start in pending):
            time.sleep(0.05)
        for r in records(wd):
            if r["pid"] in want and not r.get("ended"):
                r.pop("alive", None)
                r["ended"] = time.time()
                write_json(os.path.join(wd, r["token"], "instance.json"), r)
            if r["pid"] in want:
                try:  # the keys die with the attempt
                    os.unlink(os.path.join(wd, r["token"], "store-credentials.json"))
                except OSError:
                    pass
        return {"terminated": [r["pid"] for r in recs], "killed": killed}
    raise SystemExit("unknown op " + op)

if __name__ == "__main__":  # run with `python -c "exec(...)"` on the host; importing it does nothing
    sys.stdout.write(json.dumps(main()))
