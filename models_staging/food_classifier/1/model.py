"""food_classifier: the Food-11 classifier in PyTorch inside Triton's Python backend.

INPUT_IMAGE [N,1] BYTES, each element one encoded image (raw bytes or base64 text)
-> FOOD_LABEL [N,1] BYTES and PROBABILITY [N,1] FP32 (softmax of the top class).

Every element of every request is preprocessed with servelab (sizes from the manifest next to
this file) and all of them go through ONE forward pass per ``execute`` call. A request with an
undecodable image gets an error response; the other requests in the call are still answered.
"""

import json

import numpy as np

from servelab.inference import TorchClassifier
from servelab.settings import get_settings
from servelab.triton import backend


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        device = backend.instance_device(args)
        threads = backend.threads_per_instance(config)
        self.classifier = TorchClassifier(backend.manifest_path(args, config), device=device, threads=threads)
        manifest = self.classifier.manifest
        self.classes = manifest.classes
        self.preprocess_kwargs = {**manifest.preprocess_kwargs(), "max_pixels": get_settings().max_image_pixels}
        note = " -- zero-shot stand-in, not the lab's trained model" if manifest.stand_in else ""
        backend.log(f"{args['model_instance_name']}: {manifest.name} in PyTorch "
                    f"({self.classifier.describe()['dtype']}) on {device}, {threads} CPU threads{note}")

    def execute(self, requests):
        images, rows, errors = backend.preprocess_requests(
            backend.inputs(requests, "INPUT_IMAGE"), **self.preprocess_kwargs)
        # One forward pass for every image of every request (none when all of them failed).
        logits = self.classifier.infer(images) if len(images) else np.zeros((0, len(self.classes)), np.float32)
        return backend.responses(backend.prediction_outputs(logits, self.classes), rows, errors)
