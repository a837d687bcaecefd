"""The compose files, checked without a Docker engine: the Compose Specification schema, what they
build and mount, the variables each container reads, pinned images, health-gated start, GPUs and
published ports. Each check runs on every compose file under every value of FASTAPI_STAGE."""

import inspect
import re
import shlex
from pathlib import Path

import pytest
import yaml
from pydantic_settings import BaseSettings

import servelab.core.settings
from dockerspec import (
    COMPOSE_FILES,
    DOCKER,
    MONITORING_COMPOSE,
    REPO,
    compose_variants,
    dockerfile_for,
    dockerignored,
    environment,
    load_compose,
    parse_dockerfile,
    read_env_file,
    run_tool,
    variables,
    venv_tool,
)
from servelab.core import exposure
from servelab.run.lab import RESULTS
from servelab.run.walkthrough.ray_nodes import CHECKOUT, CLUSTER_DIR, cluster_files
from servelab.servers.triton.configs import CONFIG_NAME
from servelab.servers.triton.server import control_flags
from servelab.tools.containers import node_secrets

VARIANTS = list(compose_variants())
IDS = [f"{path.stem}{'-' + shell['FASTAPI_STAGE'] if shell else ''}" for path, shell, _ in VARIANTS]
# Services that run the model: they reserve GPUs. Public ports: pages students open in their browser.
SERVING = {"fastapi_server", "triton_server", "ray_head", "ray_worker"}
# The Ray worker for a node without GPUs (compose profile `cpu`): it runs the model on the CPU.
CPU_SERVING = {"ray_worker_cpu"}
# The one list of what the node publishes to the internet (and why), and what the tunnel reaches.
PUBLIC_PORTS = set(exposure.PUBLIC)
# Generated, git-ignored folders that are mounted: the command that writes them.
# Folders a servelab command creates (never committed) -> where servelab says it writes them.
GENERATED = {"models": "servelab models build", "results": "servelab lab and the notebooks"}
# Variables read by third-party software in the images rather than by servelab.
EXTERNAL_VARIABLES = {"JUPYTER_TOKEN": "Jupyter Server's token", "RAY_AUTH_MODE": "Ray's token authentication",
                      "RAY_AUTH_TOKEN_PATH": "Ray's token authentication",
                      # Read by Ray's clients, and by servelab.core.settings once the local Ray stages (branch ray-serve) are in.
                      "RAY_ADDRESS": "the Ray cluster to connect to"}
RAY_FILES = {"docker-compose-ray-head.yaml", "docker-compose-ray-worker.yaml"}


def services(document: dict) -> dict[str, dict]:
    return document["services"]


def settings_fields() -> dict[str, bool]:
    """Every variable servelab.core.settings reads (upper case), mapped to whether it has a default."""
    fields = {}
    for _, cls in inspect.getmembers(servelab.core.settings, inspect.isclass):
        if issubclass(cls, BaseSettings) and cls.__module__ == servelab.core.settings.__name__:
            for name, field in cls.model_fields.items():
                fields[name.upper()] = not field.is_required()
    return fields


@pytest.mark.parametrize(("path", "shell", "document"), VARIANTS, ids=IDS)
def test_compose_file_matches_the_compose_specification(path, shell, document, tmp_path):
    """Checked as Compose checks it: after interpolation (a variable may choose the pull policy)."""
    assert venv_tool("check-jsonschema").exists(), "check-jsonschema comes with the test extra"
    resolved = tmp_path / path.name
    resolved.write_text(yaml.safe_dump(document))
    result = run_tool("check-jsonschema", "--builtin-schema", "vendor.compose-spec", str(resolved))
    assert result.returncode == 0, result.stdout + result.stderr


def test_both_stages_have_compose_files():
    assert {p.name for p in COMPOSE_FILES} == {"docker-compose-fastapi.yaml", "docker-compose-triton.yaml", *RAY_FILES}


@pytest.mark.parametrize(("path", "shell", "document"), VARIANTS, ids=IDS)
def test_builds_come_from_this_repository(path, shell, document):
    for name, service in services(document).items():
        assert "build" in service, f"{name}: every image is built from this repository"
        context = (path.parent / service["build"]["context"]).resolve()
        assert context == REPO, f"{name}: the build context must be the repository root (to install servelab)"
        assert dockerfile_for(service, path).is_file(), f"{name}: no {service['build']['dockerfile']}"
        assert service.get("pull_policy") == "build", f"{name}: never pull a same-named image from a registry"
        tag = service["image"].rpartition(":")[2]
        assert tag and tag != "latest", f"{name}: {service['image']}"


