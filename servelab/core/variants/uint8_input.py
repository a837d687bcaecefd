"""The fp32 model with its preprocessing moved into the graph: it takes uint8 pixels.

Input ``image``: uint8 ``[N, 224, 224, 3]`` (NHWC), the center crop exactly as Pillow decodes it, so the client does no
float math and sends a quarter of the bytes of the float32 tensor. NHWC because that is the layout every decoder
produces: the transpose to the model's NCHW becomes the graph's job, where ONNX Runtime does it in one pass with the
cast, instead of NumPy making a copy per image. The first nodes do what ``servelab.core.preprocess.to_tensor`` does in
NumPy, folded into one multiply and one subtract. Output ``output``: the same float32 logits.
"""

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, compose, helper, numpy_helper

IMAGE_INPUT = "image"
# merge_models prefixes the preprocessing graph's node names with "pre_".
PREPROCESS_NODE_PREFIX = "pre_preprocess_"


def preprocessing_graph(crop: int, mean, std, opset: int, ir_version: int) -> onnx.ModelProto:
    """uint8 NHWC ``image`` -> normalized float32 NCHW ``input``."""
    std = np.asarray(std, dtype=np.float64)
    scale = (1.0 / (255.0 * std)).astype(np.float32).reshape(1, 3, 1, 1)
    shift = (np.asarray(mean, dtype=np.float64) / std).astype(np.float32).reshape(1, 3, 1, 1)
    # Named, so that quantization can leave them in float (``PREPROCESS_NODE_PREFIX``).
    nodes = [
        helper.make_node("Cast", ["image"], ["pixels"], name="preprocess_cast", to=TensorProto.FLOAT),
        helper.make_node("Transpose", ["pixels"], ["pixels_nchw"], name="preprocess_transpose", perm=[0, 3, 1, 2]),
        helper.make_node("Mul", ["pixels_nchw", "scale"], ["scaled"], name="preprocess_scale"),
        helper.make_node("Sub", ["scaled", "shift"], ["input"], name="preprocess_shift"),
    ]
    graph = helper.make_graph(
        nodes, "preprocess",
        [helper.make_tensor_value_info(IMAGE_INPUT, TensorProto.UINT8, ["batch", crop, crop, 3])],
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, crop, crop])],
        initializer=[numpy_helper.from_array(scale, "scale"), numpy_helper.from_array(shift, "shift")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)


def build(fp32_model: Path, dest: Path, *, crop: int, mean, std) -> Path:
    """Write the uint8-input model: the preprocessing graph feeding ``fp32_model``'s ``input``."""
    model = onnx.load(str(fp32_model))
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    prefix = preprocessing_graph(crop, mean, std, opset, model.ir_version)
    merged = compose.merge_models(prefix, model, io_map=[("input", "input")], prefix1="pre_")
    # merge_models prefixes the first graph's names; keep the public input name plain.
    for node in merged.graph.node:
        node.input[:] = [IMAGE_INPUT if name == f"pre_{IMAGE_INPUT}" else name for name in node.input]
    merged.graph.input[0].name = IMAGE_INPUT
    # merge_models lists the default domain twice (once per graph); ONNX Runtime's quantization
    # tools refuse a model that does.
    opsets = {o.domain: o.version for o in merged.opset_import}
    del merged.opset_import[:]
    merged.opset_import.extend(helper.make_opsetid(domain, version) for domain, version in opsets.items())
    onnx.checker.check_model(merged)
    onnx.save(merged, str(dest))
    return dest
