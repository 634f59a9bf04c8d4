"""Runs a module as `python -m` would, with every AWS call the process makes recorded as one
principal's: `python -m tests.support.authz.authz_run <log dir> <principal> <module> [args...]` (from the
repository root, or with it on PYTHONPATH). Started with `-m`, the module it runs gets the path
`python -m` gives it (the working folder first), not the tests' folder.

A host agent is its own process on its own machine: every call it makes (its s3transfer threads'
included) is the host role's. The calls go to <log dir>/calls-<principal>-<pid>.jsonl
(tests/support/authz/authz_record.py), for the test that started the process to judge against the role's policy.
"""

from __future__ import annotations

import os
import runpy
import sys

from tests.support.authz.authz_record import authz_log, install


def main() -> None:
    directory, principal, module, *args = sys.argv[1:]
    install(authz_log(directory, f"{principal}-{os.getpid()}"), lambda obj, name, value: setattr(obj, name, value),
            principal=principal)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
