"""The external tools the project installs (perf_analyzer, Prometheus, redis-server), for the tests that need them."""

import os
from collections.abc import Callable

import pytest


def located_or_skipped(locate: Callable, not_found: type[Exception], what: str):
    """The tool ``locate()`` finds; outside CI a machine that cannot run it skips with the reason, while CI
    (whose `make test` installs every tool first) fails instead."""
    try:
        return locate()
    except not_found as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"{what} cannot run here: {exc}")
