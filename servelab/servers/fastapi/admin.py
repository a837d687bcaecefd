"""The client side of ``POST /admin/reload`` (``servelab.servers.fastapi.service``): what a rollout calls."""

from pathlib import Path
from typing import Any

import aiohttp

from servelab.core.settings import get_settings


class ReloadRefused(RuntimeError):
    """The service refused the reload (the model missing or broken, another reload running); it still
    serves the model it had."""


def admin_headers(token: str | None = None) -> dict[str, str]:
    """What ``POST /admin/*`` needs: the service's ADMIN_TOKEN as a bearer token (default: this process's own
    ADMIN_TOKEN setting; on the node ``servelab secrets`` wrote it for the service and Jupyter alike)."""
    return {"Authorization": f"Bearer {token or get_settings().admin_token}"}


async def reload(url: str, model_dir: Path | str | None = None, variant: str | None = None,
                 timeout_s: float = 300.0, token: str | None = None) -> dict[str, Any]:
    """Ask the service at ``url`` to swap in the model in ``model_dir`` (else its own folder) as ``variant``
    (fastapi_onnx); returns its answer once the new version serves (``schemas.Reloaded``: the new and
    previous versions, load and warm-up seconds). ``token``: the service's ADMIN_TOKEN (default: this
    process's own ADMIN_TOKEN setting)."""
    body = {key: str(value) for key, value in (("model_dir", model_dir), ("variant", variant)) if value is not None}
    headers = admin_headers(token)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        async with session.post(url.rstrip("/") + "/admin/reload", json=body, headers=headers) as response:
            answer = await response.json(content_type=None)
            if response.status != 200:
                raise ReloadRefused(f"HTTP {response.status}: {answer.get('detail', answer)}")
            return answer
