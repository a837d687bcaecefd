"""Preprocessing against an independently written reference (Pillow resize, then torch tensor ops)."""

import base64
import io
from functools import cache

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from photos import coffee, png_header, variants
from servelab.core.paths import DATA_DIR
from servelab.core.preprocess import ImageError, ImageTooLarge, decode_base64, load_image, preprocess, resize_and_crop
from servelab.run.side_by_side import core_time_table, torchvision_steps

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def reference(data: bytes) -> np.ndarray:
    """torchvision's Resize(256) + CenterCrop(224) + ToTensor + Normalize, written out by hand."""
    im = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    if im.mode == "I;16":
        im = Image.fromarray((np.asarray(im, dtype=np.float64) / 257).round().astype(np.uint8))
    if im.mode in ("RGBA", "P"):
        im = Image.alpha_composite(Image.new("RGBA", im.size, "white"), im.convert("RGBA"))
    im = im.convert("RGB")
    w, h = im.size
    scale = 256 / min(w, h)
    size = (256, int(h * scale)) if w <= h else (int(w * scale), 256)
    t = torch.from_numpy(np.array(im.resize(size, Image.BILINEAR))).permute(2, 0, 1).float() / 255
    top, left = round((t.shape[1] - 224) / 2), round((t.shape[2] - 224) / 2)
    t = t[:, top : top + 224, left : left + 224]
    return ((t - MEAN) / STD).numpy()


@pytest.mark.parametrize("name", sorted(variants()))
def test_matches_reference(name):
    data = variants()[name]
    ours = preprocess(data)
    assert ours.shape == (3, 224, 224) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, reference(data), atol=1e-5)


