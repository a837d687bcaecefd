"""The cheaper variants of the fp32 ONNX model, built next to it, and their record (``food11_variants.json``:
each file, its input and its agreement with fp32 on the evaluation photos).

``VARIANTS``: fp32 (the exported model), u8 (the same with preprocessing in the graph: ``uint8_input``), and three
conversions of u8 (``quantize``, which says why these formats): int8 (static, the chosen format), int8dyn (dynamic,
for comparison) and fp16 (for a GPU). Reading the record needs only pydantic: onnx and ONNX Runtime load lazily.
"""

import hashlib
import json
import os
import platform
import re
import tempfile
import time
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from servelab import __version__
from servelab.core import photos
from servelab.core.artifacts import Manifest, copy_atomic, write_atomic
from servelab.core.catalogue import MODELS
from servelab.core.fetch import holds, sha256_file
from servelab.core.hardware import CPUINFO, cpu_flags
from servelab.core.postprocess import softmax
from servelab.core.preprocess import to_tensor

VARIANTS: dict[str, str] = {
    "fp32": "food11.onnx",
    "u8": "food11_u8.onnx",
    "int8": "food11_u8_int8.onnx",
    "int8dyn": "food11_u8_int8dyn.onnx",
    "fp16": "food11_u8_fp16.onnx",
}
PRECISION = {"fp32": "fp32", "u8": "fp32", "int8": "int8", "int8dyn": "int8", "fp16": "fp16"}
# Variant -> the Triton model repository folder serving it (fp32 is staged with the model, servelab.core.artifacts).
STAGED = {m.variant: m.name for m in MODELS.values() if m.variant and m.variant != "fp32"}
RECORD_FILE = "food11_variants.json"
# Bumped when the way variants are made changes, so the build key changes with it.
RECIPE = 1


def variant_path(model_dir: Path, name: str) -> Path:
    try:
        return Path(model_dir) / VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}") from None


class Agreement(BaseModel):
    """A variant against fp32 on the evaluation photos: the top-1 class, and the change in the
    softmax probability of fp32's top class."""

    photos: int
    top1: float
    max_prob_change: float
    mean_prob_change: float


class Variant(BaseModel):
    name: str
    file: str
    size_bytes: int
    sha256: str
    precision: str
    input_name: str
    input_dtype: str
    input_layout: str
    output_name: str = "output"
    output_dtype: str = "float32"
    quantization: dict[str, str | bool | int] = {}
    agreement: Agreement


class PhotoSet(BaseModel):
    count: int
    sources: int
    digest: str


class VariantsRecord(BaseModel):
    build_key: str
    fp32_onnx_sha256: str
    machine: str
    versions: dict[str, str]
    calibration: PhotoSet
    evaluation: PhotoSet
    variants: list[Variant]
    int8_formats_measured: list[dict[str, str | float]]
    int8_formats_machine: str

    def get(self, name: str) -> Variant:
        return next(v for v in self.variants if v.name == name)


def load_variants(model_dir: Path) -> VariantsRecord:
    return VariantsRecord.model_validate_json((Path(model_dir) / RECORD_FILE).read_text())


def agreements(model_dir: Path) -> dict[str, float]:
    """Each variant's top-1 agreement with fp32, as ``servelab models build`` recorded it ({}: none built there)."""
    built = (Path(model_dir) / RECORD_FILE).exists()
    return {v.name: v.agreement.top1 for v in load_variants(model_dir).variants} if built else {}


# The instruction sets ``machine()`` names: the vector widths and what makes INT8 fast (hardware.INT8_INSTRUCTIONS).
MACHINE_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "f16c", "asimddp", "i8mm")


def machine() -> str:
    """The CPU model and the instruction sets that decide which INT8 kernels are fast."""
    model, flags = platform.processor() or platform.machine(), cpu_flags() or set()
    cpuinfo = CPUINFO.read_text() if CPUINFO.exists() else ""
    if names := re.findall(r"^\s*model name\s*:(.*)$", cpuinfo, re.MULTILINE):
        model = names[-1].strip()
    simd = [f for f in MACHINE_FLAGS if f in flags]
    return f"{model}, {os.cpu_count()} CPUs, {platform.system()} {platform.machine()}; {' '.join(simd) or 'no AVX2'}"


def _photo_set(chosen: list[photos.Photo]) -> PhotoSet:
    return PhotoSet(count=len(chosen), sources=len({p.source_sha256 for p in chosen}), digest=photos.set_digest(chosen))


def _versions() -> dict[str, str]:
    # Deferred: optional extras, loaded only when this runs.
    import onnx
    import onnxruntime

    return {"servelab": __version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}


def reusable_record(model_dir: Path, key: str) -> VariantsRecord | None:
    try:
        record = load_variants(model_dir)
    except (OSError, ValueError):
        return None
    built = {Path(model_dir) / v.file: v.sha256 for v in record.variants}
    return record if record.build_key == key and holds(built) else None


def session(path: Path):
    import onnxruntime as ort  # deferred: an optional extra (onnx), loaded only when this runs

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def run_batches(sess, pixels: np.ndarray, float_input: bool, manifest: Manifest, batch: int = 16) -> np.ndarray:
    """Logits for uint8 NHWC ``pixels``; the fp32 model gets them through the NumPy preprocessing."""
    name = sess.get_inputs()[0].name
    out = []
    for i in range(0, len(pixels), batch):
        x = pixels[i:i + batch]
        if float_input:
            x = np.stack([to_tensor(im, manifest.mean, manifest.std) for im in x])
        out.append(sess.run(["output"], {name: x})[0])
    return np.concatenate(out)


