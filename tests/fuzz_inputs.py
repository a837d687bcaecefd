"""Malformed inputs for every route (tests/integration/test_fuzz.py): ONE list, ``CASES``, reused per route.

Each case is one of three kinds, which a route wraps in its own envelope:

* ``image``: bytes where an encoded photo belongs (0 bytes, truncated JPEG and PNG, a decompression
  bomb, a JPEG whose header claims 60,000 x 60,000, other formats' headers, text, random bytes...).
  FastAPI's ``/predict`` gets ``{"image": base64(bytes)}``, ``/predict/batch`` ``{"images": [...]}``,
  GourmetGram the uploaded file, Triton's Python-backend model its ``INPUT_IMAGE`` element; where a path
  belongs (``/admin/reload``'s ``model_dir``) the bytes as text.
* ``value``: a JSON value, as JSON text, where the route's field belongs (wrong types, empty, invalid
  base64, base64 of non-images, NUL, huge numbers, deep nesting): ``{"<field>": value}``, GourmetGram's
  form field, Triton's ``data``.
* ``raw``: a whole request body and its Content-Type (truncated and invalid JSON, deeply nested JSON,
  non-UTF-8, wrong content types, an oversized body, sent in chunks or with a length).

Every one is malformed for every route: the answer must be a 4xx with a reason, never a 5xx.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import random
import struct
import zlib
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from PIL import Image

from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.settings import Settings

Kind = Literal["image", "value", "raw"]
JSON = "application/json"


@dataclass(frozen=True)
class Case:
    name: str
    kind: Kind
    data: Any  # image: bytes; value: JSON text; raw: the body's bytes
    content_type: str = JSON  # raw only
    chunked: bool = False  # raw only: sent without a Content-Length, in pieces

    def __repr__(self) -> str:  # pytest ids and failure messages: the name, never megabytes
        return self.name


def _encoded(fmt: str, size: tuple[int, int] = (64, 48), mode: str = "RGB", **params) -> bytes:
    with Image.open(DEFAULT_IMAGE) as im:
        small = im.convert(mode).resize(size)
    buf = io.BytesIO()
    small.save(buf, fmt, **params)
    return buf.getvalue()


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _png(width: int, height: int, idat: bytes, bit_depth: int = 8, colour: int = 0) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")


def png_bomb(side: int = 20_000) -> bytes:
    """A valid grey PNG of side x side pixels (400 megapixels by default) in a few hundred kB: zeros compress."""
    row = b"\x00" * (side + 1)  # filter byte + pixels
    packer = zlib.compressobj(9)
    idat = b"".join(packer.compress(row) for _ in range(side)) + packer.flush()
    return _png(side, side, idat)


def _jpeg_claiming(width: int, height: int, keep: int | None = None) -> bytes:
    """A real JPEG whose frame header (SOF0) says width x height; ``keep``: only its first bytes."""
    data = bytearray(_encoded("JPEG", quality=80))
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", height, width)
    return bytes(data[:keep] if keep else data)


@cache
def image_cases() -> list[Case]:
    jpeg, png = _encoded("JPEG", quality=85), _encoded("PNG")
    gif, webp, bmp = _encoded("GIF"), _encoded("WEBP"), _encoded("BMP")
    tiff = _encoded("TIFF")
    corrupt_scan = bytearray(jpeg)
    corrupt_scan[len(jpeg) // 3: len(jpeg) // 3 + 200] = b"\xff" * 200
    bad_crc = bytearray(png)
    bad_crc[29] ^= 0xFF  # IHDR's CRC
    rng = random.Random(45)  # the same bytes every run
    bad_zlib = _png(64, 48, b"\x78\x9c" + rng.randbytes(64))
    cases = {
        "empty file": b"",
        "jpeg, first 10 bytes": jpeg[:10],
        "jpeg, first half": jpeg[: len(jpeg) // 2],
        "jpeg, all but the last 100 bytes": jpeg[:-100],
        "jpeg, markers only (SOI + APP0)": jpeg[:20],
        "jpeg, scan data overwritten": bytes(corrupt_scan),
        "jpeg header claiming 60000x60000": _jpeg_claiming(60_000, 60_000),
        "jpeg header claiming 60000x60000, truncated": _jpeg_claiming(60_000, 60_000, keep=400),
        "jpeg header claiming 0x0": _jpeg_claiming(0, 0),
        "jpeg header claiming 65535x1": _jpeg_claiming(65_535, 1),
        "png, signature only": png[:8],
        "png, first half": png[: len(png) // 2],
        "png, IHDR with a bad CRC": bytes(bad_crc),
        "png, corrupt zlib stream": bad_zlib,
        "png bomb: 400 megapixels in a small file": png_bomb(),
        "png claiming 0x0": _png(0, 0, zlib.compress(b"")),
        "png claiming 2^31-1 x 2^31-1": _png(2**31 - 1, 2**31 - 1, zlib.compress(b"\x00" * 64)),
        "png 1x1 (too small to classify)": _encoded("PNG", (1, 1)),
        "png 8x4000 strip (a side under 16)": _encoded("PNG", (8, 4000), "L"),
        "png 16-bit, truncated": _encoded("PNG", (64, 48), "I;16")[:60],
        "gif header only": b"GIF89a",
        "gif, first half": gif[: len(gif) // 2],
        "gif claiming 65535x65535": b"GIF89a" + struct.pack("<HH", 65_535, 65_535) + gif[10:],
        "webp, first half": webp[: len(webp) // 2],
        "webp, RIFF header only": webp[:12],
        "bmp, first half": bmp[: len(bmp) // 2],
        "bmp claiming 60000x60000": bmp[:18] + struct.pack("<ii", 60_000, 60_000) + bmp[26:],
        "bmp with 0 bits per pixel": bmp[:28] + struct.pack("<H", 0) + bmp[30:],
        "tiff, first 64 bytes": tiff[:64],
        "tiff, first half": tiff[: len(tiff) // 2],
        "ppm header claiming 60000x60000": b"P6 60000 60000 255\n" + b"\x00" * 64,
        "ppm, truncated pixels": b"P6 100 100 255\n" + b"\x7f" * 300,
        "plain text": b"this is not a photo of food",
        "html page": b"<!doctype html><html><body><img src=x onerror=alert(1)></body></html>",
        "svg image": b'<svg xmlns="http://www.w3.org/2000/svg" width="60000" height="60000"/>',
        "pdf header": b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<<>>\nendobj\n",
        "zip archive": b"PK\x03\x04" + bytes(26) + b"photo.jpg" + jpeg[:100],
        "gzip of a jpeg": gzip.compress(jpeg),
        "elf executable header": b"\x7fELF\x02\x01\x01" + bytes(57),
        "4 kB of zero bytes": bytes(4096),
        "4 kB of random bytes": rng.randbytes(4096),
        "base64 text of a jpeg (encoded twice)": base64.b64encode(jpeg),
        "a json document": json.dumps({"image": "x"}).encode(),
        "jpeg SOI then png": jpeg[:2] + png,
    }
    return [Case(name, "image", data) for name, data in cases.items()]


@cache
def value_cases() -> list[Case]:
    """``data``: the value as JSON text, to put where the route's field goes (json.dumps cannot write 5,000 levels)."""
    values = {
        "an integer": 5,
        "a float": 3.14,
        "null": None,
        "true": True,
        "an empty list": [],
        "an empty object": {},
        "a list of integers": [1, 2, 3],
        "an empty string": "",
        "whitespace only": " \n\t ",
        "not base64": "!!! not base64 !!!",
        "base64 with bad padding": "abc",
        "base64 of text": base64.b64encode(b"hello, this is text").decode(),
        "base64 of a single zero byte": "AA==",
        "a data: URL with nothing after it": "data:image/png;base64,",
        "a data: URL with junk": "data:image/jpeg;base64,@@@@",
        "a NUL character": "\x00",
        "non-ASCII text": "寿司の写真",
        "a lone surrogate": "\ud800",
        "a huge integer": 10**400,
        "a huge negative integer": -(10**400),
        "100 kB of non-base64": "%" * 100_000,
    }
    texts = {name: json.dumps(value) for name, value in values.items()}
    texts["an object 5000 levels deep"] = '{"a": ' * 5_000 + '"x"' + "}" * 5_000
    texts["a list 5000 levels deep"] = "[" * 5_000 + "]" * 5_000
    return [Case(name, "value", text) for name, text in texts.items()]


