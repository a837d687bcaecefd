"""A throwaway Triton model repository for tests, so generated stage configs never touch the checkout."""

from pathlib import Path

from servelab.paths import MODELS_STAGING
from servelab.triton import server


def make_repository(dest: Path) -> Path:
    """Base configs copied, version folders linked: a repository whose generated files stay here."""
    for model in server.ALL_MODELS:
        (dest / model).mkdir(parents=True)
        (dest / model / "config.pbtxt").write_bytes((MODELS_STAGING / model / "config.pbtxt").read_bytes())
        (dest / model / "1").symlink_to(MODELS_STAGING / model / "1", target_is_directory=True)
    return dest
