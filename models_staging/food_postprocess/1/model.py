"""food_postprocess (step 3 of food_classifier_ensemble): logits -> label and probability.

LOGITS [N,11] FP32 -> FOOD_LABEL [N,1] BYTES and PROBABILITY [N,1] FP32 (row-wise softmax), with
the class names from the manifest named by the ``manifest`` parameter.
"""

import json

import numpy as np

from servelab.core.artifacts import load_manifest
from servelab.servers.triton import python_backend as backend


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.classes = load_manifest(backend.manifest_path(args, config)).classes

    def execute(self, requests):
        batches = backend.inputs(requests, "LOGITS")
        outputs = backend.prediction_outputs(np.concatenate(batches), self.classes)
        return backend.responses(outputs, backend.split_rows([len(b) for b in batches]))
