"""Model artifacts: a state_dict, its JSON manifest and a single-file ONNX model, which ``servelab models build``
makes from the zero-shot stand-in whose weights ship in a package (``offline``: nothing is downloaded) or from the
lab's MobileNetV2 Food-11 weights (``lab``: pinned by commit and git blob SHA-1; ``ModelSource``).

Every stage reads the manifest for the architecture, classes and preprocessing sizes, so none guesses how its
model was built. Torch is imported lazily: the ONNX service and the web app read manifests without it.
"""

import hashlib
import json
import platform
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from servelab import __version__
from servelab.core.catalogue import MODELS
from servelab.core.fetch import FetchError, copy_atomic, fetch, git_blob_sha1, holds, sha256_file, write_atomic
from servelab.core.labels import CLASSES
from servelab.core.models import build_model
from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.preprocess import DEFAULT_CROP, DEFAULT_RESIZE, IMAGENET_MEAN, IMAGENET_STD, preprocess

LAB_MODEL_URL = (
    "https://raw.githubusercontent.com/teaching-on-testbeds/gourmetgram/"
    "189b444ef185ec37849c14bcc9cb10dadda5fc60/food11.pth"
)
LAB_MODEL_GIT_SHA1 = "e6e1a4a9aff07f79dde69778b162fc72750e19bc"
ONNX_OPSET = 17
# ONNX Runtime and PyTorch must agree this closely on the same batch, or the build fails.
PARITY_TOLERANCE = 1e-4
STAND_IN_NOTE = (
    "zero-shot stand-in: ImageNet EfficientNet-Lite0 with a fixed ImageNet->Food-11 class mapping, "
    "not the lab's trained model; it never predicts Egg, Fried food or Rice"
)


class Manifest(BaseModel):
    """What a stage needs to know about its model, written next to the weights."""

    name: str
    architecture: str
    classes: list[str]
    resize: int = DEFAULT_RESIZE
    crop: int = DEFAULT_CROP
    mean: list[float] = list(IMAGENET_MEAN)
    std: list[float] = list(IMAGENET_STD)
    stand_in: bool
    description: str
    source: dict[str, str]
    state_dict_file: str
    state_dict_sha256: str
    onnx_file: str
    onnx_sha256: str
    onnx_opset: int
    build_key: str
    versions: dict[str, str]

    def sha256(self) -> str:
        """A short identity for /ready and reports: the hash of the manifest's own content."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()

    def crop_kwargs(self) -> dict:
        """The sizes ``servelab.core.preprocess.crop_pixels`` takes (models with preprocessing in the graph)."""
        return {"resize": self.resize, "crop": self.crop}

    def preprocess_kwargs(self) -> dict:
        return {**self.crop_kwargs(), "mean": tuple(self.mean), "std": tuple(self.std)}


@dataclass(frozen=True)
class ArtifactPaths:
    state_dict: Path
    manifest: Path
    onnx: Path

    @classmethod
    def in_dir(cls, model_dir: Path) -> "ArtifactPaths":
        return cls(*(Path(model_dir) / f"food11.{suffix}" for suffix in ("pt", "json", "onnx")))


@dataclass(frozen=True)
class ModelSource:
    """Where the weights come from: the packaged stand-in, a pinned URL, or a local file."""

    kind: Literal["offline", "url", "file"]
    location: str = ""
    git_sha1: str = ""

    @classmethod
    def parse(cls, text: str, git_sha1: str | None = None) -> "ModelSource":
        """``offline``, ``lab``, an http(s) URL (needs ``git_sha1``) or a local path."""
        if text == "offline":
            return cls("offline")
        if text == "lab":
            return cls("url", LAB_MODEL_URL, LAB_MODEL_GIT_SHA1)
        if text.startswith(("http://", "https://")):
            if not git_sha1:
                raise ValueError("a URL source needs the expected git blob SHA-1 (--sha1)")
            return cls("url", text, git_sha1)
        # A local copy is checked against the lab's pinned hash unless told otherwise.
        return cls("file", str(Path(text).resolve()), git_sha1 or LAB_MODEL_GIT_SHA1)


def load_manifest(path: Path) -> Manifest:
    """FileNotFoundError where there is none; pydantic's ValidationError, naming the field, where it is malformed."""
    return Manifest.model_validate_json(Path(path).read_text())


def _versions() -> dict[str, str]:
    # Deferred: an optional extra (torch), loaded only when this runs.
    import onnx
    import torch

    return {"servelab": __version__, "torch": torch.__version__, "onnx": onnx.__version__,
            "python": platform.python_version()}


def _weights_file(source: ModelSource, cache_dir: Path) -> Path:
    if source.kind == "offline":
        # Deferred, not a circle: importing it loads torch (an optional extra) only when this runs.
        from servelab.core.models.efficientnet_food11 import packaged_imagenet_weights

        return Path(packaged_imagenet_weights())
    if source.kind == "url":
        return fetch(source.location, cache_dir / f"food11-{source.git_sha1}.pth", source.git_sha1)
    path = Path(source.location)
    if not path.is_file():
        raise FetchError(f"model file {path} does not exist")
    if git_blob_sha1(path.read_bytes()) != source.git_sha1:
        raise FetchError(f"model file {path} does not have git blob SHA-1 {source.git_sha1}")
    return path


