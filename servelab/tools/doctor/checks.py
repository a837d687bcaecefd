"""The checks, as data: what ``servelab doctor`` runs, in the order it shows them."""

from servelab.tools.doctor import container_checks as containers
from servelab.tools.doctor import gpu, local
from servelab.tools.doctor.runner import Check

LOCAL = frozenset({"local"})

# In the order they are shown: a later line may point at an earlier one ("see the gpus line").
CHECKS: tuple[Check, ...] = (
    Check("python", local.python_version),
    Check("linux", local.linux),
    Check("cpu-int8", local.int8_instructions, LOCAL),
    Check("gpus", gpu.gpus_result),
    Check("torch-kernels", gpu.torch_kernels),
    Check("pinned-torch", gpu.pinned_torch),
    Check("onnxruntime", gpu.onnxruntime),
    Check("tensorrt", gpu.tensorrt),
    Check("docker", containers.docker),
    Check("nvidia-runtime", containers.nvidia_runtime),
    Check("triton-shm", containers.triton_shm),
    Check("triton-container", containers.triton_container),
    Check("model-artifacts", local.model_artifacts, LOCAL),
    Check("local-tritonserver", local.local_tritonserver, LOCAL),
    Check("perf-analyzer", local.perf_analyzer, LOCAL),
)
