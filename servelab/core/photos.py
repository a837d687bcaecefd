"""Real photographs for calibrating and checking the quantized models, available offline: ~560 small JPEGs cut
from ~140 freely licensed photographs that Debian packages ship (``photos_collect``; ``manifest.json``).

The split is fixed by the hash of the *source photograph*, never by order or a random draw, so the evaluation set
never sees a scene the calibration saw. They are not food: they are the variety of colour and texture that INT8
calibration needs and an agreement check should cover.
"""

import hashlib
import json
from functools import cache

import numpy as np
from pydantic import BaseModel

from servelab.core.paths import DATA_DIR
from servelab.core.preprocess import DEFAULT_CROP, DEFAULT_RESIZE, crop_pixels

PHOTO_DIR = DATA_DIR / "photos"
MANIFEST = "manifest.json"
# One source photograph in CALIBRATION_SHARE goes to calibration, by its hash.
CALIBRATION_SHARE = 5


class Photo(BaseModel):
    file: str
    sha256: str
    package: str
    package_version: str
    path: str
    quadrant: int
    source_sha256: str
    licence: str
    copyright: str

    @property
    def calibration(self) -> bool:
        return int(self.source_sha256[:8], 16) % CALIBRATION_SHARE == 0

    def read_bytes(self) -> bytes:
        data = (PHOTO_DIR / self.file).read_bytes()
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise ValueError(f"{self.file} does not match its sha256 in {MANIFEST}")
        return data


@cache
def all_photos() -> tuple[Photo, ...]:
    return tuple(Photo.model_validate(p) for p in json.loads((PHOTO_DIR / MANIFEST).read_text()))


def calibration_set() -> list[Photo]:
    return [p for p in all_photos() if p.calibration]


def evaluation_set() -> list[Photo]:
    return [p for p in all_photos() if not p.calibration]


def pixels(photos: list[Photo], resize: int = DEFAULT_RESIZE, crop: int = DEFAULT_CROP) -> np.ndarray:
    """uint8 [N, crop, crop, 3]: the center crops the serving pipeline would make (the uint8 models' input)."""
    return np.stack([crop_pixels(p.read_bytes(), resize=resize, crop=crop) for p in photos])


def set_digest(photos: list[Photo]) -> str:
    """One hash for a set of photos, for build keys."""
    return hashlib.sha256("".join(p.sha256 for p in photos).encode()).hexdigest()


def zipf_draws(n: int, draws: int, s: float = 1.0, seed: int = 0) -> np.ndarray:
    """``draws`` indices into ``n`` items the way users ask for photos (the response cache's load): rank k drawn in
    proportion to 1 / k**s, the ranks a seeded permutation (``zipf_ranks``), so the popular are not the first files."""
    if n < 1 or draws < 0 or s < 0:
        raise ValueError(f"zipf_draws needs n >= 1, draws >= 0 and s >= 0 (got n={n}, draws={draws}, s={s})")
    rng = np.random.default_rng(seed)
    ranks = rng.permutation(n)
    weights = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** s
    return ranks[rng.choice(n, size=draws, p=weights / weights.sum())]


def zipf_ranks(n: int, seed: int = 0) -> np.ndarray:
    """The items of ``zipf_draws(n, ..., seed=seed)`` from the most popular to the least."""
    return np.random.default_rng(seed).permutation(n)