def test_stage_switch_changes_the_image_not_the_file():
    fastapi = [(path, doc["services"]["fastapi_server"]) for path, _, doc in VARIANTS
               if path.name == "docker-compose-fastapi.yaml"]
    built = {dockerfile_for(service, path).relative_to(REPO).as_posix() for path, service in fastapi}
    images = {service["image"] for _, service in fastapi}
    assert built == {"fastapi_pt/Dockerfile", "fastapi_onnx/Dockerfile"}
    assert len(images) == 2, "each stage must have its own image, so switching back needs no rebuild"


@pytest.mark.parametrize(("path", "shell", "document"), VARIANTS, ids=IDS)
def test_bind_mounts_are_relative_and_exist(path, shell, document):
    ignored = {line.strip("/") for line in (REPO / ".gitignore").read_text().split()}
    for name, service in services(document).items():
        for volume in service.get("volumes", []):
            assert isinstance(volume, dict) and volume["type"] == "bind", f"{name}: use the long bind syntax"
            source = volume["source"]
            assert source.startswith("."), f"{name}: {source} must be relative to the compose file"
            host = (path.parent / source).resolve()
            assert host.is_relative_to(REPO), f"{name}: {source} is outside the repository"
            top = host.relative_to(REPO).parts[0]
            if top in GENERATED:
                # Created by a servelab command, not committed: git-ignored, and where that command writes.
                assert top in ignored, f"{top}/ is generated by `{GENERATED[top]}` and must be git-ignored"
                assert REPO / top in {servelab.core.settings.ModelSettings.model_fields["model_dir"].default, RESULTS}
            else:
                assert host.is_dir(), f"{name}: {source} does not exist"


@pytest.mark.parametrize(("path", "shell", "document"), VARIANTS, ids=IDS)
def test_every_variable_a_container_reads_has_a_value_or_a_default(path, shell, document):
    """Compose sets a value, or passes the shell's through to servelab's documented default."""
    known = settings_fields()
    for name, service in services(document).items():
        for variable, value in environment(service).items():
            if variable in EXTERNAL_VARIABLES:
                continue
            assert variable in known, f"{name}: {variable} is not read by servelab.core.settings (typo?)"
            if value is None:
                assert known[variable], f"{name}: {variable} is passed through but has no default"
    required = [v for v, has_default in known.items() if not has_default]
    for name, service in services(document).items():
        missing = [v for v in required if not environment(service).get(v)]
        assert not missing, f"{name}: no value for {missing}, which servelab.core.settings requires"


def test_container_variables_are_documented():
    readme = (DOCKER / "README.md").read_text()
    for _, _, document in VARIANTS:
        for name, service in services(document).items():
            for variable in environment(service):
                assert f"`{variable}`" in readme, f"docker/README.md does not document {variable} ({name})"


def _healthcheck(service: dict, dockerfile: Path) -> bool:
    check = service.get("healthcheck")
    if check is not None:
        return not check.get("disable") and check.get("test") not in (None, ["NONE"])
    return any(i.keyword == "HEALTHCHECK" and "NONE" not in i.args for i in parse_dockerfile(dockerfile))


@pytest.mark.parametrize(("path", "shell", "document"), VARIANTS, ids=IDS)
def test_every_service_has_a_health_check(path, shell, document):
    for name, service in services(document).items():
        assert _healthcheck(service, dockerfile_for(service, path)), f"{name}: no health check"


@pytest.mark.parametrize(("path", "shell", "document"), VARIANTS, ids=IDS)
def test_dependents_start_once_the_server_is_healthy(path, shell, document):
    all_services = services(document)
    for name, service in all_services.items():
        for target, condition in (service.get("depends_on") or {}).items():
            assert condition.get("condition") == "service_healthy", f"{name} -> {target}"
            assert target in all_services
    serving = (SERVING | CPU_SERVING) & set(all_services)
    assert serving, "each compose file runs a model server"
    if "flask" in all_services:  # the Ray worker's file runs Ray only
        assert set(all_services["flask"]["depends_on"]) == serving


