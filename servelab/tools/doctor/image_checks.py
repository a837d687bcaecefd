"""``servelab doctor --images``: every lab image of this commit, pulled where a registry is named, run once to
show what only a build on the real bases can (torch's ``sm_60`` kernels, read without a GPU; ONNX Runtime's CUDA
provider; Triton's stub; perf_analyzer). A stand-in build says so instead of passing for the real one.
"""

import json
from functools import partial

from servelab.tools.containers import images
from servelab.tools.doctor.container_checks import STUB
from servelab.tools.doctor.runner import Check, Context, Result

# Python run in each image: the modules it must import, then what else it checks; prints one JSON line.
PROBE = """
import importlib, json, subprocess, sys
problems, seen = [], []
for module in {modules!r}:
    try:
        importlib.import_module(module)
    except Exception as exc:
        problems.append(f"import {{module}}: {{exc}}")
extra = {extra!r}
if "torch" in extra:
    import torch
    # The kernels compiled into the build (CUDA builds only): read without a GPU, unlike get_arch_list().
    flags = getattr(torch._C, "_cuda_getArchFlags", lambda: "")() or ""
    seen.append(f"torch {{torch.__version__}} kernels: {{flags or 'none (CPU build)'}}")
    if torch.version.cuda is None:
        seen.append("a CPU build: a local stand-in, not the node's image")
    elif "sm_60" not in flags.split():
        problems.append(f"torch {{torch.__version__}} has no sm_60 kernels (the P100s): {{flags}}")
if "onnxruntime" in extra:
    import onnxruntime
    providers = onnxruntime.get_available_providers()
    seen.append(f"onnxruntime {{onnxruntime.__version__}}: {{', '.join(providers)}}")
    if "CUDAExecutionProvider" not in providers:
        problems.append("onnxruntime has no CUDA provider")
if "stub" in extra:
    said = subprocess.run([{stub!r}], capture_output=True, text=True)
    (seen if "arguments" in said.stdout + said.stderr else problems).append(
        "Python-backend stub: " + (said.stdout + said.stderr).strip()[-200:])
if "perf_analyzer" in extra:
    said = subprocess.run(["perf_analyzer", "--version"], capture_output=True, text=True)
    (seen if said.returncode == 0 else problems).append("perf_analyzer: " + (said.stdout + said.stderr).strip()[-200:])
print(json.dumps({{"problems": problems, "seen": seen}}))
"""

# Image -> (modules its service imports, the extra checks).
IMAGES = {
    "fastapi_pt": (("servelab", "fastapi_pt.app"), ("torch",)),
    "fastapi_onnx": (("servelab", "fastapi_onnx.app"), ("onnxruntime",)),
    "flask": (("servelab", "flask_app.app"), ()),
    "jupyter": (("servelab", "jupyterlab", "tritonclient.http", "bash_kernel"), ("perf_analyzer",)),
    "triton_server": (("servelab", "pytriton"), ("torch", "stub")),
    "ray": (("servelab", "ray.serve", "fastapi_onnx.app"), ("onnxruntime",)),
}


def lab_image(name: str, ctx: Context) -> Result:
    label = f"image {name}"
    registry = images.registry()
    ref = f"{registry}/{name}:{images.tag(ctx.repo)}"
    pulled = ""
    if registry != images.LOCAL:
        out = ctx.output(("docker", "pull", "--quiet", ref), timeout_s=3600)
        if not out.ok:
            return Result(label, "fail", f"cannot pull {ref}: {out.why()}",
                          "push this commit's images: make images-push REGISTRY=... (docs/instructors.md)")
        pulled = " (pulled)"
    elif not ctx.output(("docker", "image", "inspect", "--format", "{{.Id}}", ref)).ok:
        return Result(label, "fail", f"{ref} is not here and docker/.env names no registry",
                      "build them: make images, or `docker load -i` the class's archive")
    modules, extra = IMAGES[name]
    probe = PROBE.format(modules=modules, extra=extra, stub=STUB)
    out = ctx.output(("docker", "run", "--rm", "--pull", "never", "--entrypoint", "python", ref, "-c", probe),
                     timeout_s=300)
    if not out.ok:
        return Result(label, "fail", f"{ref} did not run: {out.why()}", "rebuild it: make images (docs/instructors.md)")
    said = json.loads(out.stdout.strip().splitlines()[-1])
    if said["problems"]:
        return Result(label, "fail", f"{ref}: {'; '.join(said['problems'])}", "rebuild it: make images")
    return Result(label, "pass", f"{ref}{pulled}: " + "; ".join(["imports load", *said["seen"]]))


CHECKS: tuple[Check, ...] = tuple(Check(f"image {name}", partial(lab_image, name)) for name in IMAGES)