def old_way(data: bytes) -> np.ndarray:
    """preprocess before the one-pass normalization: full-size decode, then divide, subtract, divide, transpose."""
    x = np.asarray(resize_and_crop(load_image(data)), dtype=np.float32) / 255.0
    x = (x - np.asarray(MEAN.flatten(), dtype=np.float32)) / np.asarray(STD.flatten(), dtype=np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


@cache
def same_answers_inputs() -> dict[str, bytes]:
    """The variants, two bundled photos, and a PNG of 2400x1600 (large, but not a JPEG)."""
    photos = {p.name: p.read_bytes() for p in sorted((DATA_DIR / "photos").glob("*.jpg"))[::250]}
    buf = io.BytesIO()
    coffee().resize((2400, 1600), Image.BICUBIC).save(buf, "PNG", compress_level=1)
    return {**variants(), **photos, "large_png": buf.getvalue()}


@pytest.mark.parametrize("name", sorted(same_answers_inputs()))
def test_same_answers_as_the_old_way(name):
    data = same_answers_inputs()[name]
    ours = preprocess(data)
    assert ours.dtype == np.float32 and ours.flags.c_contiguous
    assert np.abs(ours - old_way(data)).max() <= 1e-5


def coffee_jpeg(size: tuple[int, int], **kwargs) -> bytes:
    buf = io.BytesIO()
    coffee().resize(size, Image.BICUBIC).save(buf, "JPEG", quality=95, **kwargs)
    return buf.getvalue()


@pytest.mark.parametrize("size, decoded", [
    ((2400, 1600), (1200, 800)),  # 1/2: at 1/4 the shorter side would be under twice 256
    ((3072, 2048), (768, 512)),
    ((1022, 2044), (1022, 2044)),  # half of 1022 is under twice 256
    ((2402, 1601), (2402, 1601)),  # 1601 is odd: the scaled pixels would not tile the image
    ((4098, 2050), (2049, 1025)),  # 1/2: 1/4 does not divide 4098
])
def test_large_jpegs_decode_scaled_while_the_shorter_side_stays_at_least_twice_resize(size, decoded):
    data = coffee_jpeg(size)
    assert load_image(data).size == size
    assert load_image(data, draft_side=256).size == decoded


def test_a_scaled_decode_keeps_the_answer_close():
    """The same crop window, resampled from a half-size decode: close to the full-size decode's
    (the top-1 class is checked with the model in tests/integration/test_preprocess_draft.py)."""
    data = coffee_jpeg((2400, 1600))
    assert np.abs(preprocess(data) - old_way(data)).mean() < 0.01


def test_a_rotated_large_jpeg_decodes_scaled_then_upright():
    exif = Image.Exif()
    exif[0x0112] = 6  # stored sideways: rotate 90 CW to display
    buf = io.BytesIO()
    coffee().transpose(Image.Transpose.ROTATE_90).resize((1600, 2400), Image.BICUBIC).save(buf, "JPEG", quality=95,
                                                                                              exif=exif)
    assert load_image(buf.getvalue(), draft_side=256).size == (1200, 800)
    assert np.abs(preprocess(buf.getvalue()) - preprocess(coffee_jpeg((2400, 1600)))).mean() < 0.05


def test_exif_orientation_is_applied():
    upright = preprocess(variants()["png"])
    rotated = preprocess(variants()["exif_rotated_jpeg"])
    # Same photo after undoing the rotation (JPEG noise only); the unrotated pixels would differ a lot.
    assert np.abs(upright - rotated).mean() < 0.05
    sideways = np.rot90(upright, k=1, axes=(1, 2))
    assert np.abs(sideways - rotated).mean() > 0.3


def test_transparent_pixels_become_white():
    im = Image.new("RGBA", (64, 64), (255, 0, 0, 0))
    buf = io.BytesIO()
    im.save(buf, "PNG")
    x = preprocess(buf.getvalue())
    white = (1 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    np.testing.assert_allclose(x[:, 100, 100], white, atol=1e-5)


def test_base64_round_trip_and_data_url():
    data = variants()["jpeg"]
    text = base64.b64encode(data).decode()
    assert decode_base64(text) == data
    assert decode_base64("data:image/jpeg;base64," + text[:40] + "\n" + text[40:]) == data


@pytest.mark.parametrize("text", ["", "   ", "not base64!!", "abc"])
def test_bad_base64(text):
    with pytest.raises(ImageError):
        decode_base64(text)


@pytest.mark.parametrize("size", [(100_000, 100_000), (10_000, 5_000)])
def test_bombs_refused_before_decoding(size):
    with pytest.raises(ImageTooLarge):
        load_image(png_header(*size), max_pixels=40_000_000)


def test_pixel_limit_is_configurable():
    with pytest.raises(ImageTooLarge):
        load_image(variants()["jpeg"], max_pixels=1000)


@pytest.mark.parametrize(
    "data",
    [b"", b"plain text, not an image", variants()["jpeg"][:2000], coffee_jpeg((2400, 1600))[:50_000],
     png_header(1, 1)],
    ids=["empty", "text", "truncated", "truncated_large", "one_pixel"],
)
def test_bad_images(data):
    with pytest.raises(ImageError) as err:
        preprocess(data)
    assert str(err.value)  # a message a person can read


def test_animated_gif_uses_first_frame():
    first = coffee()
    frames = [first, first.transpose(Image.Transpose.FLIP_LEFT_RIGHT)]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:])
    still = io.BytesIO()
    first.save(still, "GIF")
    np.testing.assert_allclose(preprocess(buf.getvalue()), preprocess(still.getvalue()), atol=1e-5)


def test_a_long_thin_strip_does_not_blow_up_memory():
    """Resizing the short side to 256 before cropping would make a 16 x 2,000,000 strip 32 gigapixels."""
    import subprocess
    import sys

    # VmHWM (peak resident memory) starts afresh at exec; ru_maxrss would include the forked parent's.
    code = (
        "import io, re; from PIL import Image; from servelab.core.preprocess import preprocess\n"
        "buf = io.BytesIO(); Image.new('RGB', (2_000_000, 16), (200, 100, 50)).save(buf, 'PNG')\n"
        "assert preprocess(buf.getvalue()).shape == (3, 224, 224)\n"
        "print(re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1))\n"
    )
    peak_kib = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert peak_kib < 1_000_000  # under 1 GB (the decoded strip itself is 96 MB)


def test_the_benchmarks_torchvision_steps_compute_the_same_tensor():
    """`servelab benchmark --measure preprocess` times torchvision's steps against preprocess: the same tensor."""
    name, steps = torchvision_steps()
    for data in (variants()["jpeg"], variants()["png"]):
        np.testing.assert_allclose(np.asarray(steps(data)), reference(data), atol=1e-5)
    table = core_time_table(variants()["jpeg"], {}, "coffee.jpg", iterations=4, rounds=2)
    assert "| servelab (`preprocess`) |" in table and f"| {name} |" in table
