"""Model definitions, the offline stand-in, and the built artifacts."""

import json
from pathlib import Path

import numpy as np
import torch

from photos import variants
from servelab.core.artifacts import load_manifest
from servelab.core.inference import OnnxClassifier, TorchClassifier
from servelab.core.models.mobilenet_v2 import MobileNetV2, food11_mobilenet_v2
from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.postprocess import top1
from servelab.core.preprocess import preprocess, preprocess_batch

DATA = Path(__file__).parents[1] / "data"


def _torchvision_layout(num_classes: int) -> dict[str, torch.Tensor]:
    """A state_dict with the keys and shapes of torchvision 0.29's MobileNetV2 (recorded from its source)."""
    spec = json.loads((DATA / "torchvision_mobilenet_v2_keys.json").read_text())["keys"]
    state = {}
    for name, shape in spec:
        if name == "classifier.1.weight":
            shape = [num_classes, 1280]
        elif name == "classifier.1.bias":
            shape = [num_classes]
        state[name] = torch.tensor(0) if name.endswith("num_batches_tracked") else torch.randn(shape)
    return state


def test_torchvision_state_dicts_load_strictly():
    assert len(_torchvision_layout(1000)) == 314
    MobileNetV2().load_state_dict(_torchvision_layout(1000), strict=True)
    food11_mobilenet_v2().load_state_dict(_torchvision_layout(11), strict=True)


def test_manifest_describes_the_stand_in(artifacts):
    manifest = load_manifest(artifacts.manifest)
    assert manifest.stand_in and "stand-in" in manifest.description
    assert manifest.architecture == "efficientnet_lite0_food11"
    assert (manifest.resize, manifest.crop) == (256, 224)


def test_onnx_matches_pytorch_on_a_batch(artifacts):
    batch = preprocess_batch(list(variants().values()))
    expected = TorchClassifier(artifacts.manifest).infer(batch)
    actual = OnnxClassifier(artifacts.onnx).infer(batch)
    assert actual.shape == (len(batch), 11)
    np.testing.assert_allclose(actual, expected, atol=1e-4)


def test_offline_model_classifies_a_real_food_photo(artifacts):
    logits = OnnxClassifier(artifacts.onnx).infer(preprocess(DEFAULT_IMAGE.read_bytes())[None])
    (pred,) = top1(logits)
    # ImageNet calls the photo "espresso" (milk coffee), which the stand-in maps to Dairy product.
    assert pred.label == "Dairy product"
    assert pred.probability > 0.5


def test_onnx_file_is_single_and_dynamic(artifacts):
    import onnx

    model = onnx.load(str(artifacts.onnx))  # fails if weights lived in a side file
    (inp,) = model.graph.input
    assert inp.name == "input" and model.graph.output[0].name == "output"
    dims = inp.type.tensor_type.shape.dim
    assert dims[0].dim_param and [d.dim_value for d in dims[1:]] == [3, 224, 224]
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 17
