"""The model variants (uint8 input, INT8 static and dynamic, fp16), built from the real offline model
and checked on the real evaluation photos, and the photo sets themselves."""

import hashlib
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from servelab.core import photos
from servelab.core.artifacts import ArtifactPaths, load_manifest
from servelab.core.settings import get_settings
from servelab.core.variants.build import (
    RECORD_FILE,
    STAGED,
    VARIANTS,
    build_variants,
    load_variants,
    reusable_record,
    run_batches,
    session,
    variant_path,
)
from servelab.tools.photos_collect import FREE_LICENCES, largest_jpeg, readme_licence

# The chosen INT8 format must keep fp32's top-1 class on at least this share of the evaluation
# photos (measured: 98.6 % of 444 pictures from 111 photographs).
INT8_MIN_AGREEMENT = 0.95


@pytest.fixture(scope="module")
def evaluation(artifacts: ArtifactPaths):
    manifest = load_manifest(artifacts.manifest)
    crops = photos.pixels(photos.evaluation_set(), manifest.resize, manifest.crop)
    fp32 = run_batches(session(artifacts.onnx), crops, True, manifest)
    return manifest, crops, fp32


def test_photo_sets_are_disjoint_licensed_and_large_enough():
    calibration, evaluation = photos.calibration_set(), photos.evaluation_set()
    # Issue 14: at least 100 distinct real photographs (four quadrants of one count once) to check on.
    assert len({p.source_sha256 for p in evaluation}) >= 100
    assert len({p.source_sha256 for p in calibration}) >= 20
    assert not {p.source_sha256 for p in calibration} & {p.source_sha256 for p in evaluation}
    # One source photograph is one (package, path): no photograph is shipped twice under two names.
    assert len({p.source_sha256 for p in photos.all_photos()}) == len({(p.package, p.path) for p in photos.all_photos()})
    assert {p.file for p in photos.all_photos()} == {p.name for p in photos.PHOTO_DIR.glob("*.jpg")}
    for p in photos.all_photos():
        assert p.licence.startswith(FREE_LICENCES) and p.copyright and p.package and p.path
        p.read_bytes()  # checks the sha256


def test_collector_reads_licences_and_embedded_jpegs():
    # GCompris's resource README: "Files:" followed by unindented names, licences spelt loosely.
    readme = ("Copyright: A\nLicense: CC-BY-SA 4.0\nFiles:\nkey.svg\n\n"
              "Copyright: B\nLicense: Public Domain\nSource: https://example.org/x.jpg\nFiles:\nwonders/petra.webp\n")
    assert readme_licence(readme, "wonders/petra.webp") == ("public-domain", "B")
    assert readme_licence(readme, "key.svg") == ("CC-BY-SA-4.0", "A")
    assert readme_licence(readme, "other.webp") == ("", "")
    # An Edje file holds a thumbnail and the photograph: the largest JPEG is taken, whole.
    small, large = (Image.new("RGB", size, "red") for size in ((8, 8), (64, 32)))
    encoded = []
    for im in (small, large):
        buf = io.BytesIO()
        im.save(buf, "JPEG")
        encoded.append(buf.getvalue())
    found = largest_jpeg(b"eet" + encoded[0] + b"\0" * 5 + encoded[1] + b"tail")
    assert found == encoded[1]


def test_u8_model_matches_the_float_pipeline_on_real_photos(artifacts, evaluation):
    manifest, crops, fp32 = evaluation
    u8 = run_batches(session(variant_path(artifacts.onnx.parent, "u8")), crops, False, manifest)
    assert np.abs(u8 - fp32).max() <= 1e-4


@pytest.mark.parametrize(("name", "minimum"), [("int8", INT8_MIN_AGREEMENT), ("fp16", 0.99)])
def test_variant_agrees_with_fp32_on_the_evaluation_photos(artifacts, evaluation, name, minimum):
    manifest, crops, fp32 = evaluation
    sess = session(variant_path(artifacts.onnx.parent, name))
    (inp,), (out,) = sess.get_inputs(), sess.get_outputs()
    assert (inp.name, inp.type, inp.shape[1:]) == ("image", "tensor(uint8)", [224, 224, 3])
    assert (out.name, out.type) == ("output", "tensor(float)")
    logits = run_batches(sess, crops, False, manifest)
    top1 = float((logits.argmax(1) == fp32.argmax(1)).mean())
    assert top1 >= minimum
    assert top1 == load_variants(artifacts.onnx.parent).get(name).agreement.top1


