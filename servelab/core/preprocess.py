"""Encoded image bytes -> the model's input tensor, with Pillow and NumPy only.

The contract (the same in every stage, and the one the model was trained with): decode, apply the EXIF
orientation, convert to RGB, resize the shorter side to ``resize`` (bilinear), center-crop ``crop`` x ``crop``,
scale to [0, 1], normalize with the ImageNet mean/std, and lay out as float32 CHW. A large JPEG may decode at
1/2, 1/4 or 1/8 scale (``_draft_scale``): its tensor differs from a full-size decode's by about what a JPEG
re-encode changes (tests/integration/test_preprocess_draft.py). ``crop_pixels`` stops before the float math,
for models with preprocessing in the graph (uint8 HWC, the layout Pillow decodes to).
"""

import base64
import binascii
import io
from collections.abc import Callable
from functools import cache
from time import perf_counter

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DEFAULT_RESIZE = 256
DEFAULT_CROP = 224
# 40 megapixels: larger than any phone photo, far below what would exhaust memory when decoded.
DEFAULT_MAX_PIXELS = 40_000_000
# Below this a photo holds too little to classify; upscaling a few pixels only invents data.
MIN_SIDE = 16
# A JPEG decodes scaled down to no less than twice the resize target, as Pillow's thumbnail does (its
# reducing_gap): scaled right down to the target, the tensor would differ from a full-size decode's 3x as much.
DRAFT_GAP = 2


class ImageError(ValueError):
    """The input is not a usable image (a client error: HTTP 400)."""


class ImageTooLarge(ImageError):
    """The image declares more pixels than allowed (HTTP 413); it was never decoded."""


def decode_base64(text: str) -> bytes:
    """Strict base64 (an optional ``data:image/...;base64,`` prefix and whitespace are allowed)."""
    if text.startswith("data:") and "," in text:
        text = text.split(",", 1)[1]
    text = "".join(text.split())
    if not text:
        raise ImageError("the image is empty")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageError(f"the image is not valid base64 ({exc})") from None
    if not data:
        raise ImageError("the image is empty")
    return data


def _to_rgb(im: Image.Image) -> Image.Image:
    if im.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        # 16-bit (or 32-bit integer) grey: Pillow's convert() would clip at 255, so rescale; float grey is clipped.
        scale = 257.0 if im.mode.startswith("I;16") or (im.mode == "I" and np.asarray(im).max() > 255) else 1.0
        grey = np.clip(np.asarray(im, dtype=np.float64) / scale, 0, 255).round().astype(np.uint8)
        return Image.fromarray(grey, "L").convert("RGB")
    if im.mode == "P":
        im = im.convert("RGBA" if "transparency" in im.info else "RGB")
    if im.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        # Transparent pixels carry arbitrary colour; show them on white, as a browser would.
        rgba = im.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return im if im.mode == "RGB" else im.convert("RGB")  # convert() would copy an RGB image as it is


def _draft_scale(width: int, height: int, side: int) -> int:
    """The largest s in 8, 4, 2 at which libjpeg may decode a JPEG (it scales while it decodes, each
    pixel standing for an s x s block), else 1. Only where the shorter side stays ``DRAFT_GAP`` x ``side``
    or more, so the bilinear resize after it still downscales by that much; and only where s divides
    both sides, so the scaled pixels tile the image exactly and the crop window stays where it was."""
    return next((s for s in (8, 4, 2)
                 if min(width, height) >= DRAFT_GAP * side * s and width % s == 0 == height % s), 1)


