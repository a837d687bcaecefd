"""Logits -> class probabilities, one row per image."""

from dataclasses import dataclass

import numpy as np

from servelab.core.labels import CLASSES


@dataclass(frozen=True)
class Prediction:
    label: str
    probability: float
    index: int


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, row by row (never across the batch); each row's maximum subtracted first, so
    exp() cannot overflow."""
    z = np.asarray(logits, dtype=np.float64)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def top1(logits: np.ndarray, classes: tuple[str, ...] | list[str] = CLASSES) -> list[Prediction]:
    """The most likely class of each row and its softmax probability."""
    probs = softmax(np.atleast_2d(logits))
    return [Prediction(classes[i], float(p[i]), int(i)) for i, p in zip(probs.argmax(axis=-1), probs)]
