"""The conversions behind the cheaper model variants: INT8 static (QDQ), INT8 dynamic, fp16.

Every conversion starts from the uint8-input model (``uint8_input``) and leaves two parts of it in float32: the
preprocessing nodes (cast, transpose, scale, shift: quantizing the normalized input would add a rounding step on top of
the pixels' own) and everything after the classifier's last Gemm (the stand-in's Softmax -> class-mapping MatMul ->
Clip -> Log: quantized, the Log sees zeros and agreement collapses to 45 %, measured).

Which INT8 format: ``FORMAT_MEASUREMENTS``, each format measured side by side on the machine
``FORMAT_MEASUREMENTS_MACHINE`` names (agreement = top-1 equal to the fp32 model's; ms/image medians of 5
interleaved rounds), not re-measured since the photo set grew to 139 photographs.

Why U8/S8 QDQ per-channel without reduce_range: that CPU has VNNI, whose u8 x s8 dot product does not saturate, so
reduce_range (the AVX2-without-VNNI workaround) only loses a bit of precision; ONNX Runtime's x86 kernels are built for
U8S8, and S8S8 runs ~2x slower here; QOperator agrees exactly as much and is no faster; per-tensor weights cost 2.4
points of agreement for nothing measurable. Dynamic quantization turns each Conv into ConvInteger, which has no fast
kernel on x86: it is 4-10x slower than fp32 on this CNN, kept only as the comparison.
"""

import logging
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx

from servelab.core.hardware import CPUINFO, cpu_int8
from servelab.core.variants.uint8_input import IMAGE_INPUT, PREPROCESS_NODE_PREFIX


def has_vnni(cpuinfo: Path = CPUINFO) -> bool:
    """Whether this x86 CPU has VNNI (AVX512-VNNI or AVX-VNNI), whose u8 x s8 dot product does not saturate."""
    return bool({"avx512_vnni", "avx_vnni"} & set(cpu_int8(cpuinfo).instructions))


# The options each variant is made with; recorded in food11_variants.json (and part of its build key,
# so a checkout moved to a CPU of the other kind builds again). Weights: S8 where the CPU has VNNI
# (``FORMAT_MEASUREMENTS``); without it, AVX2's u8 x s8 multiply-add saturates in 16 bits and top-1 agreement fell
# to 95.5 % (reduce_range: 96.6 %) on an AMD EPYC with AVX2 alone, where U8 weights gave 98.9 %.
STATIC_OPTIONS = {"quant_format": "QDQ", "activation_type": "QUInt8", "weight_type": "QInt8" if has_vnni() else "QUInt8",
                  "per_channel": True, "reduce_range": False, "calibrate_method": "MinMax"}
DYNAMIC_OPTIONS = {"weight_type": "QUInt8", "per_channel": False, "reduce_range": False}
FP16_OPTIONS = {"converter": "onnxruntime.transformers.float16", "keep_io_types": True}
FORMAT_MEASUREMENTS_MACHINE = ("2-CPU Debian 12 VM, AMD EPYC (AVX2, AVX512-VNNI, AVX-VNNI), ONNX Runtime "
                               "1.31.1, 2 intra-op threads, offline stand-in, 28 calibration / 168 evaluation pictures "
                               "of the earlier 49-photograph set")
FORMAT_MEASUREMENTS = [dict(zip(("format", "top1_agreement", "ms_per_image_b1", "ms_per_image_b16"), row)) for row in (
    ("fp32 uint8-input", 1.0, 7.5, 9.4),
    ("QDQ U8/S8 per-channel", 0.982, 6.2, 5.1),
    ("QDQ U8/S8 per-channel reduce_range", 0.970, 6.9, 5.3),
    ("QDQ S8/S8 per-channel", 0.982, 13.7, 8.6),
    ("QOperator U8/S8 per-channel", 0.982, 6.8, 5.6),
    ("QDQ U8/S8 per-tensor", 0.958, 6.2, 4.9),
    ("QDQ U8/S8 per-channel, head and preprocessing quantized too", 0.446, 6.6, 5.9),
    ("dynamic U8 weights per-tensor", 0.994, 32.3, 20.3),
    ("dynamic S8 weights per-channel", 0.970, 70.1, 73.1),
)]


def float_nodes(model: onnx.ModelProto) -> list[str]:
    """The nodes kept in float32: the preprocessing and everything after the last Gemm."""
    nodes = model.graph.node
    last_gemm = max(i for i, node in enumerate(nodes) if node.op_type == "Gemm")
    return [n.name for n in nodes if n.name.startswith(PREPROCESS_NODE_PREFIX)] + [n.name for n in nodes[last_gemm + 1:]]


def prepare(u8_model: Path, dest: Path) -> Path:
    """ONNX Runtime's recommended pre-pass before quantizing: shape inference and graph optimization."""
    # Deferred: an optional extra (onnx), loaded only when this runs.
    from onnxruntime.quantization.shape_inference import quant_pre_process

    quant_pre_process(str(u8_model), str(dest))
    return dest


def int8_static(prepared: Path, dest: Path, calibration: np.ndarray) -> None:
    # Deferred: an optional extra (onnx), loaded only when this runs.
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    o = STATIC_OPTIONS
    # A CalibrationDataReader (it needs only get_next) over uint8 [N, H, W, 3] pixels, one picture per batch.
    photos = SimpleNamespace(get_next=partial(next, ({IMAGE_INPUT: p[None]} for p in calibration), None))
    # The quantizer warns on the root logger once per bias it clips to int32 (its scale, input scale x weight
    # scale, too small: dozens for this model, on every first run): counted, said once.
    clipped = []

    def biases(record: logging.LogRecord) -> bool:
        if "exceeds the range of a int32" in record.getMessage():
            clipped.append(record)
            return False
        return True

    logging.getLogger().addFilter(biases)
    try:
        quantize_static(
            str(prepared), str(dest), photos, quant_format=QuantFormat[o["quant_format"]],
            activation_type=QuantType[o["activation_type"]], weight_type=QuantType[o["weight_type"]],
            per_channel=o["per_channel"], reduce_range=o["reduce_range"],
            calibrate_method=CalibrationMethod[o["calibrate_method"]],
            nodes_to_exclude=float_nodes(onnx.load(str(prepared))),
        )
    finally:
        logging.getLogger().removeFilter(biases)
    if clipped:
        logging.getLogger(__name__).warning(
            "ONNX Runtime's quantizer clipped %d biases to int32, their scale too small (its warning, said once; "
            "the agreement with fp32 measured next includes the effect)", len(clipped))


def int8_dynamic(prepared: Path, dest: Path) -> None:
    # Deferred: an optional extra (onnx), loaded only when this runs.
    from onnxruntime.quantization import QuantType, quantize_dynamic

    o = DYNAMIC_OPTIONS
    quantize_dynamic(str(prepared), str(dest), weight_type=QuantType[o["weight_type"]],
                     per_channel=o["per_channel"], reduce_range=o["reduce_range"],
                     nodes_to_exclude=float_nodes(onnx.load(str(prepared))))


def fp16(prepared: Path, dest: Path) -> None:
    """fp16 weights and compute; the uint8 input and the float32 output stay as they are."""
    # Deferred: an optional extra (onnx), loaded only when this runs.
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(prepared))
    converted = convert_float_to_float16(model, keep_io_types=FP16_OPTIONS["keep_io_types"],
                                         node_block_list=float_nodes(model))
    onnx.save(converted, str(dest))