def load_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS, *, draft_side: int | None = None) -> Image.Image:
    """Decode encoded bytes into an upright RGB image, refusing bombs before decoding; with ``draft_side``, a
    JPEG may decode scaled down (``_draft_scale``)."""
    if not data:
        raise ImageError("the image is empty")
    try:
        im = Image.open(io.BytesIO(data))  # reads the header only
    except Image.DecompressionBombError:  # Pillow's own, far larger limit
        raise ImageTooLarge(f"the image declares more than {max_pixels} pixels") from None
    except UnidentifiedImageError:
        raise ImageError("the data is not an image in a format Pillow can read") from None
    except Exception as exc:  # Pillow raises many types for malformed headers
        raise ImageError(f"the image header is corrupt ({type(exc).__name__})") from None
    width, height = im.size
    if width * height > max_pixels:
        raise ImageTooLarge(f"the image declares {width}x{height} pixels, more than the limit of {max_pixels}")
    if min(width, height) < MIN_SIDE:
        raise ImageError(f"the image is {width}x{height}; each side must be at least {MIN_SIDE} pixels")
    try:
        im.seek(0)  # animated images: the first frame
        scale = _draft_scale(width, height, draft_side) if draft_side else 1
        if scale > 1:
            im.draft(None, (width // scale, height // scale))  # the scale only (mode None); a no-op but for JPEG
        im.load()
        ImageOps.exif_transpose(im, in_place=True)  # in place: without an orientation tag, no copy
        return _to_rgb(im)
    except Exception as exc:  # truncated or corrupt pixel data
        raise ImageError(f"the image data is truncated or corrupt ({type(exc).__name__})") from None


def resize_and_crop(im: Image.Image, resize: int = DEFAULT_RESIZE, crop: int = DEFAULT_CROP) -> Image.Image:
    """Resize the shorter side to ``resize`` keeping the aspect ratio, then center-crop. Only the crop window is
    resampled (Pillow's ``box``): a 16 x 2,000,000 strip would otherwise become a 32-gigapixel intermediate."""
    width, height = im.size
    short, long = sorted((width, height))
    new_long = int(resize * long / short)
    size = (resize, new_long) if width <= height else (new_long, resize)
    left, top = (int(round((side - crop) / 2.0)) for side in size)
    sx, sy = width / size[0], height / size[1]
    box = (left * sx, top * sy, (left + crop) * sx, (top + crop) * sy)
    return im.resize((crop, crop), Image.BILINEAR, box=box)


@cache
def _scale_bias(mean: tuple[float, ...], std: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(p / 255 - mean) / std = p * scale + bias, per channel, shaped [C, 1, 1] to broadcast over CHW."""
    mean, std = np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64)
    return (1 / (255 * std)).astype(np.float32)[:, None, None], (-mean / std).astype(np.float32)[:, None, None]


def to_tensor(im: Image.Image | np.ndarray, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> np.ndarray:
    """RGB image (or its uint8 HWC pixels) -> normalized float32 CHW array."""
    pixels = np.asarray(im)
    scale, bias = _scale_bias(tuple(mean), tuple(std))
    # One multiply that reads HWC and writes CHW, one add in place: no float HWC temporaries, no transpose copy.
    x = np.empty((pixels.shape[2], *pixels.shape[:2]), dtype=np.float32)
    np.multiply(pixels.transpose(2, 0, 1), scale, out=x)
    return np.add(x, bias, out=x)


def preprocess_image(
    im: Image.Image, *, resize: int = DEFAULT_RESIZE, crop: int = DEFAULT_CROP, mean=IMAGENET_MEAN, std=IMAGENET_STD
) -> np.ndarray:
    """An upright RGB image (from ``load_image``) -> float32 [3, crop, crop]."""
    return to_tensor(resize_and_crop(im, resize, crop), mean, std)


def crop_pixels(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS, resize: int = DEFAULT_RESIZE,
                crop: int = DEFAULT_CROP) -> np.ndarray:
    """Encoded image bytes -> uint8 [crop, crop, 3] (RGB, HWC): every step but the float math, for
    models that normalize in their graph. Raises ImageError on bad input."""
    return np.asarray(resize_and_crop(load_image(data, max_pixels, draft_side=resize), resize, crop))


def preprocess(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS, resize: int = DEFAULT_RESIZE,
               crop: int = DEFAULT_CROP, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> np.ndarray:
    """Encoded image bytes -> float32 [3, crop, crop]. Raises ImageError on bad input."""
    return to_tensor(crop_pixels(data, max_pixels=max_pixels, resize=resize, crop=crop), mean, std)


def preprocess_batch(images: list[bytes], **kwargs) -> np.ndarray:
    """Several encoded images -> float32 [N, 3, crop, crop]."""
    return np.stack([preprocess(data, **kwargs) for data in images])


def prepare_timed(text: str, step: Callable[..., np.ndarray] = preprocess, **kwargs) -> tuple[np.ndarray, float, float]:
    """base64 text -> (``step``'s output: ``preprocess`` or ``crop_pixels``, when it started, when it ended): a
    request's whole CPU side in one picklable call, the same in a thread or a worker process (``perf_counter``
    is the system's monotonic clock, comparable across processes)."""
    started = perf_counter()
    return step(decode_base64(text), **kwargs), started, perf_counter()
