"""What the tests share that is not a test: servers, fakes, fronts, authorization judges and harnesses.

One naming rule, by kind (docs/testing.md, "Layout"): `server_<what>` a real server the tests start
(and `server_http`, the lifecycle every fake server here is built on); `fake_<what>` a stand-in for
something sdcloud meets outside (a cloud's API, the hub, a host's services, a trainer, a network);
`front_<what>` a proxy before the real store that changes what crosses it; `authz_<what>` a call
judged as a cloud authorizes it; `harness_<what>` sdcloud's own pieces run or loaded where production
would (a bare root, emulated hosts, other Pythons, the stacks).

Imported from the repository root as `tests.support.<module>` (the root is on sys.path: pytest's
rootdir, or PYTHONPATH for a helper run as a script)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
SUPPORT = TESTS / "support"
DATA = TESTS / "data"