@pytest.mark.parametrize(("path", "shell", "document"), VARIANTS, ids=IDS)
def test_gpus_reserved_for_the_serving_containers_only(path, shell, document):
    for name, service in services(document).items():
        devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        if name in SERVING:
            assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices), name
        elif name == "jupyter":
            # The load generator in the notebooks reads GPU utilization through NVML.
            assert all("utility" in d.get("capabilities", []) for d in devices), name
        else:
            assert not devices, f"{name} needs no GPU"


def _published(port: str) -> tuple[str, int]:
    """(host address, container port) of a short-syntax port mapping."""
    parts = port.split(":")
    host_ip = parts[0] if len(parts) == 3 else "0.0.0.0"
    return host_ip, int(parts[-1].split("/")[0])


@pytest.mark.parametrize(("path", "shell", "document"), VARIANTS, ids=IDS)
def test_only_browser_pages_are_published_on_all_interfaces(path, shell, document):
    for name, service in services(document).items():
        for port in service.get("ports", []):
            host_ip, container_port = _published(str(port))
            if (name, container_port) not in PUBLIC_PORTS:
                assert host_ip == "127.0.0.1", f"{name}:{container_port} must be published on 127.0.0.1 only"


def _all_published() -> list[tuple[str, str, str, int]]:
    """(file, service, host address, container port) of every published port, the monitoring file's too."""
    documents = [(path.name, document) for path, _, document in VARIANTS]
    documents.append((MONITORING_COMPOSE.name, load_compose(MONITORING_COMPOSE)))
    return [(name, service_name, *_published(str(port)))
            for name, document in documents for service_name, service in services(document).items()
            for port in service.get("ports", [])]


def test_every_port_open_to_the_internet_is_on_the_written_list():
    published = _all_published()
    assert published, "the files publish ports"
    public = {(service, port) for _, service, host, port in published if host != "127.0.0.1"}
    assert public <= PUBLIC_PORTS, f"published on every address but not in servelab.core.exposure.PUBLIC: {public - PUBLIC_PORTS}"
    assert public == PUBLIC_PORTS, "an entry of the list that no file publishes any more: take it off"
    assert all(why for why in exposure.PUBLIC.values()), "each public port says why"
    local = {port for _, _, host, port in published if host == "127.0.0.1"}
    assert local <= set(exposure.TUNNELLED), f"on 127.0.0.1 but not among what the tunnel reaches: {local - set(exposure.TUNNELLED)}"
    assert {8000, 8001, 8002, 8888, 3000, 9090} <= local
    assert not set(exposure.public_ports()) & set(exposure.TUNNELLED), "a port is either public or tunnelled"


def test_the_fastapi_service_and_its_admin_are_on_the_node_only():
    for path, _, document in VARIANTS:
        server = services(document).get("fastapi_server")
        if server:
            assert [_published(p) for p in server["ports"]] == [("127.0.0.1", 8000)], path.name


def test_generated_secrets_are_read_from_the_ignored_folder_and_never_written_in_the_files():
    """ADMIN_TOKEN reaches the FastAPI server, Triton and both Jupyters, Grafana's admin password reaches Grafana, both
    from the files `servelab secrets` writes into .secrets/ (git-ignored, outside every build context)."""
    wanted = {("docker-compose-fastapi.yaml", "fastapi_server"): "lab.env", ("docker-compose-fastapi.yaml", "jupyter"): "lab.env",
              ("docker-compose-triton.yaml", "triton_server"): "lab.env", ("docker-compose-triton.yaml", "jupyter"): "lab.env",
              (MONITORING_COMPOSE.name, "grafana"): "grafana.env"}
    raw = {path.name: yaml.safe_load(path.read_text()) for path in [*COMPOSE_FILES, MONITORING_COMPOSE]}
    for (name, service), file in wanted.items():
        env_files = raw[name]["services"][service]["env_file"]
        assert env_files == [f"../.secrets/{file}"], (name, service)
        assert (DOCKER / env_files[0]).resolve() == node_secrets.SECRETS_DIR / file
        assert node_secrets.FILES[file] not in environment(raw[name]["services"][service]), "never a value in the file"
    ignored = {line.strip("/") for line in (REPO / ".gitignore").read_text().split()}
    assert ".secrets" in ignored and dockerignored(".secrets/lab.env") and dockerignored(".secrets/grafana.env")
    for name, document in raw.items():
        for service_name, service in document["services"].items():
            assert not set(node_secrets.FILES.values()) & set(environment(service)), f"{name} {service_name}: only from .secrets/"


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=[p.stem for p in COMPOSE_FILES])
def test_no_absolute_host_paths_or_floating_tags(path: Path):
    text = path.read_text()
    assert ":latest" not in text
    assert not re.search(r"(^|[\s\"'])(/home/|~/)", text)


