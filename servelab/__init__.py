"""servelab: a hands-on lab on system-level optimizations for ML serving.

Data flows one way in every stage: image bytes -> ``preprocess`` -> model -> ``postprocess`` -> response.
"""

__version__ = "0.1.0"
