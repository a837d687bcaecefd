"""Where things live: the checkout, the bundled photos, generated artifacts and results."""

import subprocess
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


def git(*args: str, root: Path = REPO_ROOT) -> str:
    """``git ARGS``' output in the checkout ``root``; CalledProcessError where git fails."""
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30,
                          check=True).stdout


def checkout(root: Path = REPO_ROOT) -> tuple[str, bool] | None:
    """The checkout's short commit and whether tracked files differ from it; None where git cannot say (a copy
    of the tree without .git)."""
    try:
        return (git("rev-parse", "--short=7", "HEAD", root=root).strip(),
                bool(git("status", "--porcelain", "--untracked-files=no", root=root).strip()))
    except (OSError, subprocess.SubprocessError):
        return None


def recorded_at(record: Path) -> str:
    """The commit a record written here is measured at: HEAD's short commit, "-dirty" where the checkout differs
    from it besides ``record`` itself (which the run that measures writes)."""
    dirty = git("status", "--porcelain", "--", ".", f":!{record.relative_to(REPO_ROOT)}").strip()
    return git("rev-parse", "--short", "HEAD").strip() + ("-dirty" if dirty else "")
