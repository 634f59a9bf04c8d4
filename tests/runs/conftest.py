"""Fixtures for the tests of a run's inputs, checks and records: a captioned dataset folder."""

from tests.support.harness_cli import dataset  # noqa: F401  (a fixture, for every test here)
