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
_NO_TOOLKIT = "command -v nvidia-ctk > /dev/null || "  # a prepared node has it: skip the downloads
NVIDIA_TOOLKIT = [
    # NVIDIA's package repository, signed by its key, then the toolkit, registered with Docker.
    f"{_NO_TOOLKIT}curl -fsSL {_NVIDIA_REPO}/gpgkey | sudo gpg --batch --yes --dearmor -o {_KEYRING}",
    f"{_NO_TOOLKIT}curl -fsSL {_NVIDIA_REPO}/stable/deb/nvidia-container-toolkit.list"
    f" | sed 's#deb https://#deb [signed-by={_KEYRING}] https://#'"
    " | sudo tee /etc/apt/sources.list.d/nvidia-container-toolkit.list",
    f"{_NO_TOOLKIT}(sudo apt-get update -q && sudo apt-get install -y -q nvidia-container-toolkit)",
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
NVTOP = "command -v nvtop > /dev/null || sudo apt-get install -y -q nvtop"
# The GPUs on the node, then from inside a throwaway container (Docker and the toolkit work together).
GPU_CHECKS = ["nvidia-smi", "docker run --rm --gpus all ubuntu:24.04 nvidia-smi"]

# servelab's environment, the lab's model and the secrets: the checkout's own script, which 3_fastapi_setup runs too
# and which skips what a prepared node has done.
SERVELAB = [f"cd {CHECKOUT} && bin/node-setup --no-images"]

# The class's staff keys (notebooks/staff_keys.pub, which the instructor commits; none by default) join the node's
# authorized keys, each once, so that `servelab class status --progress` can read which runs the node holds.
STAFF_KEYS = (f"mkdir -p -m 700 ~/.ssh && touch ~/.ssh/authorized_keys && "
              f"grep -sE '^(ssh-|ecdsa-|sk-)' {CHECKOUT}/notebooks/staff_keys.pub | while read -r key; do "
              'grep -qxF "$key" ~/.ssh/authorized_keys || echo "$key" >> ~/.ssh/authorized_keys; done')


def clone(repo_url: str) -> str:
    return f"test -d {CHECKOUT}/.git || git clone {shlex.quote(repo_url)} {CHECKOUT}"


def node_commands(repo_url: str, *, gpu: bool) -> list[str]:
    """Every command, in order: a GPU node also gets the toolkit, the cgroupfs driver, nvtop and the GPU checks."""
    gpu_setup = [*NVIDIA_TOOLKIT, CGROUPFS] if gpu else []
    return [clone(repo_url), STAFF_KEYS, *DOCKER, *gpu_setup, RESTART_DOCKER, *([NVTOP] if gpu else []), *SERVELAB,
            *(GPU_CHECKS if gpu else [])]
