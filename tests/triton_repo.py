"""Triton model repositories for tests, so neither the weights nor generated stage configs ever touch
the checkout's models_staging/ (which holds the model the user built)."""

import shutil
from pathlib import Path

from servelab.core.paths import MODELS_STAGING
from servelab.core.settings import get_settings
from servelab.servers.triton import server


def copy_sources(dest: Path) -> Path:
    """The checkout's base configs and Python models, without its weights or generated configs."""
    for model in server.ALL_MODELS:
        (dest / model / "1").mkdir(parents=True)
        shutil.copy2(MODELS_STAGING / model / "config.pbtxt", dest / model)
        for source in (MODELS_STAGING / model / "1").glob("*.py"):
            shutil.copy2(source, dest / model / "1")
    return dest


def make_repository(dest: Path) -> Path:
    """The session's repository (TRITON_MODEL_REPOSITORY) with its own configs: base configs copied,
    version folders linked, so one module's stage configs never reach another's server."""
    session = get_settings().triton_model_repository
    for model in server.ALL_MODELS:
        (dest / model).mkdir(parents=True)
        shutil.copy2(session / model / "config.pbtxt", dest / model)
        (dest / model / "1").symlink_to(session / model / "1", target_is_directory=True)
    return dest
