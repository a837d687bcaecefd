"""The compose files' generated secrets (their ``env_file``), written once per checkout by ``servelab secrets``.

``ADMIN_TOKEN`` guards fastapi_server's ``/admin/*`` routes (Jupyter's rollback cell sends it); Grafana's admin
password is never its default. .secrets/ is git-ignored, outside every build context and its owner's only. A
file that exists is kept, as a running container keeps its token; nothing here prints a secret.
"""

import os
import secrets
from pathlib import Path

from servelab.core.paths import REPO_ROOT
from servelab.tools.docker_versions import read_env_file as read  # `NAME=value` lines, as Compose reads them

SECRETS_DIR = REPO_ROOT / ".secrets"
# file -> the variable it defines.
FILES = {"lab.env": "ADMIN_TOKEN", "grafana.env": "GF_SECURITY_ADMIN_PASSWORD"}
TOKEN_BYTES = 32  # 256 bits, URL-safe text of 43 characters


def write(folder: Path = SECRETS_DIR, rotate: bool = False) -> dict[str, str]:
    """Write each missing (or, with ``rotate``, every) secret file; return file -> "written" or "kept"."""
    folder.mkdir(mode=0o700, exist_ok=True)
    folder.chmod(0o700)
    done = {}
    for name, variable in FILES.items():
        path = folder / name
        if path.exists() and not rotate and read(path).get(variable):
            done[name] = "kept"
            continue
        # Created with mode 0600 before a byte is written: never readable by others, not even for a moment.
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
            out.write(f"# Written by `servelab secrets`; never commit or print it (docs/security.md).\n"
                      f"{variable}={secrets.token_urlsafe(TOKEN_BYTES)}\n")
        path.chmod(0o600)
        done[name] = "written"
    return done
