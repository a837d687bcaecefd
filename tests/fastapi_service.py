"""The FastAPI stages as real uvicorn processes on 127.0.0.1, for tests/test_fastapi_*.py."""

import asyncio
import base64
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from servelab.core.artifacts import ArtifactPaths
from servelab.core.paths import REPO_ROOT
from servelab.core.procs import ServerProcess, free_port

APPS = {"pytorch": "fastapi_pt.app:app", "onnx": "fastapi_onnx.app:app"}


def admin() -> dict[str, str]:
    """The headers ``POST /admin/*`` needs on the session's servers (tests/conftest.py sets ADMIN_TOKEN)."""
    return {"Authorization": f"Bearer {os.environ['ADMIN_TOKEN']}"}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@contextmanager
def serving(kind: str, artifacts: ArtifactPaths, log_dir: Path, **env: object) -> Iterator[tuple[ServerProcess, str]]:
    """Start ``uvicorn <stage>.app:app`` (settings from ``env``); yield it and its base URL; always stop it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "uvicorn", APPS[kind], "--host", "127.0.0.1", "--port", str(port), "--no-access-log"]
    variables = {"MODEL_DIR": str(artifacts.manifest.parent), **{k.upper(): str(v) for k, v in env.items()}}
    with ServerProcess(cmd, f"{url}/ready", log_dir / f"{kind}-{port}.log", env=variables, cwd=REPO_ROOT) as server:
        yield server, url


@contextmanager
def running(kind: str, artifacts: ArtifactPaths, log_dir: Path, **env: object) -> Iterator[str]:
    """``serving``, for tests that need only the URL."""
    with serving(kind, artifacts, log_dir, **env) as (_, url):
        yield url


def predict(client: httpx.Client, url: str, data: bytes) -> dict:
    response = client.post(f"{url}/predict", json={"image": b64(data)})
    assert response.status_code == 200, response.text
    return response.json()


async def predict_concurrently(url: str, images: list[bytes], concurrency: int) -> list[httpx.Response]:
    """POST each image to /predict with ``concurrency`` requests in flight over persistent connections."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    slots = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        async def one(data: bytes) -> httpx.Response:
            async with slots:
                return await client.post(f"{url}/predict", json={"image": b64(data)})

        return await asyncio.gather(*(one(data) for data in images))


def metric_samples(text: str, name: str) -> dict[str, float]:
    """Prometheus text -> {label string: value} for one sample name."""
    samples = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, _, value = line.rpartition(" ")
            samples[key.removeprefix(name)] = float(value)
    return samples
