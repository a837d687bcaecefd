"""Fixtures for the integration tier: real servers on 127.0.0.1.

``local_triton`` is the tier's one tritonserver (docs/testing.md, "Shared per session"): started once at pt-1
on CPU instances with a scratch model repository, and switched between stages by the tests that use it,
with the same model-control calls `servelab triton stage` makes. A test that needs a server started
differently (other environment variables, a second server for the CLI) starts its own."""

from collections.abc import Iterator

import httpx
import pytest

from servelab.servers.triton import server
from servelab.servers.triton.configs import get_stage
from triton_repo import make_repository


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    """One HTTP client per test module, for the real servers it starts."""
    with httpx.Client(timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def local_triton(artifacts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[server.LocalTriton]:
    repository = make_repository(tmp_path_factory.mktemp("model_repository"))
    log = tmp_path_factory.mktemp("triton") / "tritonserver.log"
    with server.start_local(get_stage("pt-1"), kind="cpu", repository=repository, log=log) as local:
        yield local

