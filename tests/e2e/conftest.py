"""Fixtures the e2e tier shares: what costs minutes or a server start is paid once per session and only read
by the tests (docs/testing.md, "Shared per session").

- ``quick_lab``: one real ``servelab lab --quick`` (every stage, a few requests each), its folder, printout and
  what it left running; test_lab.py's tests each read a part of it. The process that runs the session starts
  it as soon as the tests are collected (tests/lab_process.py's plugin) and it runs beside the other tests: it
  waits on its servers more than it computes (about a third of a 2-CPU machine), so the session is shorter by
  most of its six minutes.
- ``fastapi_onnx``: one real ``servelab serve fastapi-onnx`` on 127.0.0.1, for the tests that only send it
  requests (GourmetGram in front of it, the Ray walkthrough's stand-in front, the FastAPI notebook).
- ``local_triton``: one real tritonserver (at pt-1, a scratch model repository); a test that needs a stage
  switches it first, as `servelab triton stage` does.
- ``docker_engine`` and ``standin_args``: one private dockerd on the cache's data root, and the stand-in bases built
  on it once, for the container tests and the rehearsal (skipped where no engine can start).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from lab_process import READERS, FinishedLab, quick_lab_folder
from servelab.core.catalogue import STAGES
from servelab.core.procs import ServerProcess, free_port
from servelab.core.settings import get_settings
from servelab.servers.triton import server as triton_server
from servelab.servers.triton.configs import STAGES as TRITON_STAGES
from servelab.tools.containers import compose_tool, standins
from servelab.tools.containers.engine import Engine, EngineState
from servelab.tools.docker_versions import read_env_file
from triton_repo import make_repository


@pytest.fixture(scope="session")
def quick_lab(request: pytest.FixtureRequest) -> FinishedLab:
    if (lab := quick_lab_folder(request.config)) is None:
        pytest.fail(f"no quick lab was started for this session: the tests that read it live in {READERS}")
    try:
        return lab.finish()
    except TimeoutError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="session")
def fastapi_onnx(artifacts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``servelab serve fastapi-onnx`` on 127.0.0.1 with the stage fastapi-onnx's settings; its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("fastapi-onnx") / "fastapi-onnx.log"
    with ServerProcess([sys.executable, "-m", "servelab", "serve", "fastapi-onnx", "--port", str(port)],
                       f"{url}/ready", log, env={"ACCESS_LOG": "0", "MODEL_DIR": str(artifacts.manifest.parent),
                                                 "WORKERS": "1",  # as the node's compose file runs it
                                                 **STAGES["fastapi-onnx"].fastapi.env},
                       ready_timeout=180):
        yield url


@pytest.fixture(scope="session")
def local_triton(artifacts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[triton_server.LocalTriton]:
    """A local tritonserver at pt-1 on CPU instances; a scratch repository, so switching stages leaves no
    generated configs in models_staging/."""
    repository = make_repository(tmp_path_factory.mktemp("model_repository"))
    log = tmp_path_factory.mktemp("triton") / "tritonserver.log"
    with triton_server.start_local(TRITON_STAGES["pt-1"], kind="cpu", repository=repository, log=log) as local:
        yield local



@pytest.fixture(scope="session")
def docker_engine() -> Iterator[EngineState]:
    """A private dockerd on the cache's data root (its layer cache makes a second session quick); CI must have one."""
    if reason := Engine.available():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the container tests: {reason}")
        pytest.skip(f"no Docker engine can be started here: {reason}")
    with Engine(get_settings().servelab_containers_cache) as state:
        yield state


@pytest.fixture(scope="session")
def standin_args(docker_engine: EngineState) -> dict[str, str]:
    """The bake variables that pick the stand-in bases, built once per session (kept by their inputs' key)."""
    cache = get_settings().servelab_containers_cache.expanduser()
    return standins.build_args(compose_tool.docker(docker_engine.env, cache), cache, read_env_file())
