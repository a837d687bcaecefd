"""food_preprocess (step 1 of food_classifier_ensemble): encoded images -> model input tensors.

INPUT_IMAGE [N,1] BYTES (raw bytes or base64 text) -> PIXELS [N,3,224,224] FP32, with servelab's
preprocessing and the sizes from the manifest named by the ``manifest`` parameter. A request with
an undecodable image gets an error response (the ensemble then fails that request only).
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils  # exists only inside Triton's Python backend

from servelab.core.artifacts import load_manifest
from servelab.core.preprocess import ImageError
from servelab.core.settings import get_settings
from servelab.servers.triton import python_backend as backend


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        manifest = load_manifest(backend.manifest_path(args, config))
        self.preprocess_kwargs = {**manifest.preprocess_kwargs(), "max_pixels": get_settings().max_image_pixels}
        backend.log(f"{args['model_instance_name']}: preprocessing for {manifest.name} "
                    f"(resize {manifest.resize}, crop {manifest.crop})")

    def execute(self, requests):
        # No model to batch for here: each request is answered on its own.
        responses = []
        for request in requests:
            elements = pb_utils.get_input_tensor_by_name(request, "INPUT_IMAGE").as_numpy()  # [n, 1] bytes
            try:
                pixels = np.stack(backend.request_images(elements, **self.preprocess_kwargs))
            except ImageError as exc:  # this request fails, the others go on
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("PIXELS", pixels)]))
        return responses
