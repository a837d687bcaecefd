"""The ONNX model variants by name (the `variants` branch builds them; this is its interface)."""

from pathlib import Path

VARIANTS: dict[str, str] = {
    "fp32": "food11.onnx",
    "u8": "food11_u8.onnx",
    "int8": "food11_u8_int8.onnx",
    "int8dyn": "food11_u8_int8dyn.onnx",
    "fp16": "food11_u8_fp16.onnx",
}


def variant_path(model_dir: Path, name: str) -> Path:
    return Path(model_dir) / VARIANTS[name]
