"""food_preprocess (step 1 of food_classifier_ensemble): encoded images -> model input tensors.

INPUT_IMAGE [N,1] BYTES (raw bytes or base64 text) -> PIXELS [N,3,224,224] FP32, with servelab's
preprocessing and the sizes from the manifest named by the ``manifest`` parameter. A request with
an undecodable image gets an error response (the ensemble then fails that request only).
"""

import json

from servelab.artifacts import load_manifest
from servelab.settings import get_settings
from servelab.triton import backend


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        manifest = load_manifest(backend.manifest_path(args, config))
        self.preprocess_kwargs = {**manifest.preprocess_kwargs(), "max_pixels": get_settings().max_image_pixels}
        backend.log(f"{args['model_instance_name']}: preprocessing for {manifest.name} "
                    f"(resize {manifest.resize}, crop {manifest.crop})")

    def execute(self, requests):
        images, rows, errors = backend.preprocess_requests(
            backend.inputs(requests, "INPUT_IMAGE"), **self.preprocess_kwargs)
        return backend.responses({"PIXELS": images}, rows, errors)
