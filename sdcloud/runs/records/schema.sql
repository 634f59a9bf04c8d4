-- The tables of state.db ($SDCLOUD_HOME/state.db), created at every open (runs/records/state.py).
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    name TEXT,
    tier TEXT NOT NULL,
    state TEXT NOT NULL,            -- pending, launching, running, recovering, succeeded, failed, stopped, cancelled
    spec TEXT NOT NULL,             -- JSON: the run's settings (never secrets); a batch job's has kind "batch"
    step INTEGER NOT NULL DEFAULT 0,
    total_steps INTEGER NOT NULL DEFAULT 0,
    reason TEXT,
    controller_pid INTEGER,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS attempts (
    run_id TEXT NOT NULL REFERENCES runs(id),
    n INTEGER NOT NULL,
    provider TEXT NOT NULL,
    region TEXT,
    zone TEXT,
    instance_type TEXT,
    market TEXT,
    price REAL,                     -- USD per hour
    currency TEXT,
    instance_id TEXT,
    token TEXT NOT NULL,
    state TEXT NOT NULL,            -- launching, running, terminating, ended
    start REAL,
    end REAL,
    end_reason TEXT,                -- succeeded, preempted, failed, stopped, budget, launch-failed, lost
    PRIMARY KEY (run_id, n)
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS price_samples (
    provider TEXT NOT NULL,
    region TEXT NOT NULL,
    zone TEXT NOT NULL,
    instance_type TEXT NOT NULL,
    market TEXT NOT NULL,
    time REAL NOT NULL,
    price REAL NOT NULL,
    currency TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS zone_cooldowns (
    key TEXT PRIMARY KEY,           -- provider/region/zone/instance_type
    until REAL NOT NULL,            -- unix seconds: no spot launch there before this
    reason TEXT NOT NULL,           -- preempted, lost, capacity
    run_id TEXT,                    -- the run (or job) that saw it
    time REAL NOT NULL
);
-- Cost ledger (sdcloud/costs/ledger.py). What each attempt was launched at and did, as billing needs it.
CREATE TABLE IF NOT EXISTS attempt_costs (
    run_id TEXT NOT NULL,
    n INTEGER NOT NULL,
    currency TEXT,                  -- the provider's billing currency for this attempt
    quote_price REAL,               -- per hour, in `currency`, at launch
    ondemand_price REAL,            -- the list price per hour of the same type, in `currency`
    disk_gb REAL,
    first_step_at REAL,             -- when the host first reported a training step
    start_step INTEGER,             -- the step it resumed from
    last_step INTEGER,
    last_step_at REAL,
    it_per_s REAL,
    bucket_bytes INTEGER,           -- bytes under the run's prefix when the attempt ended
    bucket_objects INTEGER,
    last_sample REAL,               -- when the spot price was last sampled
    PRIMARY KEY (run_id, n)
);
-- One row per priced item of an attempt (n = 0: the run's own items, e.g. egress).
CREATE TABLE IF NOT EXISTS ledger (
    run_id TEXT NOT NULL,
    n INTEGER NOT NULL,
    item TEXT NOT NULL,             -- compute, disk, bucket, requests, egress
    amount REAL NOT NULL,
    currency TEXT NOT NULL,
    usd REAL NOT NULL,
    source TEXT NOT NULL,           -- price-history, samples, quote, list, estimate, rule
    detail TEXT NOT NULL,           -- JSON: the quantities the amount was computed from
    PRIMARY KEY (run_id, n, item)
);
-- What the cloud's billing says a run cost (sdcloud cost reconcile).
CREATE TABLE IF NOT EXISTS billed (
    run_id TEXT NOT NULL,
    provider TEXT NOT NULL,
    amount REAL NOT NULL,
    currency TEXT NOT NULL,
    usd REAL NOT NULL,
    source TEXT NOT NULL,
    fetched REAL NOT NULL,
    PRIMARY KEY (run_id, provider)
);
-- Rates and start-up times a user recorded (sdcloud speeds add) or an attempt observed (sdcloud/speeds).
-- A table of its own, created where missing: a state.db from before it opens as it was, with none.
CREATE TABLE IF NOT EXISTS speeds (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    origin TEXT NOT NULL,           -- recorded or observed
    provider TEXT NOT NULL DEFAULT '',       -- '' : any provider
    instance_type TEXT NOT NULL DEFAULT '',  -- '' : any host of the GPU
    gpu TEXT NOT NULL,
    gpu_count INTEGER NOT NULL DEFAULT 1,    -- GPUs the trainer drove
    tier TEXT NOT NULL,
    trainer TEXT NOT NULL DEFAULT '',        -- '' : any trainer
    recipe TEXT NOT NULL DEFAULT '',         -- '' : the tier's own model; else the model that ran
    zone TEXT NOT NULL DEFAULT '',
    market TEXT NOT NULL DEFAULT '',
    rate REAL,                      -- steady steps/s (images/s) after warm-up
    first_step_s REAL,              -- launch to the first step
    phases TEXT,                    -- JSON: the host's boot phases and their seconds
    restart_s REAL,                 -- after a reclaim: launch to the first step again
    hours REAL,                     -- the attempt's hours (reclaims per hour in its zone)
    reclaimed INTEGER NOT NULL DEFAULT 0,
    run_id TEXT,
    n INTEGER,
    note TEXT NOT NULL DEFAULT '',
    time REAL NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS speeds_attempt ON speeds (run_id, n);
-- The newest record of each run this state.db read from or wrote to its bucket (runs/records/journal.py: seen).
CREATE TABLE IF NOT EXISTS journal_seen (run_id TEXT PRIMARY KEY, seq INTEGER NOT NULL, written_by TEXT NOT NULL, time REAL);
CREATE TABLE IF NOT EXISTS infra (
    provider TEXT NOT NULL,
    region TEXT NOT NULL,
    outputs TEXT NOT NULL,
    updated REAL NOT NULL,
    PRIMARY KEY (provider, region)
);