def agreement(reference_logits: np.ndarray, logits: np.ndarray) -> Agreement:
    ref, probs = softmax(reference_logits), softmax(logits)
    top = ref.argmax(axis=1)
    rows = np.arange(len(top))
    change = np.abs(probs[rows, top] - ref[rows, top])
    return Agreement(photos=len(top), top1=float((probs.argmax(axis=1) == top).mean()),
                     max_prob_change=float(change.max()), mean_prob_change=float(change.mean()))


def _describe(model_dir: Path, name: str, reference: np.ndarray, pixels: np.ndarray, manifest: Manifest) -> Variant:
    # Deferred, not a circle: importing it loads onnx (an optional extra) only when this runs.
    from servelab.core.variants.quantize import DYNAMIC_OPTIONS, FP16_OPTIONS, STATIC_OPTIONS

    path = variant_path(model_dir, name)
    sess = session(path)
    float_input = name == "fp32"
    quantization = {"int8": {**STATIC_OPTIONS, "calibration_photos": len(photos.calibration_set())},
                    "int8dyn": DYNAMIC_OPTIONS, "fp16": FP16_OPTIONS}.get(name, {})
    return Variant(
        name=name, file=path.name, size_bytes=path.stat().st_size, sha256=sha256_file(path), precision=PRECISION[name],
        input_name=sess.get_inputs()[0].name, input_dtype="float32" if float_input else "uint8",
        input_layout="NCHW" if float_input else "NHWC", quantization=quantization,
        agreement=agreement(reference, run_batches(sess, pixels, float_input, manifest)),
    )


def build_variants(model_dir: Path, manifest: Manifest, staging: Path | None = None, force: bool = False,
                   log=print) -> VariantsRecord:
    """Make (or reuse, when their inputs are unchanged) the four variants of ``model_dir``'s
    food11.onnx and their record, each file written whole or not at all; copy u8, int8 and fp16
    into the Triton model repository ``staging`` (None: nowhere)."""
    # Deferred, not a circle: importing it loads onnx (an optional extra) only when this runs.
    from servelab.core.variants import quantize, uint8_input

    model_dir = Path(model_dir)
    versions = _versions()
    key = hashlib.sha256(json.dumps(
        [RECIPE, manifest.onnx_sha256, manifest.crop, manifest.mean, manifest.std, versions, quantize.STATIC_OPTIONS,
         quantize.DYNAMIC_OPTIONS, quantize.FP16_OPTIONS, photos.set_digest(photos.calibration_set()),
         photos.set_digest(photos.evaluation_set())], sort_keys=True).encode()).hexdigest()
    if not force and (record := reusable_record(model_dir, key)) is not None:
        log(f"models: variants up to date in {model_dir}")
    else:
        started = time.monotonic()
        fp32 = variant_path(model_dir, "fp32")
        write_atomic(variant_path(model_dir, "u8"), lambda tmp: uint8_input.build(
            fp32, tmp, crop=manifest.crop, mean=manifest.mean, std=manifest.std))
        with tempfile.TemporaryDirectory() as tmp:
            prepared = quantize.prepare(variant_path(model_dir, "u8"), Path(tmp) / "prepared.onnx")
            calibration = photos.pixels(photos.calibration_set(), manifest.resize, manifest.crop)
            write_atomic(variant_path(model_dir, "int8"), lambda t: quantize.int8_static(prepared, t, calibration))
            write_atomic(variant_path(model_dir, "int8dyn"), lambda t: quantize.int8_dynamic(prepared, t))
            write_atomic(variant_path(model_dir, "fp16"), lambda t: quantize.fp16(prepared, t))
        evaluation = photos.evaluation_set()
        pixels = photos.pixels(evaluation, manifest.resize, manifest.crop)
        reference = run_batches(session(variant_path(model_dir, "fp32")), pixels, True, manifest)
        record = VariantsRecord(
            build_key=key, fp32_onnx_sha256=manifest.onnx_sha256, machine=machine(), versions=versions,
            calibration=_photo_set(photos.calibration_set()), evaluation=_photo_set(evaluation),
            variants=[_describe(model_dir, name, reference, pixels, manifest) for name in VARIANTS],
            int8_formats_measured=quantize.FORMAT_MEASUREMENTS, int8_formats_machine=quantize.FORMAT_MEASUREMENTS_MACHINE,
        )
        write_atomic(model_dir / RECORD_FILE, lambda tmp: tmp.write_text(record.model_dump_json(indent=2) + "\n"))
        log(f"models: wrote the variants {', '.join(VARIANTS[n] for n in VARIANTS if n != 'fp32')} and {RECORD_FILE} "
            f"in {time.monotonic() - started:.1f} s; int8 agrees with fp32 on "
            f"{record.get('int8').agreement.top1:.1%} of {len(evaluation)} evaluation photos")
    if staging is not None:
        for name, folder in STAGED.items():
            src, dest = variant_path(model_dir, name), Path(staging) / folder / "1" / "model.onnx"
            if not holds({dest: sha256_file(src)}):
                copy_atomic(src, dest)
    return record