@pytest.mark.parametrize(("path", "shell", "document"), VARIANTS, ids=IDS)
def test_jupyter_keeps_its_token(path, shell, document):
    if "jupyter" not in services(document):
        assert path.name == "docker-compose-ray-worker.yaml"  # the head's file has Jupyter
        return
    jupyter = services(document)["jupyter"]
    commands = [" ".join(jupyter.get("command") or []),
                *(i.args for i in parse_dockerfile(dockerfile_for(jupyter, path)) if i.keyword in ("CMD", "ENTRYPOINT"))]
    assert not any(re.search(r"token\W*=\W*(''|\"\"|\s|$|,)", c, re.IGNORECASE) for c in commands)
    assert environment(jupyter).get("JUPYTER_TOKEN", None) != ""
    assert any(m["target"] == "/lab/notebooks" and m["source"] == "../notebooks" for m in jupyter["volumes"])


def test_triton_runs_the_mounted_repository_with_explicit_model_control():
    path, _, document = next(v for v in VARIANTS if v[0].name == "docker-compose-triton.yaml")
    triton = document["services"]["triton_server"]
    command = " ".join(triton.get("command") or []) or next(
        i.args for i in parse_dockerfile(dockerfile_for(triton, path)) if i.keyword == "CMD")
    assert "--model-control-mode=explicit" in command
    assert f"--model-config-name={CONFIG_NAME}" in command, "the config file `servelab triton stage` writes"
    assert "--cache-config=local,size=" in command, "a stage with response_cache needs the server's cache"
    repository = re.search(r"--model-repository=(\S+?)[\"',\s]", command)[1]
    assert {"source": "../models_staging", "target": repository, "read_only": True}.items() <= triton["volumes"][0].items()
    size = re.fullmatch(r"(\d+)([kmg]?)b?", str(triton["shm_size"]).lower())
    assert int(size[1]) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[size[2]] >= 1 << 30, "several Python-backend instances"
    assert {8000, 8001, 8002} <= {_published(p)[1] for p in triton["ports"]}, "HTTP, gRPC and metrics"


def test_triton_model_control_answers_only_the_nodes_admin_token():
    """The compose Triton starts with the local one's restriction (``control_flags``), keyed by the container's
    ADMIN_TOKEN (from .secrets/, the test above) through sh, which refuses to start it without one."""
    triton = yaml.safe_load((DOCKER / "docker-compose-triton.yaml").read_text())["services"]["triton_server"]
    shell, flag, script = triton["command"]
    assert (shell, flag) == ("sh", "-c") and script.startswith("exec tritonserver ")
    assert set(control_flags("$${ADMIN_TOKEN:?set by servelab secrets}")) <= set(shlex.split(script))


def test_versions_are_passed_from_the_one_versions_file():
    """Each compose file hands every docker/.env entry, and only those, to its builds, by reference."""
    # The monitoring images are pulled as they are, never built: no build needs them.
    versions = {k: v for k, v in read_env_file().items() if k not in variables(MONITORING_COMPOSE.read_text())}
    for path in COMPOSE_FILES:
        raw = yaml.safe_load(path.read_text())
        for name, service in raw["services"].items():
            args = service["build"]["args"]
            assert set(args) == set(versions), f"{path.name} {name}: build args differ from docker/.env"
            for key, value in args.items():
                assert re.fullmatch(rf"\$\{{{key}:\?[^}}]*\}}", value), f"{path.name} {name}: {key}={value}"


# --- the Ray cluster's two files ---------------------------------------------------------------------

RAY_VARIANTS = [(path, document) for path, _, document in VARIANTS if path.name in RAY_FILES]
RAY_SERVICES = {"ray_head", "ray_worker", "ray_worker_cpu"}


def _command(service: dict) -> str:
    command = service.get("command") or []
    return command if isinstance(command, str) else " ".join(command)


def test_ray_head_and_worker_files_are_checked():
    assert [path.name for path, _ in RAY_VARIANTS] == sorted(RAY_FILES)
    assert {name for _, document in RAY_VARIANTS for name in services(document)} == RAY_SERVICES | {"flask", "jupyter"}


