"""Model architectures by the name a manifest gives them (torch is needed only here)."""

from collections.abc import Callable

from torch import nn

from servelab.models.efficientnet_food11 import EfficientNetLite0Food11
from servelab.models.mobilenet_v2 import food11_mobilenet_v2

ARCHITECTURES: dict[str, Callable[[], nn.Module]] = {
    "mobilenet_v2": food11_mobilenet_v2,
    "efficientnet_lite0_food11": EfficientNetLite0Food11,
}


def build_model(architecture: str) -> nn.Module:
    """An untrained model of the named architecture, in eval mode."""
    try:
        factory = ARCHITECTURES[architecture]
    except KeyError:
        raise ValueError(f"unknown architecture {architecture!r}; known: {sorted(ARCHITECTURES)}") from None
    return factory().eval()
