"""Where things live: the checkout, the bundled photos, generated artifacts and results."""

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # servelab/, this file being servelab/core/paths.py
# The checkout root; services and the local lab find models_staging/ and models/ from here.
REPO_ROOT = PACKAGE_DIR.parent
DATA_DIR = PACKAGE_DIR / "data"
DEFAULT_IMAGE = DATA_DIR / "coffee.jpg"
MODELS_STAGING = REPO_ROOT / "models_staging"


def sample_images() -> list[Path]:
    """The real photos shipped with the package (see data/README.md)."""
    return sorted(p for p in DATA_DIR.iterdir() if p.suffix.lower() in {".jpg", ".jpeg", ".png"})
