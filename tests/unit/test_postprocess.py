import numpy as np

from servelab.core.labels import CLASSES
from servelab.core.postprocess import softmax, top1


def test_classes_in_lab_order():
    assert CLASSES[0] == "Bread" and CLASSES[3] == "Egg" and CLASSES[-1] == "Vegetable/Fruit"
    assert len(CLASSES) == 11


def test_softmax_is_per_row_and_stable():
    logits = np.array([[1000.0, 999.0] + [0.0] * 9, [0.0] * 11])
    probs = softmax(logits)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(probs[0, :2], [1 / (1 + np.e**-1), 1 / (1 + np.e)], rtol=1e-5)
    np.testing.assert_allclose(probs[1], 1 / 11, rtol=1e-6)  # not diluted by the other row


def test_top1_reports_softmax_probability_not_sigmoid():
    logits = np.zeros((1, 11))
    logits[0, 5] = 2.0
    (pred,) = top1(logits)
    assert pred.label == "Meat" and pred.index == 5
    expected = np.e**2 / (np.e**2 + 10)
    assert abs(pred.probability - expected) < 1e-6
    assert abs(pred.probability - 1 / (1 + np.e**-2)) > 0.1  # sigmoid(max logit) would be 0.88
