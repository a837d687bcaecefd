"""Model architectures by the name a manifest gives them; torch is imported only when a model is built."""


def build_model(architecture: str):
    """An untrained model (a torch ``nn.Module``) of the named architecture, in eval mode."""
    # Deferred, not a circle: importing it loads torch (an optional extra) only when this runs.
    from servelab.core.models.efficientnet_food11 import EfficientNetLite0Food11
    from servelab.core.models.mobilenet_v2 import food11_mobilenet_v2

    architectures = {"mobilenet_v2": food11_mobilenet_v2, "efficientnet_lite0_food11": EfficientNetLite0Food11}
    try:
        factory = architectures[architecture]
    except KeyError:
        raise ValueError(f"unknown architecture {architecture!r}; known: {sorted(architectures)}") from None
    return factory().eval()
