"""Real photos and their awkward variants, made from the bundled coffee photo with Pillow."""

import io
import struct
import zlib

import numpy as np
from PIL import Image

from servelab.core.paths import DEFAULT_IMAGE


def _encode(im: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kwargs)
    return buf.getvalue()


def coffee() -> Image.Image:
    return Image.open(DEFAULT_IMAGE).convert("RGB")


def variants() -> dict[str, bytes]:
    """name -> encoded bytes; every one is a valid image that preprocessing must accept."""
    im = coffee()
    rgba = im.copy()
    alpha = Image.linear_gradient("L").resize(im.size)
    rgba.putalpha(alpha)
    rotated = im.transpose(Image.Transpose.ROTATE_90)  # stored sideways, EXIF says rotate back
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 CW to display
    grey16 = Image.fromarray(np.asarray(im.convert("L"), dtype=np.uint16) * 257)
    return {
        "jpeg": DEFAULT_IMAGE.read_bytes(),
        "png": _encode(im, "PNG"),
        "grayscale_jpeg": _encode(im.convert("L"), "JPEG", quality=92),
        "rgba_png": _encode(rgba, "PNG"),
        "cmyk_jpeg": _encode(im.convert("CMYK"), "JPEG", quality=92),
        "exif_rotated_jpeg": _encode(rotated, "JPEG", quality=92, exif=exif),
        "grey16_png": _encode(grey16, "PNG"),
        "palette_gif": _encode(im.convert("P", palette=Image.Palette.ADAPTIVE), "GIF"),
        "webp": _encode(im, "WEBP", quality=90),
    }


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares width x height but carries almost no data (a decompression bomb)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = lambda kind, body: struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 10)) + chunk(b"IEND", b"")
