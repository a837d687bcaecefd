"""LOCAL STAND-IN for Triton's ONNX Runtime backend, used only where Triton has none.

On the lab's GPU node this file is ignored: each ONNX model's config.pbtxt says
``backend: "onnxruntime"`` and Triton serves its model.onnx directly. The tritonserver bundled in the
nvidia-pytriton wheel has only the Python backend, so `servelab triton` renders every ONNX model
(food_classifier_onnx and its variants) with ``backend: "python"``, a ``servelab_stand_in``
parameter and this file as its ``default_model_filename``; it runs the model's own
``<version>/model.onnx`` in ONNX Runtime with the input and output its config names (``input`` FP32
[N,3,224,224], or ``image`` UINT8 [N,224,224,3] for the variants; ``output`` FP32 [N,11] logits).
Its timings include the Python backend's overhead and are not those of the ONNX Runtime backend.

Like the FastAPI service it runs under ``ORT_SHAPE_POLICY`` and ``ORT_CUDNN_CONV_ALGO_SEARCH`` (from
the server's environment), with its sessions set up for the config's ``max_batch_size``; each session's
batch size runs once in ``initialize``, so Triton reports the model ready only when it is warm. A GPU
instance refuses to load where the CUDA provider is inactive or does not run with the options asked of
it; its log line names the folders its stub process loaded CUDA's libraries from. Every
session's runs and shape changes are Triton metrics (``servelab_onnx_session_*`` on its metrics port).
``SIMULATED_GPU_MS`` puts it behind the GPU-shaped stand-in (``servelab.core.simulated_gpu``), named in its log line.
"""

import json
from pathlib import Path
from time import perf_counter

import numpy as np
import onnxruntime as ort

from servelab.core.inference import OnnxClassifier, preload_cuda_libraries
from servelab.core.settings import get_settings
from servelab.core.simulated_gpu import SimulatedGPU
from servelab.servers.triton import python_backend as backend


def cuda_from(device: str) -> str:
    """Where this stub process loaded CUDA's libraries from (OnnxClassifier loaded them, once), for its log line."""
    if device == "cpu":
        return ""
    folders = sorted({str(path.parent) for path in preload_cuda_libraries().values()})
    return f"CUDA libraries from {', '.join(folders) or 'nowhere on sys.path'}, "


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.input_name, self.output_name = config["input"][0]["name"], config["output"][0]["name"]
        threads = backend.threads_per_instance(config)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Where this instance runs, from its instance_group: KIND_GPU with the GPU Triton gave it, or KIND_CPU.
        # KIND_GPU alone moves nothing in the Python backend: the session must ask for that GPU.
        kind, gpu = args["model_instance_kind"], args["model_instance_device_id"]
        device = f"cuda:{gpu}" if kind == "GPU" else "cpu"
        settings = get_settings()
        providers = ["CPUExecutionProvider"]
        if kind == "GPU":
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": int(gpu),
                                 "cudnn_conv_algo_search": settings.ort_cudnn_conv_algo_search}))
        onnx_path = Path(args["model_repository"]) / args["model_version"] / "model.onnx"
        # max_batch_size 0: Triton does not batch this model, so there is no batch size to fix.
        max_batch = config.get("max_batch_size", 0)
        self.classifier = OnnxClassifier(onnx_path, providers=providers, session_options=options,
                                         shape_policy=settings.ort_shape_policy if max_batch else "off",
                                         max_batch=max(1, max_batch))
        if device != "cpu" and "CUDAExecutionProvider" not in self.classifier.active_providers:
            raise RuntimeError(f"{device} requested but ONNX Runtime offers only {self.classifier.active_providers}")
        if device != "cpu" and (dropped := self.classifier.options_not_in_force()):
            raise RuntimeError(f"ONNX Runtime does not run with the options asked for: {'; '.join(dropped)}")
        started = perf_counter()
        for size in self.classifier.batch_sizes:  # before initialize returns: Triton is not ready until then
            self.classifier.infer(np.zeros((size, *config["input"][0]["dims"]), self.classifier.input_dtype))
        self.infer = self.classifier.infer
        if settings.simulated_gpu_ms:
            self.infer = SimulatedGPU(self.infer, settings.simulated_gpu_ms, max(1, max_batch))
        self.metrics = backend.SessionMetrics(args["model_name"], args["model_instance_name"])
        self.metrics.update(self.classifier.session_counts())
        # One line per instance: device.instances_say reads the latest line of each instance.
        backend.log(f"{args['model_instance_name']}: LOCAL STAND-IN (Python backend running ONNX Runtime "
                    f"{ort.__version__}, {self.classifier.active_providers} on {device}, {threads} threads, "
                    f"{cuda_from(device)}"
                    f"{self.input_name} {self.classifier.input_dtype}) in place of Triton's onnxruntime backend; "
                    "timings are not the ONNX backend's; "
                    f"ORT_SHAPE_POLICY={self.classifier.shape_policy}: {len(self.classifier.sessions)} session(s), "
                    f"batch sizes {self.classifier.batch_sizes or 'any'}, "
                    f"warmed in {(perf_counter() - started) * 1000:.0f} ms"
                    f"{'; ' + self.infer.label if settings.simulated_gpu_ms else ''}", warn=True)

    def execute(self, requests):
        batches = backend.inputs(requests, self.input_name)
        logits = self.infer(np.concatenate(batches))  # one run for every request
        self.metrics.update(self.classifier.session_counts())
        return backend.responses({self.output_name: logits}, backend.split_rows([len(b) for b in batches]))
