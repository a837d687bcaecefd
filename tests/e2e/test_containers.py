"""Every lab stage brought up from its unchanged compose file, for real, on a private Docker engine
(`servelab containers`): the images build on the local stand-in bases, containers become healthy in
the order ``depends_on`` says, `servelab load` gets correct answers through the published port on
127.0.0.1, bad input gets a 4xx, a killed serving container makes GourmetGram answer 502/503 until
the restart policy brings it back, and ``down -v`` leaves nothing behind.

One engine and one runner for the module; stages run in an order that reuses images (fastapi_pt, then
Triton reusing the GourmetGram and Jupyter images). fastapi_onnx with and without batching, on one image,
is played by the dress rehearsal (tests/e2e/test_rehearsal.py: 4_fastapi's core against the containers). Skipped where no engine can be started (no root, no dockerd), never in CI."""

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from servelab.core.inference import OnnxClassifier
from servelab.core.paths import DEFAULT_IMAGE, REPO_ROOT
from servelab.core.postprocess import top1
from servelab.core.preprocess import preprocess
from servelab.core.settings import get_settings
from servelab.servers.triton import client as triton_client
from servelab.servers.triton.configs import STAGES as TRITON_STAGES
from servelab.servers.triton.server import apply_stage
from servelab.tools.containers import compose_tool, node_secrets
from servelab.tools.containers.compose_stages import STAGES, StageRunner, checkout_mounts

pytestmark = [pytest.mark.containers, pytest.mark.slow, pytest.mark.timeout(2400)]

SERVELAB = [sys.executable, "-m", "servelab"]
PHOTO = DEFAULT_IMAGE.read_bytes()
TOKEN = "servelab-test-token"
NOT_AN_IMAGE = b"this is not an image"


@pytest.fixture(scope="module")
def runner(docker_engine, standin_args, artifacts, tmp_path_factory):
    cache = get_settings().servelab_containers_cache.expanduser()
    docker = compose_tool.docker(docker_engine.env, cache)
    args = standin_args
    root = tmp_path_factory.mktemp("containers")
    notebooks = shutil.copytree(REPO_ROOT / "notebooks", root / "notebooks")
    settings = get_settings()
    # Temporary folders in place of the checkout's models/, models_staging/, results/ and notebooks/.
    mounts = checkout_mounts(settings.model_dir, settings.triton_model_repository, root / "results", notebooks)
    runner = StageRunner(docker, root / "work", args, mounts=mounts, free_ports=True)
    yield runner
    for stage in {s.project: s for s in STAGES.values()}.values():  # one per project: what a failed test left up
        runner.down(stage)


@pytest.fixture(scope="module")
def expected():
    """The label and probability the model gives the photo in this process."""
    (answer,) = top1(OnnxClassifier(get_settings().model_dir / "food11.onnx").infer(preprocess(PHOTO)[None]))
    return answer


# --- helpers --------------------------------------------------------------------------------------


def container(runner: StageRunner, stage: str, service: str) -> dict:
    cid = runner.compose(STAGES[stage], "ps", "-q", service).stdout.strip()
    assert cid, f"{service} has no container"
    return json.loads(runner.docker.run("inspect", cid).stdout)[0]


def _time(stamp: str) -> float:
    """Docker's RFC 3339 timestamps (nanoseconds) as seconds, to compare."""
    day, _, rest = stamp.partition("T")
    clock = rest.rstrip("Z").split("+")[0]
    h, m, s = clock.split(":")
    return time.mktime(time.strptime(day, "%Y-%m-%d")) + int(h) * 3600 + int(m) * 60 + float(s[:12])


def assert_healthy_in_order(runner: StageRunner, stage: str, server: str, services: tuple[str, ...]) -> None:
    states = {name: container(runner, stage, name)["State"] for name in services}
    for name, state in states.items():
        assert state["Health"]["Status"] == "healthy", f"{name}: {state['Health']}"
    # GourmetGram depends on the server with `condition: service_healthy`: it started after a passing check.
    passed = [_time(entry["End"]) for entry in states[server]["Health"]["Log"] if entry["ExitCode"] == 0]
    assert passed and min(passed) <= _time(states["flask"]["StartedAt"]), "flask started before its server was healthy"


