"""food_classifier: the Food-11 classifier in PyTorch inside Triton's Python backend.

INPUT_IMAGE [N,1] BYTES, each element one encoded image (raw bytes or base64 text)
-> FOOD_LABEL [N,1] BYTES and PROBABILITY [N,1] FP32 (softmax of the top class).

Every element of every request is preprocessed with servelab (sizes from the manifest next to
this file) and all of them go through ONE forward pass per ``execute`` call. A request with an
undecodable image gets an error response; the other requests in the call are still answered.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils  # exists only inside Triton's Python backend

from servelab.core.inference import TorchClassifier
from servelab.core.preprocess import ImageError
from servelab.core.settings import get_settings
from servelab.servers.triton import python_backend as backend


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        # Where this instance runs, from its instance_group: KIND_GPU with the GPU Triton gave it, or KIND_CPU.
        # KIND_GPU alone moves nothing in the Python backend: the model must put itself on that GPU.
        kind, gpu = args["model_instance_kind"], args["model_instance_device_id"]
        device = f"cuda:{gpu}" if kind == "GPU" else "cpu"
        threads = backend.threads_per_instance(config)
        self.classifier = TorchClassifier(backend.manifest_path(args, config), device=device, threads=threads)
        manifest = self.classifier.manifest
        self.classes = manifest.classes
        self.preprocess_kwargs = {**manifest.preprocess_kwargs(), "max_pixels": get_settings().max_image_pixels}
        note = " -- zero-shot stand-in, not the lab's trained model" if manifest.stand_in else ""
        backend.log(f"{args['model_instance_name']}: {manifest.name} in PyTorch "
                    f"({self.classifier.describe()['dtype']}) on {device}, {threads} CPU threads{note}")

    def execute(self, requests):
        # Triton hands over every request it has for this instance at once (several when it batches).
        images, rows, errors = [], [], []  # all images; which rows are each request's; its error
        for request in requests:
            elements = pb_utils.get_input_tensor_by_name(request, "INPUT_IMAGE").as_numpy()  # [n, 1] bytes
            try:
                decoded, error = backend.request_images(elements, **self.preprocess_kwargs), None
            except ImageError as exc:  # this request fails, the others go on
                decoded, error = [], str(exc)
            rows.append(slice(len(images), len(images) + len(decoded)))
            images += decoded
            errors.append(error)

        # One forward pass for every image of every request (none when all of them failed).
        logits = self.classifier.infer(np.stack(images)) if images else np.zeros((0, len(self.classes)), np.float32)
        outputs = backend.prediction_outputs(logits, self.classes)  # FOOD_LABEL, PROBABILITY: [N, 1] each

        responses = []  # one per request, in the order of the requests
        for row, error in zip(rows, errors):
            if error:  # HTTP 400 / gRPC INVALID_ARGUMENT for the client that sent this request
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError(error, pb_utils.TritonError.INVALID_ARG)))
            else:
                responses.append(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("FOOD_LABEL", outputs["FOOD_LABEL"][row]),
                    pb_utils.Tensor("PROBABILITY", outputs["PROBABILITY"][row])]))
        return responses
