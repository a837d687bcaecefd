"""The class's way, for real: images built once from docker-bake.hcl, pushed to a registry, and a stage
brought up on another engine from that registry alone.

A real registry on 127.0.0.1 (Debian's `docker-registry`, the CNCF distribution registry); one private
engine builds the stand-in images with this commit's tag and pushes them; a second private engine, with an
empty data root of its own (no base, no stand-in, no build cache: nothing it could build from), brings the
FastAPI stage up with docker/.env's registry set, as a student's node would. Skipped, saying why, where
no engine can be started or there is no `docker-registry`; never in CI."""

import base64
import json
import os
import shutil

import pytest
import requests

from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.procs import ServerProcess, free_port
from servelab.core.settings import get_settings
from servelab.tools.containers import compose_tool, images
from servelab.tools.containers.compose_stages import STAGES, StageRunner, checkout_mounts
from servelab.tools.containers.engine import Engine

pytestmark = [pytest.mark.containers, pytest.mark.slow, pytest.mark.timeout(2400)]

STAGE = STAGES["fastapi-pt"]
REGISTRY_BINARY = "docker-registry"


def _unavailable() -> str:
    reason = Engine.available() or ("" if shutil.which(REGISTRY_BINARY) else
                                    "no docker-registry (`apt-get install docker-registry`)")
    if reason and os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the registry test: {reason}")
    return reason


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    if reason := _unavailable():
        pytest.skip(reason)
    root, port = tmp_path_factory.mktemp("registry"), free_port()
    config = root / "config.yml"
    config.write_text(json.dumps({"version": 0.1, "log": {"level": "warn"},
                                  "storage": {"filesystem": {"rootdirectory": str(root / "data")}},
                                  "http": {"addr": f"127.0.0.1:{port}"}}))
    server = ServerProcess([shutil.which(REGISTRY_BINARY), "serve", str(config)],
                           ready_url=f"http://127.0.0.1:{port}/v2/", log=root / "registry.log").start()
    yield f"127.0.0.1:{port}/servelab"
    server.stop()


def test_a_stage_runs_from_the_registry_alone(registry, docker_engine, standin_args, artifacts, tmp_path):
    cache = get_settings().servelab_containers_cache.expanduser()
    tag = images.tag()
    lab = {"SERVELAB_REGISTRY": registry, "SERVELAB_TAG": tag}
    refs = [f"{registry}/{name}:{tag}" for name in ("fastapi_pt", "flask", "jupyter")]

    # The instructor's machine: the session's engine (its stand-ins built once) bakes the stage's images with this
    # commit's tag and pushes them. It keeps the cache's data root, so the node's engine starts with an empty one.
    docker = compose_tool.docker(docker_engine.env, cache)
    targets = images.plan(docker, ("default",), images.variables({**standin_args, **lab}))
    pushed = images.build(docker, targets, images.for_images(targets, set(refs)))
    for ref in pushed:
        docker.run("push", ref, timeout=1800)
    catalog = requests.get(f"http://{registry.split('/')[0]}/v2/_catalog", timeout=10).json()["repositories"]
    assert {"servelab/fastapi_pt", "servelab/flask", "servelab/jupyter", "servelab/python-torch"} <= set(catalog)

    # A student's node: an engine with nothing in it, docker/.env's registry set, compose pulls.
    with Engine(cache) as node:
        assert not node.owns_cache, "a data root of its own: nothing built before is there"
        pulled_by = compose_tool.docker(node.env, cache)
        assert pulled_by.run("image", "ls", "--quiet").stdout.split() == []
        settings = get_settings()
        (tmp_path / "notebooks").mkdir()  # Jupyter's folder: the stage mounts it
        mounts = checkout_mounts(settings.model_dir, settings.triton_model_repository, tmp_path / "results",
                                 tmp_path / "notebooks")
        runner = StageRunner(pulled_by, tmp_path / "work", {}, mounts=mounts, free_ports=True)
        try:
            running = runner.up(STAGE, extra={**lab, "SERVELAB_PULL_POLICY": "missing"}, build=False)
            assert_pulled_not_built(runner, pulled_by, refs)
            answer = requests.post(f"{running.url('fastapi_server', 8000)}/predict", timeout=60,
                                   json={"image": base64.b64encode(DEFAULT_IMAGE.read_bytes()).decode()})
            assert answer.status_code == 200 and answer.json()["prediction"]
        finally:
            runner.down(STAGE)


def assert_pulled_not_built(runner: StageRunner, docker, refs: list[str]) -> None:
    for service, ref in zip(("fastapi_server", "flask", "jupyter"), refs, strict=True):
        cid = runner.compose(STAGE, "ps", "-q", service).stdout.strip()
        (seen,) = json.loads(docker.run("inspect", cid).stdout)
        assert seen["State"]["Health"]["Status"] == "healthy", seen["State"]
        assert seen["Config"]["Image"] == ref
    # The engine holds the three pulled images, each with the registry's digest, and nothing else: a build
    # would have needed (and left) its base and intermediate images.
    listed = [json.loads(line) for line in docker.run("image", "ls", "--all", "--format", "{{json .}}").stdout.splitlines()]
    assert sorted(f"{i['Repository']}:{i['Tag']}" for i in listed) == sorted(refs)
    for ref in refs:
        (image,) = json.loads(docker.run("image", "inspect", ref).stdout)
        assert any(d.startswith(ref.rpartition(":")[0] + "@sha256:") for d in image["RepoDigests"]), image["RepoDigests"]
