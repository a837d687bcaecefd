"""The client side of ``POST /admin/reload`` (``servelab.servers.fastapi.service``): what a rollout calls."""

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp

from servelab.core.settings import get_settings


class ReloadRefused(RuntimeError):
    """The service refused the reload (model missing or broken, another reload running); the old model still serves."""


def admin_headers(token: str | None = None) -> dict[str, str]:
    """What ``POST /admin/*`` needs: the service's ADMIN_TOKEN as a bearer token (default: this process's own
    ADMIN_TOKEN setting; on the node ``servelab secrets`` wrote it for the service and Jupyter alike)."""
    return {"Authorization": f"Bearer {token or get_settings().admin_token}"}


async def reload(url: str, model_dir: Path | str | None = None, variant: str | None = None,
                 timeout_s: float = 300.0, token: str | None = None) -> dict[str, Any]:
    """Ask the service at ``url`` to swap in the model in ``model_dir`` (else its own folder) as ``variant``
    (fastapi_onnx); returns its ``schemas.Reloaded`` once every server process serves the new version.
    ``token``: the service's ADMIN_TOKEN (default: this process's own ADMIN_TOKEN setting)."""
    body = {key: str(value) for key, value in (("model_dir", model_dir), ("variant", variant)) if value is not None}
    url, headers = url.rstrip("/"), admin_headers(token)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        async with session.post(url + "/admin/reload", json=body, headers=headers) as response:
            answer = await response.json(content_type=None)
            if response.status not in (200, 202):  # 202: the other server processes are being replaced
                raise ReloadRefused(f"HTTP {response.status}: {answer.get('detail', answer)}")
        deadline = time.monotonic() + timeout_s
        while answer["processes"] > 1:  # until no process serves the old model: /ready lists what each serves
            async with session.get(url + "/ready") as response:
                workers = (await response.json(content_type=None)).get("workers") or {}
            if workers.get("versions") == [answer["model_version"]] and workers["ready"] == workers["processes"]:
                break
            if time.monotonic() > deadline:  # uvicorn keeps a process whose replacement does not start
                raise TimeoutError(f"version {answer['model_version']} serves, but after {timeout_s:g} s the server "
                                   f"processes serve {workers.get('versions')}: see the service's log")
            await asyncio.sleep(0.1)
        return answer
