"""Fixtures for the integration tier: real servers on 127.0.0.1."""

from collections.abc import Iterator

import httpx
import pytest


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    """One HTTP client per test module, for the real servers it starts."""
    with httpx.Client(timeout=60) as c:
        yield c