@pytest.mark.parametrize(("path", "document"), RAY_VARIANTS, ids=[p.stem for p, _ in RAY_VARIANTS])
def test_ray_nodes_advertise_the_private_address_and_keep_the_rest_on_the_node(path, document):
    """Host networking (Ray opens many ports), so nothing is published: Ray advertises the node's
    private address (it listens on every address; its token and the setup's firewall guard it), its
    dashboard and Jupyter listen on 127.0.0.1; only GourmetGram (the page students open) listens
    everywhere, as in the other files."""
    for name, service in services(document).items():
        assert service.get("network_mode") == "host", name
        assert "ports" not in service, f"{name}: nothing to publish on the host's network"
        command = _command(service)
        if name in RAY_SERVICES:
            assert re.search(r'ray start .*--node-ip-address="\$NODE_PRIVATE_IP"', command), name
            assert command.split()[-1] == "--block", f"{name}: `ray start --block` keeps the container running"
            assert "--disable-usage-stats" in command and "0.0.0.0" not in command, name
        if name == "ray_head":
            assert "--head" in command and "--dashboard-host=127.0.0.1" in command
            # `servelab ray deploy|status`, exec'd in this container, find the cluster without --address.
            assert environment(service)["RAY_ADDRESS"] == "127.0.0.1:6379" and "--port=6379" in command
        elif name in RAY_SERVICES:
            assert '--address="$HEAD_PRIVATE_IP:6379"' in command, name
        if name == "jupyter":
            assert "--ip=127.0.0.1" in command and "0.0.0.0" not in command


@pytest.mark.parametrize(("path", "document"), RAY_VARIANTS, ids=[p.stem for p, _ in RAY_VARIANTS])
def test_every_ray_node_runs_the_same_image_with_the_model_and_the_cluster_token(path, document):
    ignored = {line.strip("/") for line in (REPO / ".gitignore").read_text().split()}
    for name in RAY_SERVICES & set(services(document)):
        service = services(document)[name]
        assert dockerfile_for(service, path) == DOCKER / "Dockerfile.ray" and service["image"] == "servelab/ray:local"
        env = environment(service)
        assert env["MODEL_DIR"] == "/models"
        assert {"source": "../models", "target": "/models", "read_only": True}.items() <= service["volumes"][0].items()
        assert env["RAY_AUTH_MODE"] == "token", f"{name}: Ray's token authentication"
        assert service["secrets"] == ["ray_auth_token"] and env["RAY_AUTH_TOKEN_PATH"] == "/run/secrets/ray_auth_token"
        assert service["env_file"] == ["../.ray-cluster/node.env"]
        size = re.fullmatch(r"(\d+)gb", str(service["shm_size"]).lower())
        assert size and int(size[1]) >= 4, f"{name}: Ray's object store lives in /dev/shm"
    token = (path.parent / document["secrets"]["ray_auth_token"]["file"]).resolve()
    assert token.parent == REPO / ".ray-cluster" and ".ray-cluster" in ignored, "the token is never committed"
    assert dockerignored(".ray-cluster/auth_token"), "nor sent to a build"


def test_the_setup_writes_what_the_ray_commands_read():
    """The node.env that servelab.run.walkthrough.ray_nodes writes on each node defines every variable the
    Ray commands expand, and the token goes where the compose files look for it."""
    written = cluster_files("TOKEN", "10.52.0.2", "10.52.0.1")
    env_text = re.search(r"printf %s '([^']*)' > \S+/node\.env", written)[1]
    defined = dict(line.split("=", 1) for line in env_text.split())
    assert defined == {"NODE_PRIVATE_IP": "10.52.0.2", "HEAD_PRIVATE_IP": "10.52.0.1"}
    for _, document in RAY_VARIANTS:
        for name in RAY_SERVICES & set(services(document)):
            assert set(re.findall(r"\$(\w+)", _command(services(document)[name]))) <= set(defined), name
    assert f"> {CLUSTER_DIR}/auth_token" in written and written.startswith("umask 077")
    assert CLUSTER_DIR.removeprefix(CHECKOUT + "/") == ".ray-cluster"


def test_gourmetgram_on_the_head_calls_ray_serve_like_a_fastapi_stage():
    _, head = next(v for v in RAY_VARIANTS if v[0].name == "docker-compose-ray-head.yaml")
    flask = environment(services(head)["flask"])
    assert flask["BACKEND"] == "fastapi" and flask["FASTAPI_SERVER_URL"] == "http://127.0.0.1:8000"
    assert services(head)["flask"]["depends_on"] == {"ray_head": {"condition": "service_healthy"}}
