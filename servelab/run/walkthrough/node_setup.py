"""The shell commands that prepare a Chameleon node for the lab, run over SSH by the provisioning
notebooks (``2_create_server_nvidia`` one by one, with why; ``9_ray_setup`` through
``servelab.run.walkthrough.ray_nodes``). Every command can run twice."""

import shlex

from servelab.core.exposure import ingress_ports

CHECKOUT = "~/servelab"

# The node's security groups (2_create_server_nvidia): one per port it lets in from the internet, SSH and
# servelab.core.exposure.PUBLIC, named after its port so that a group found by name has that one rule.
SECURITY_GROUPS = [(f"servelab-allow-tcp-{port}", port, why) for port, why in ingress_ports().items()]

DOCKER = [
    # Docker's own install script, then `cc` may use Docker without sudo.
    "command -v docker > /dev/null || curl -fsSL https://get.docker.com | sudo sh",
    'sudo usermod -aG docker "$USER"',
]

_NVIDIA_REPO = "https://nvidia.github.io/libnvidia-container"
_KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
NVIDIA_TOOLKIT = [
    # NVIDIA's package repository, signed by its key, then the toolkit, registered with Docker.
    f"curl -fsSL {_NVIDIA_REPO}/gpgkey | sudo gpg --batch --yes --dearmor -o {_KEYRING}",
    f"curl -fsSL {_NVIDIA_REPO}/stable/deb/nvidia-container-toolkit.list"
    f" | sed 's#deb https://#deb [signed-by={_KEYRING}] https://#'"
    " | sudo tee /etc/apt/sources.list.d/nvidia-container-toolkit.list",
    "sudo apt-get update -q && sudo apt-get install -y -q nvidia-container-toolkit",
    "sudo nvidia-ctk runtime configure --runtime=docker",
]

# Docker's cgroupfs driver, beside what the toolkit wrote into daemon.json: with systemd's, containers
# can lose their GPUs when systemd reloads (NVIDIA container toolkit issue 48).
_CGROUPFS = ('import json, pathlib; p = pathlib.Path("/etc/docker/daemon.json"); '
             'c = json.loads(p.read_text()) if p.exists() else {}; '
             'c["exec-opts"] = ["native.cgroupdriver=cgroupfs"]; '
             'p.write_text(json.dumps(c, indent=2))')
CGROUPFS = f"sudo python3 -c {shlex.quote(_CGROUPFS)}"
RESTART_DOCKER = "sudo systemctl restart docker"
NVTOP = "sudo apt-get install -y -q nvtop"
# The GPUs on the node, then from inside a throwaway container (Docker and the toolkit work together).
GPU_CHECKS = ["nvidia-smi", "docker run --rm --gpus all ubuntu:24.04 nvidia-smi"]

# servelab in the checkout's .venv (PyTorch's CPU build: on the node it only exports the model) and the
# lab's model in models/, as 3_fastapi_setup does by hand.
SERVELAB = [
    "sudo apt-get update -q && sudo apt-get install -y -q python3-venv",
    f"cd {CHECKOUT} && (test -d .venv || python3 -m venv .venv) && .venv/bin/pip install -q --upgrade pip",
    f"cd {CHECKOUT} && .venv/bin/pip install -q -c constraints.txt --extra-index-url https://download.pytorch.org/whl/cpu torch",
    f'cd {CHECKOUT} && .venv/bin/pip install -q -c constraints.txt -e ".[torch,onnx,bench]"',
    f"cd {CHECKOUT} && .venv/bin/servelab models build --source lab",
    # The compose files' generated secrets in .secrets/ (ADMIN_TOKEN, Grafana's password), never printed.
    f"cd {CHECKOUT} && .venv/bin/servelab secrets",
]


def clone(repo_url: str) -> str:
    return f"test -d {CHECKOUT}/.git || git clone {shlex.quote(repo_url)} {CHECKOUT}"


def node_commands(repo_url: str, *, gpu: bool, servelab: bool) -> list[str]:
    """Every command, in order: a GPU node also gets the toolkit, the cgroupfs driver, nvtop and the
    GPU checks; ``servelab`` adds the environment and the model."""
    gpu_setup = [*NVIDIA_TOOLKIT, CGROUPFS] if gpu else []
    return [clone(repo_url), *DOCKER, *gpu_setup, RESTART_DOCKER, *([NVTOP] if gpu else []),
            *(SERVELAB if servelab else []), *(GPU_CHECKS if gpu else [])]