def with_field(field: str, case: Case) -> bytes:
    """A value case as the JSON body ``{"<field>": <value>}``."""
    return f'{{"{field}": {case.data}}}'.encode()


def _nested(depth: int, field: str = "image") -> bytes:
    return b'{"' + field.encode() + b'": ' + b"[" * depth + b"]" * depth + b"}"


@cache
def raw_cases() -> list[Case]:
    limit = Settings().max_body_bytes
    good = json.dumps({"image": base64.b64encode(_encoded("JPEG")).decode()})
    boundary = "fuzzboundary"
    multipart = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"photo\"; filename=\"a.jpg\"\r\n"
                 f"Content-Type: image/jpeg\r\n\r\n").encode() + _encoded("JPEG")[:200]  # no closing boundary
    bodies: dict[str, tuple[bytes, str, bool]] = {
        "an empty body": (b"", JSON, False),
        "truncated json": (b'{"image": "/9j/4AAQ', JSON, False),
        "a lone brace": (b"{", JSON, False),
        "not json": (b"image=please", JSON, False),
        "json: a list": (b"[]", JSON, False),
        "json: null": (b"null", JSON, False),
        "json: a string": (b'"/9j/4AAQ"', JSON, False),
        "json: a number": (b"123", JSON, False),
        "json: NaN": (b"NaN", JSON, False),
        "json: a number with a huge exponent": (b'{"image": 1e999999}', JSON, False),
        "json: trailing garbage": (b'{"image": "abc"} and more', JSON, False),
        "json: comments": (b'{/* a photo */ "image": "abc"}', JSON, False),
        "json: single quotes": (b"{'image': 'abc'}", JSON, False),
        "json: the wrong field": (b'{"photo": "abc"}', JSON, False),
        "json: duplicate fields": (b'{"image": "abc", "image": 5}', JSON, False),
        "json: 100000 levels of arrays": (_nested(100_000), JSON, False),
        "json: 100000 levels of objects": (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, JSON, False),
        "json: a 1 MB key": (b'{"' + b"k" * 1_000_000 + b'": 1}', JSON, False),
        "non-UTF-8 bytes in a string": (b'{"image": "\xff\xfe\xfa"}', JSON, False),
        "non-UTF-8 bytes as the body": (bytes(range(128, 256)) * 4, JSON, False),
        "json encoded as UTF-16": ('{"image": "abc"}'.encode("utf-16"), JSON, False),
        "json encoded as UTF-32": ('{"image": "abc"}'.encode("utf-32"), JSON, False),
        "latin-1 bytes declared as latin-1": ('{"image": "café"}'.encode("latin-1"), "application/json; charset=latin-1", False),
        "a valid body sent as text/plain": (good.encode(), "text/plain", False),
        "a valid body sent as form data": (good.encode(), "application/x-www-form-urlencoded", False),
        "a valid body sent as an image": (good.encode(), "image/jpeg", False),
        "a truncated multipart form": (multipart, f"multipart/form-data; boundary={boundary}", False),
        "a multipart type without a boundary": (multipart, "multipart/form-data", False),
        "a gzip body not declared as gzip": (gzip.compress(good.encode()), JSON, False),
        "a body over MAX_BODY_BYTES (with its length)": (b'{"image": "' + b"A" * limit + b'"}', JSON, False),
        "a body over MAX_BODY_BYTES (chunked, no length)": (b'{"image": "' + b"A" * limit + b'"}', JSON, True),
        "invalid json in chunks": (b'{"image": ' + b"[" * 1000, JSON, True),
    }
    return [Case(name, "raw", body, content_type, chunked) for name, (body, content_type, chunked) in bodies.items()]


def cases() -> list[Case]:
    """The one list: every malformed input, of every kind."""
    return [*image_cases(), *value_cases(), *raw_cases()]


def chunks(body: bytes, size: int = 64 * 1024):
    """A body as an iterator of pieces: httpx and requests send it chunked, without a Content-Length."""
    for start in range(0, len(body), size):
        yield body[start:start + size]