def test_record_is_complete_and_matches_the_files(artifacts):
    model_dir = artifacts.onnx.parent
    record = load_variants(model_dir)
    assert [v.name for v in record.variants] == list(VARIANTS)
    for v in record.variants:
        path = variant_path(model_dir, v.name)
        assert v.file == path.name and v.size_bytes == path.stat().st_size
        assert v.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
        assert v.agreement.photos == record.evaluation.count >= 100
    int8 = record.get("int8")
    assert (int8.precision, int8.input_name, int8.input_dtype, int8.input_layout) == ("int8", "image", "uint8", "NHWC")
    assert int8.quantization["quant_format"] == "QDQ" and int8.quantization["per_channel"] is True
    assert record.get("fp32").input_layout == "NCHW"
    assert record.calibration.count and record.int8_formats_measured
    for name, folder in STAGED.items():
        staged = get_settings().triton_model_repository / folder / "1" / "model.onnx"
        assert staged.read_bytes() == variant_path(model_dir, name).read_bytes()


def test_record_reads_without_torch(artifacts):
    code = ("import sys; sys.modules['torch'] = None; from servelab.core.variants.build import load_variants; "
            f"print(load_variants({str(artifacts.onnx.parent)!r}).get('int8').file)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "food11_u8_int8.onnx"


def test_variants_are_reused_when_unchanged_and_not_when_one_changed(artifacts, tmp_path):
    for path in (artifacts.onnx, artifacts.manifest):
        shutil.copy2(path, tmp_path)
    for name in VARIANTS:
        shutil.copy2(variant_path(artifacts.onnx.parent, name), tmp_path)
    shutil.copy2(artifacts.onnx.parent / RECORD_FILE, tmp_path)
    manifest = load_manifest(tmp_path / "food11.json")
    stamps = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    lines = []
    build_variants(tmp_path, manifest, log=lines.append)
    assert lines == [f"models: variants up to date in {tmp_path}"]
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == stamps

    # One variant changed: the record is no longer reusable, so build_variants takes the path that writes every
    # variant and the record afresh: the path this session's ``artifacts`` took from an empty folder (each
    # variant's file and record read by the tests above). Running that second build here again cost minutes.
    key = load_variants(tmp_path).build_key
    assert reusable_record(tmp_path, key) is not None
    variant_path(tmp_path, "int8").write_bytes(b"half a file")
    assert reusable_record(tmp_path, key) is None
    assert reusable_record(artifacts.onnx.parent, "another build key") is None  # a changed input: rebuilt too
    assert set(os.listdir(artifacts.onnx.parent)) >= {RECORD_FILE, *VARIANTS.values()}


def test_variants_command_prints_the_table(artifacts, tmp_path):
    # A two-photo "Food-11" folder in the lab's layout exercises the accuracy column.
    for i, p in enumerate(photos.evaluation_set()[:2]):
        (tmp_path / f"class_{i:02d}").mkdir()
        (tmp_path / f"class_{i:02d}" / p.file).write_bytes(p.read_bytes())
    done = subprocess.run(
        [str(Path(sys.executable).parent / "servelab"), "models", "variants", "--rounds", "1", "--food11", str(tmp_path)],
        capture_output=True, text=True, check=True)
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")][1:]
    assert [row.split(" | ")[0].strip("| ") for row in rows] == list(VARIANTS)
    assert "Food-11 accuracy on 2 photos" in done.stdout


def test_int8_weights_are_signed_only_where_the_cpu_has_vnni(tmp_path):
    from servelab.core.variants.quantize import STATIC_OPTIONS, has_vnni

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2 f16c\n")
    assert not has_vnni(cpuinfo)
    cpuinfo.write_text("model name\t: Intel Xeon\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni\n")
    assert has_vnni(cpuinfo)
    assert STATIC_OPTIONS["weight_type"] == ("QInt8" if has_vnni() else "QUInt8")