def _export_onnx(model, dest: Path) -> None:
    import torch  # deferred: an optional extra (torch), loaded only when this runs

    example = torch.zeros(1, 3, DEFAULT_CROP, DEFAULT_CROP)
    # The TorchScript exporter writes one self-contained file (the dynamo exporter would put the
    # weights in a side file that breaks when the .onnx is renamed or copied alone).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation and constant-folding chatter
        torch.onnx.export(
            model, (example,), str(dest), dynamo=False, opset_version=ONNX_OPSET,
            input_names=["input"], output_names=["output"],
            dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
        )


def _check_parity(model, onnx_path: Path) -> float:
    """Max |ONNX Runtime - PyTorch| over a batch of a real photo and random inputs."""
    # Deferred: optional extras, loaded only when this runs.
    import numpy as np
    import onnxruntime as ort
    import torch

    rng = np.random.default_rng(0)
    batch = np.concatenate([preprocess(DEFAULT_IMAGE.read_bytes())[None],
                            rng.standard_normal((3, 3, DEFAULT_CROP, DEFAULT_CROP)).astype(np.float32)])
    with torch.inference_mode():
        expected = model(torch.from_numpy(batch)).numpy()
    actual = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(["output"], {"input": batch})
    return float(np.abs(actual[0] - expected).max())


def build_artifacts(source: ModelSource, model_dir: Path, staging: Path | None, force: bool = False,
                    log=print) -> Manifest:
    """Build (or reuse, when the inputs are unchanged) the state_dict, manifest and ONNX model, and copy
    them into the Triton model repository ``staging`` (None: nowhere)."""
    paths = ArtifactPaths.in_dir(model_dir)
    weights = _weights_file(source, Path(model_dir) / "cache")
    versions = _versions()
    key = hashlib.sha256(json.dumps(
        [source.kind, source.location, sha256_file(weights), versions, ONNX_OPSET], sort_keys=True
    ).encode()).hexdigest()

    if not force and (manifest := _reusable(paths, key)) is not None:
        log(f"models: up to date ({manifest.name}) in {model_dir}")
    else:
        manifest = _build(source, weights, paths, key, versions, log)
    if staging is not None:
        _stage(paths, Path(staging))
    return manifest


def _reusable(paths: ArtifactPaths, key: str) -> Manifest | None:
    try:
        manifest = load_manifest(paths.manifest)
    except (OSError, ValueError):
        return None
    built = {paths.state_dict: manifest.state_dict_sha256, paths.onnx: manifest.onnx_sha256}
    return manifest if manifest.build_key == key and holds(built) else None


def _build(source, weights, paths, key, versions, log) -> Manifest:
    import torch  # deferred: an optional extra (torch), loaded only when this runs

    log(f"models: loading weights from {source.location or weights} ({source.kind})")
    stand_in = source.kind == "offline"
    architecture = "efficientnet_lite0_food11" if stand_in else "mobilenet_v2"
    model = build_model(architecture)
    # weights_only=True and strict keys; the stand-in's packaged weights are its ImageNet backbone's.
    state = torch.load(weights, map_location="cpu", weights_only=True)
    (model.backbone if stand_in else model).load_state_dict(state, strict=True)
    write_atomic(paths.state_dict, lambda tmp: torch.save(model.state_dict(), tmp))
    log("models: exporting ONNX")
    write_atomic(paths.onnx, lambda tmp: _export_onnx(model, tmp))
    diff = _check_parity(model, paths.onnx)
    if diff > PARITY_TOLERANCE:
        paths.onnx.unlink()
        raise RuntimeError(f"ONNX Runtime differs from PyTorch by {diff:.2e} (> {PARITY_TOLERANCE})")
    log(f"models: ONNX Runtime matches PyTorch (max abs diff {diff:.1e})")
    manifest = Manifest(
        name="food11-efficientnet-lite0-zeroshot" if stand_in else "food11-mobilenet_v2", architecture=architecture,
        classes=list(CLASSES), stand_in=stand_in,
        description=STAND_IN_NOTE if stand_in else "the lab's MobileNetV2 fine-tuned on Food-11 (GourmetGram)",
        source={"kind": source.kind, "location": source.location or str(weights),
                "git_blob_sha1": source.git_sha1 or git_blob_sha1(Path(weights).read_bytes())},
        state_dict_file=paths.state_dict.name, state_dict_sha256=sha256_file(paths.state_dict),
        onnx_file=paths.onnx.name, onnx_sha256=sha256_file(paths.onnx), onnx_opset=ONNX_OPSET, build_key=key,
        versions=versions)
    write_atomic(paths.manifest, lambda tmp: tmp.write_text(manifest.model_dump_json(indent=2) + "\n"))
    log(f"models: wrote {paths.state_dict}, {paths.manifest}, {paths.onnx}")
    return manifest


def _stage(paths: ArtifactPaths, staging: Path) -> None:
    """Place copies where the Triton model repository expects them (it is bind-mounted as is): the files
    each model needs (``MODELS``) under their own names, and the fp32 ONNX model as the ``model.onnx`` of
    the model serving it (the other variants: ``servelab.core.variants.build``)."""
    targets = [(getattr(paths, file), staging / model.name / "1" / getattr(paths, file).name)
               for model in MODELS.values() for file in model.files]
    targets += [(paths.onnx, staging / model.name / "1" / "model.onnx") for model in MODELS.values()
                if model.variant == "fp32"]
    for src, dest in targets:
        if not holds({dest: sha256_file(src)}):
            copy_atomic(src, dest)
