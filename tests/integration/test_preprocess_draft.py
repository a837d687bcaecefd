"""``preprocess`` lets a large JPEG decode scaled down (``servelab.core.preprocess.DRAFT_GAP``): the
bundled model's top-1 class against a full-size decode's, on the bundled photos (too small to be
scaled: the same tensors) and on large JPEGs made from them, where the scaled decode engages."""

import io

import numpy as np
from PIL import Image

from servelab.core.artifacts import load_manifest
from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.photos import PHOTO_DIR
from servelab.core.postprocess import softmax
from servelab.core.preprocess import load_image, preprocess, resize_and_crop, to_tensor
from servelab.core.variants.build import session

# Top two classes closer than this are a coin toss: the scaled decode moves the probabilities about as far
# as re-encoding the JPEG at quality 90 instead of 95 does (at most 0.04 on these photos), enough to swap them.
NEAR_TIE = 0.05
MAX_SHIFT = 0.1  # how far any class's probability may move


def full_size(data: bytes, manifest) -> np.ndarray:
    """The reference: preprocess as it was before the scaled decode, every pixel decoded, then resized."""
    return to_tensor(resize_and_crop(load_image(data), manifest.resize, manifest.crop), manifest.mean, manifest.std)


def probabilities(model, tensors: list[np.ndarray]) -> np.ndarray:
    sess = session(model.onnx)
    name = sess.get_inputs()[0].name
    x = np.stack(tensors)
    return softmax(np.concatenate([sess.run(None, {name: x[i:i + 32]})[0] for i in range(0, len(x), 32)]))


def upscaled(path, size: tuple[int, int]) -> bytes:
    buf = io.BytesIO()
    Image.open(path).convert("RGB").resize(size, Image.BICUBIC).save(buf, "JPEG", quality=95)
    return buf.getvalue()


def test_the_bundled_photos_keep_their_tensors_and_top1(model):
    m = load_manifest(model.manifest)
    images = [p.read_bytes() for p in [*sorted(PHOTO_DIR.glob("*.jpg")), DEFAULT_IMAGE]]
    ours = [preprocess(data, **m.preprocess_kwargs()) for data in images]
    reference = [full_size(data, m) for data in images]
    assert max(np.abs(a - b).max() for a, b in zip(ours, reference)) <= 1e-5
    assert (probabilities(model, ours).argmax(1) == probabilities(model, reference).argmax(1)).all()


def test_large_jpegs_decoded_scaled_keep_their_top1(model):
    """One quadrant of each photograph at 4x (decoded at 1/2), one at 8x (1/4), coffee.jpg at 4x and
    at 6144x4096 (1/8)."""
    m = load_manifest(model.manifest)
    quadrants = sorted(PHOTO_DIR.glob("*-q0.jpg"))  # 256 on the shorter side
    sizes = {p: tuple(side * (8 if p == quadrants[0] else 4) for side in Image.open(p).size) for p in quadrants}
    images = {f"{p.name} at {w}x{h}": upscaled(p, (w, h)) for p, (w, h) in sizes.items()}
    images |= {f"coffee.jpg at {w}x{h}": upscaled(DEFAULT_IMAGE, (w, h)) for w, h in [(2400, 1600), (6144, 4096)]}
    for name, data in images.items():
        assert load_image(data, draft_side=m.resize).width < Image.open(io.BytesIO(data)).width, name

    ours = probabilities(model, [preprocess(data, **m.preprocess_kwargs()) for data in images.values()])
    reference = probabilities(model, [full_size(data, m) for data in images.values()])
    ranked = np.sort(reference, axis=1)
    clear = ranked[:, -1] - ranked[:, -2] >= NEAR_TIE
    changed = [name for name, a, b in zip(images, ours.argmax(1), reference.argmax(1)) if a != b]
    assert not [name for name, c in zip(images, clear) if c and name in changed], changed
    assert len(changed) <= 0.02 * len(images), changed
    assert np.abs(ours - reference).max() <= MAX_SHIFT
