# Every image the lab uses, defined once: `docker buildx bake` builds them (`make images`), `--push`
# sends them to a registry (`make images-push REGISTRY=...`). docker/.env sets every variable below
# (`make images` exports it; a variable set in the shell wins, which is how `servelab containers` points
# the bases at its local stand-ins). Each image is <SERVELAB_REGISTRY>/<name>:<SERVELAB_TAG>, the names
# the compose files in docker/ run; SERVELAB_TAG is servelab's version and a hash of the images' inputs (`servelab containers tag`).
#
# docker/Dockerfile.python's shared stage is built once per base (python-ubuntu, python-triton, python-sdk;
# python-torch adds PyTorch's CUDA 12.6 build), and each image's FROM names one of them: `contexts` hands
# bake's own build of it to that FROM, and orders the builds.

variable "SERVELAB_REGISTRY" {}
variable "SERVELAB_TAG" {}
variable "TRITON_IMAGE" {}
variable "TRITON_RELEASE" {}
variable "UBUNTU_IMAGE" {}
variable "PYTHON_VERSION" {}
variable "PIP_VERSION" {}
variable "TORCH_VERSION" {}
variable "TORCH_INDEX_URL" {}
variable "ONNXRUNTIME_GPU_VERSION" {}
variable "JUPYTERLAB_VERSION" {}
variable "BASH_KERNEL_VERSION" {}
# The local stand-ins' inputs: docker/standin/ (an absolute path), the folders `servelab containers`
# prepares, its Debian image, and the key of those inputs (an image labelled with it is not rebuilt).
variable "STANDIN_DIR" {}
variable "STANDIN_KEY" {}
variable "STANDIN_DEBIAN_IMAGE" {}
variable "STANDIN_WHEELHOUSE" {}
variable "STANDIN_WORK" {}

function "image" {
  params = [name]
  result = "${SERVELAB_REGISTRY}/${name}:${SERVELAB_TAG}"
}

# The images the node runs; `docker buildx bake` alone builds these.
group "default" {
  targets = ["core", "ray", "redis"]
}

# The core path's (notebooks 3 to 8): what a node without a registry builds (`docker buildx bake core`).
group "core" {
  targets = ["fastapi_pt", "fastapi_onnx", "flask", "jupyter", "triton_server"]
}

# The local stand-ins for NVIDIA's and Ubuntu's images (`servelab containers`, the container tests): run
# with UBUNTU_IMAGE and TRITON_IMAGE pointing at them, the group above builds on them unchanged.
group "standins" {
  targets = ["standin_python", "standin_triton"]
}

target "_versions" {
  context = "."
  args = {
    SERVELAB_REGISTRY       = SERVELAB_REGISTRY
    SERVELAB_TAG            = SERVELAB_TAG
    PYTHON_VERSION          = PYTHON_VERSION
    PIP_VERSION             = PIP_VERSION
    TORCH_VERSION           = TORCH_VERSION
    TORCH_INDEX_URL         = TORCH_INDEX_URL
    ONNXRUNTIME_GPU_VERSION = ONNXRUNTIME_GPU_VERSION
    JUPYTERLAB_VERSION      = JUPYTERLAB_VERSION
    BASH_KERNEL_VERSION     = BASH_KERNEL_VERSION
  }
}

# --- the shared stage, once per base ----------------------------------------------------------------

target "python-ubuntu" {
  inherits   = ["_versions"]
  dockerfile = "docker/Dockerfile.python"
  target     = "python"
  args       = { BASE_IMAGE = UBUNTU_IMAGE }
  tags       = [image("python-ubuntu")]
}

target "python-triton" {
  inherits = ["python-ubuntu"]
  args     = { BASE_IMAGE = "${TRITON_IMAGE}:${TRITON_RELEASE}-py3" }
  tags     = [image("python-triton")]
}

target "python-sdk" {
  inherits = ["python-ubuntu"]
  args     = { BASE_IMAGE = "${TRITON_IMAGE}:${TRITON_RELEASE}-py3-sdk" }
  tags     = [image("python-sdk")]
}

target "python-torch" {
  inherits = ["python-triton"]
  target   = "torch"
  tags     = [image("python-torch")]
}

# --- the images -----------------------------------------------------------------------------------

# Each image: its Dockerfile and the shared stage its FROM names.
target "image" {
  name = item.name
  matrix = {
    item = [
      { name = "fastapi_pt", dockerfile = "fastapi_pt/Dockerfile", base = "python-torch" },
      { name = "fastapi_onnx", dockerfile = "fastapi_onnx/Dockerfile", base = "python-triton" },
      { name = "flask", dockerfile = "flask_app/Dockerfile", base = "python-ubuntu" },
      { name = "jupyter", dockerfile = "docker/Dockerfile.jupyter", base = "python-sdk" },
      { name = "triton_server", dockerfile = "docker/Dockerfile.triton", base = "python-torch" },
      { name = "ray", dockerfile = "docker/Dockerfile.ray", base = "python-triton" },
    ]
  }
  inherits   = ["_versions"]
  dockerfile = item.dockerfile
  contexts   = { "${image(item.base)}" = "target:${item.base}" }
  tags       = [image(item.name)]
}

target "redis" {
  inherits   = ["_versions"]
  dockerfile = "docker/Dockerfile.redis"
  args       = { UBUNTU_IMAGE = UBUNTU_IMAGE }
  tags       = [image("redis")]
}

# --- the local stand-ins (docker/standin/) ----------------------------------------------------------

target "_standin" {
  labels = { "servelab.standin" = STANDIN_KEY }
}

target "standin_python" {
  inherits   = ["_standin"]
  context    = STANDIN_WHEELHOUSE
  dockerfile = "${STANDIN_DIR}/Dockerfile.base"
  args       = { DEBIAN_IMAGE = STANDIN_DEBIAN_IMAGE }
  tags       = [UBUNTU_IMAGE]
}

# NVIDIA's two Triton images: the server (Python backend only) and the SDK (perf_analyzer only), each from
# a folder `servelab containers` fills (STANDIN_WORK/triton, STANDIN_WORK/sdk).
target "standin_triton" {
  name = "standin_${item.folder}"
  matrix = {
    item = [
      { folder = "triton", dockerfile = "Dockerfile.tritonserver", flavour = "py3" },
      { folder = "sdk", dockerfile = "Dockerfile.sdk", flavour = "py3-sdk" },
    ]
  }
  inherits   = ["_standin"]
  context    = "${STANDIN_WORK}/${item.folder}"
  dockerfile = "${STANDIN_DIR}/${item.dockerfile}"
  contexts   = { "${UBUNTU_IMAGE}" = "target:standin_python" }
  args       = { BASE_IMAGE = UBUNTU_IMAGE }
  tags       = ["${TRITON_IMAGE}:${TRITON_RELEASE}-${item.flavour}"]
}
