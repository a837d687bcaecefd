"""The checks, as data, and the ``servelab doctor`` command."""

import argparse
import json

from servelab.doctor import containers, gpu, local
from servelab.doctor.core import Check, Context, exit_code, run_checks

LOCAL = frozenset({"local"})

# In the order they are shown: a later line may point at an earlier one ("see the gpus line").
CHECKS: tuple[Check, ...] = (
    Check("python", local.python_version),
    Check("linux", local.linux),
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


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "doctor", help="check this machine for the lab: GPUs, PyTorch and ONNX Runtime builds, Docker, Triton",
        description="One line per check (PASS, WARN, FAIL, SKIP) with the fix; exit status 1 when a check fails.")
    parser.add_argument("--node", action="store_true",
                        help="the lab's GPU node: GPUs and Docker are required; the local-only checks are left out")
    parser.add_argument("--json", action="store_true", help="print the results as a JSON list")
    parser.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> int:
    results = run_checks(CHECKS, Context(node=args.node))
    if args.json:
        print(json.dumps([r.as_dict() for r in results], indent=2))
    else:
        print(f"servelab doctor ({'lab node' if args.node else 'local'})")
        print("\n".join(r.line() for r in results))
    return exit_code(results)
