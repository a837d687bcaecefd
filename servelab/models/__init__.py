"""Model architectures by the name a manifest gives them.

torch is imported only when a model is built, so torch-free code (the ONNX service, which reads
``servelab.models.variants``) can import the modules next to this one.
"""

from collections.abc import Callable


def _architectures() -> dict[str, Callable]:
    from servelab.models.efficientnet_food11 import EfficientNetLite0Food11
    from servelab.models.mobilenet_v2 import food11_mobilenet_v2

    return {"mobilenet_v2": food11_mobilenet_v2, "efficientnet_lite0_food11": EfficientNetLite0Food11}


def build_model(architecture: str):
    """An untrained model of the named architecture (a torch ``nn.Module``), in eval mode."""
    architectures = _architectures()
    try:
        factory = architectures[architecture]
    except KeyError:
        raise ValueError(f"unknown architecture {architecture!r}; known: {sorted(architectures)}") from None
    return factory().eval()
