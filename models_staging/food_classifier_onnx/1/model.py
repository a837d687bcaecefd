"""LOCAL STAND-IN for food_classifier_onnx, used only where Triton has no ONNX Runtime backend.

On the lab's GPU node this file is ignored: config.pbtxt says ``backend: "onnxruntime"`` and
Triton serves model.onnx directly. The tritonserver bundled in the nvidia-pytriton wheel has only
the Python backend, so `servelab triton` renders this model with ``backend: "python"`` and a
``servelab_stand_in`` parameter instead, and this file runs model.onnx in ONNX Runtime with the
same input (``input`` FP32 [N,3,224,224]) and output (``output`` FP32 [N,11] logits). Its timings
include the Python backend's overhead and are not those of the ONNX Runtime backend.
"""

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort

from servelab.inference import OnnxClassifier
from servelab.triton import backend


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        threads = backend.threads_per_instance(config)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        device = backend.instance_device(args)
        providers = ["CPUExecutionProvider"]
        if device != "cpu":
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": int(args["model_instance_device_id"])}))
        onnx_path = Path(args["model_repository"]) / args["model_version"] / "model.onnx"
        self.classifier = OnnxClassifier(onnx_path, providers=providers, session_options=options)
        if device != "cpu" and "CUDAExecutionProvider" not in self.classifier.active_providers:
            raise RuntimeError(f"{device} requested but ONNX Runtime offers only {self.classifier.active_providers}")
        backend.log(f"{args['model_instance_name']}: LOCAL STAND-IN (Python backend running ONNX Runtime "
                    f"{ort.__version__}, {self.classifier.active_providers}, {threads} threads) in place of "
                    "Triton's onnxruntime backend; timings are not the ONNX backend's", warn=True)

    def execute(self, requests):
        batches = backend.inputs(requests, "input")
        logits = self.classifier.infer(np.concatenate(batches))  # one run for every request
        return backend.responses({"output": logits}, backend.split_rows([len(b) for b in batches]))