def bench(kind: str, url: str, tmp_path: Path, *extra: str) -> list[dict]:
    out = tmp_path / f"bench-{kind}-{time.monotonic_ns()}.jsonl"
    done = subprocess.run([*SERVELAB, "load", kind, "--url", url, "--requests", "12", "--concurrency", "1,4",
                           "--out", str(out), *extra], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2
    for record in records:
        assert not record.get("failed") and record["stats"]["errors"] == {}, record
        assert record["stats"]["successes"] == record["stats"]["requests"] == 12
    return records


def classify(flask_url: str, data: bytes) -> requests.Response:
    return requests.post(f"{flask_url}/classify", files={"photo": ("dish.jpg", data, "image/jpeg")}, timeout=60)


def page_label(page: str) -> str:
    return re.search(r'id="label">(.*?)<', page).group(1)


def kill_and_recover(runner: StageRunner, stage: str, service: str, flask_url: str) -> None:
    """SIGKILL the serving container's main process (a crash, not `docker stop`): GourmetGram answers
    502/503 while it is down, and the restart policy brings it back healthy."""
    before = container(runner, stage, service)
    os.kill(before["State"]["Pid"], signal.SIGKILL)
    statuses, deadline = [], time.monotonic() + 30
    while time.monotonic() < deadline and not {502, 503} & set(statuses):
        statuses.append(classify(flask_url, PHOTO).status_code)
    assert {502, 503} & set(statuses), f"GourmetGram answered {statuses} while its backend was down"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        after = container(runner, stage, service)
        if after["RestartCount"] > before["RestartCount"] and after["State"]["Health"]["Status"] == "healthy":
            return
        time.sleep(2)
    raise AssertionError(f"{service} did not come back: {after['State']}")


def assert_nothing_left(runner: StageRunner, stage: str) -> None:
    label = f"label=com.docker.compose.project={STAGES[stage].project}"
    for kind in (["ps", "-a"], ["network", "ls"], ["volume", "ls"]):
        left = runner.docker.run(*kind, "--filter", label, "-q").stdout.split()
        assert not left, f"{' '.join(kind)}: {left}"


def notebook_compose_steps(notebook: str, compose_file: str) -> list[str]:
    """The notebook's shell lines that inspect a running stage (`ps`, `logs`), as the student types them.
    Its `up`/`down` lines are not run as typed: without a GPU they need the no-GPU override."""
    text = (REPO_ROOT / "notebooks" / notebook).read_text()
    blocks = re.findall(r"```(?:shell|bash)\n(.*?)```", text, re.DOTALL)
    prefix = f"docker compose -f docker/{compose_file} "
    return [line for block in blocks for line in block.splitlines()
            if line.startswith(prefix) and line[len(prefix):].split()[0] in ("ps", "logs")]


def run_notebook_steps(runner: StageRunner, notebook: str, stage: str, expect: str) -> None:
    steps = notebook_compose_steps(notebook, STAGES[stage].compose_file)
    assert steps, f"{notebook} shows no `docker compose ... ps|logs` step"
    cache = get_settings().servelab_containers_cache.expanduser()
    env = {**runner.docker.environ(), "DOCKER_CONFIG": str(compose_tool.docker_config(cache)),
           "PATH": f"/usr/bin:{os.environ['PATH']}"}  # Debian's docker client, with our compose plugin
    for step in steps:
        done = subprocess.run(["bash", "-o", "pipefail", "-c", step], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stdout.strip(), f"{step}: {done.stdout}{done.stderr}"
        assert expect in done.stdout or " ps" not in step, f"{step}: {done.stdout}"


def image_id(runner: StageRunner, stage: str, service: str) -> str:
    return container(runner, stage, service)["Image"]


# --- FastAPI stages -------------------------------------------------------------------------------


def test_fastapi_pt_stage(runner, expected, tmp_path):
    running = runner.up(STAGES["fastapi-pt"], extra={"JUPYTER_TOKEN": TOKEN})
    assert_healthy_in_order(runner, "fastapi-pt", "fastapi_server", ("fastapi_server", "flask", "jupyter"))
    api, app = running.url("fastapi_server", 8000), running.url("flask", 5000)
    assert set(running.ports) == {"fastapi_server", "flask", "jupyter"}

    bench("fastapi", api, tmp_path)
    answer = requests.post(f"{api}/predict", json={"image": base64.b64encode(PHOTO).decode()}, timeout=60).json()
    assert answer["prediction"] == expected.label
    assert answer["probability"] == pytest.approx(expected.probability, abs=2e-3)  # torch vs ONNX Runtime
    assert container(runner, "fastapi-pt", "fastapi_server")["Config"]["Image"] == "servelab/fastapi_pt:local"

    bad = requests.post(f"{api}/predict", json={"image": base64.b64encode(NOT_AN_IMAGE).decode()}, timeout=30)
    assert 400 <= bad.status_code < 500, bad.text
    assert classify(app, NOT_AN_IMAGE).status_code == 400
    page = classify(app, PHOTO)  # GourmetGram reaches the server by its service name on the compose network
    assert page.status_code == 200 and page_label(page.text) == expected.label

    jupyter = running.url("jupyter", 8888)
    assert requests.get(f"{jupyter}/api/status", timeout=30).status_code == 403
    assert requests.get(f"{jupyter}/api/status", params={"token": TOKEN}, timeout=30).status_code == 200
    run_notebook_steps(runner, "3_fastapi_setup.md", "fastapi-pt", "fastapi_server")

    kill_and_recover(runner, "fastapi-pt", "fastapi_server", app)
    assert page_label(classify(app, PHOTO).text) == expected.label


# --- Triton ---------------------------------------------------------------------------------------


def test_triton_stage(runner, expected, tmp_path):
    running = runner.up(STAGES["triton"], extra={"JUPYTER_TOKEN": TOKEN})
    assert_healthy_in_order(runner, "triton", "triton_server", ("triton_server", "flask", "jupyter"))
    triton, app = running.url("triton_server", 8000, scheme=""), running.url("flask", 5000)
    server = container(runner, "triton", "triton_server")
    assert server["HostConfig"]["ShmSize"] == 2 * 2**30
    shm = runner.compose(STAGES["triton"], "exec", "-T", "triton_server", "df", "-k", "/dev/shm").stdout
    assert int(shm.splitlines()[1].split()[1]) == 2 * 2**20, shm  # in effect inside: 2 GiB, not Docker's 64 MB

    repository = get_settings().triton_model_repository
    key = node_secrets.read(node_secrets.SECRETS_DIR / "lab.env")["ADMIN_TOKEN"]  # the container's, from .secrets/
    with pytest.raises(RuntimeError, match="HTTP 403"):  # model control answers the node's ADMIN_TOKEN only
        apply_stage(triton, TRITON_STAGES["pt-1"], kind="cpu", onnxruntime=False, repository=repository, key=key + "x")
    for name in ("pt-1", "pt-dyn"):  # switching stage: configs written on the host, loaded by the API
        config = apply_stage(triton, TRITON_STAGES[name], kind="cpu", onnxruntime=False, repository=repository, key=key)
        assert config["parameters"]["servelab_stage"]["string_value"] == f"{name} (cpu)"
        assert image_id(runner, "triton", "triton_server") == server["Image"], "switching stage rebuilt nothing"
        bench("triton", triton, tmp_path, "--model", "food_classifier")
        page = classify(app, PHOTO)
        assert page.status_code == 200 and page_label(page.text) == expected.label
    client = triton_http.InferenceServerClient(triton)
    with pytest.raises(InferenceServerException) as bad:  # our model refuses it: Triton's 400, not a crash
        client.infer("food_classifier", triton_client.image_inputs("http", [NOT_AN_IMAGE]),
                     outputs=triton_client.label_outputs("http"))
    assert str(bad.value.status()) == "400"
    assert classify(app, NOT_AN_IMAGE).status_code == 400

    jupyter = running.url("jupyter", 8888)
    assert requests.get(f"{jupyter}/api/status", timeout=30).status_code == 403
    assert requests.get(f"{jupyter}/api/status", params={"token": TOKEN}, timeout=30).status_code == 200
    run_notebook_steps(runner, "5_triton_setup.md", "triton", "triton_server")

    # Restarted, Triton loads nothing until a stage is applied again (explicit model control).
    kill_and_recover(runner, "triton", "triton_server", app)
    apply_stage(triton, TRITON_STAGES["pt-1"], kind="cpu", onnxruntime=False, repository=repository, key=key)
    assert page_label(classify(app, PHOTO).text) == expected.label

    runner.down(STAGES["triton"])
    assert_nothing_left(runner, "triton")


def test_cli_says_when_no_engine_of_ours_runs(tmp_path):
    env = {**os.environ, "SERVELAB_CONTAINERS_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([*SERVELAB, "containers", "env"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1 and "no engine of ours is running" in done.stdout
    done = subprocess.run([*SERVELAB, "containers", "stop"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and "no engine of ours is running" in done.stdout
