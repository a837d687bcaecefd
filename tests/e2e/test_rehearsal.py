"""The dress rehearsal: the node path played in order, as a student's node plays it (issue 62).

A fresh clone of this checkout's HEAD is the node's ~/servelab, with a HOME of its own; every step is a login shell
(`bash -l`) running the shell blocks of 3_fastapi_setup and 5_triton_setup as the notebooks write them (and
2_create_server_nvidia's node commands from servelab.run.walkthrough.node_setup), on the session's private Docker
engine. Stand-ins only for what this machine lacks, declared in tests/rehearsal.py's STAND_INS. The ways a node
gets its images, in turn: none named (built on the node), a prepared node (the instructor's `bin/node-setup
--snapshot`, then a node without the images loading its archive), a class registry that fails and the runbook's way
on (`bin/node-setup --build`), and a class registry (a real `docker-registry` on 127.0.0.1) that the instructor
pushes to as docs/instructors.md says and a second node, on an empty engine, pulls from. Between them: a later SSH
session, the cores of 4_fastapi, 6_triton_python, 7_triton_onnx and 8_triton_more played against the containers
(tests/rehearsal.py's ``Node.play``), and 11_delete_resources' lines that save the results. With REHEARSAL_RECORD set (`make rehearse`), each step's wall
time goes to docs/records/rehearsal-2cpu.json and .md."""

import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from notebook_harness import TRITON_QUICK_EDITS, perf_analyzer_on_path
from rehearsal import Node, shell_blocks, write_record
from servelab.core.labels import CLASSES
from servelab.core.paths import DEFAULT_IMAGE, REPO_ROOT
from servelab.core.procs import ServerProcess, free_port
from servelab.core.settings import get_settings
from servelab.measure.records import read_records
from servelab.run.walkthrough import node_setup, runbook
from servelab.tools.containers import compose_tool, images
from servelab.tools.containers.compose_stages import STAGES, StageRunner
from servelab.tools.containers.engine import Engine

pytestmark = [pytest.mark.containers, pytest.mark.slow, pytest.mark.timeout(5400)]

RECORD = REPO_ROOT / "docs" / "records" / "rehearsal-2cpu"
NOTEBOOKS = REPO_ROOT / "notebooks"
SETUP = shell_blocks(NOTEBOOKS / "3_fastapi_setup.md")
TRITON = shell_blocks(NOTEBOOKS / "5_triton_setup.md")
SAVE = shell_blocks(NOTEBOOKS / "11_delete_resources.md")
EVERY_SESSION = next(b for b in SETUP if "containers tag" in b)
FIRST_SETUP = SETUP[0]  # cd ~/servelab; bin/node-setup
FASTAPI_UP = next(b for b in SETUP if "docker-compose-fastapi.yaml up" in b)
READY = next(b for b in SETUP if "/ready" in b)
# The instructor's push, as docs/instructors.md writes it (its example registry replaced by the rehearsal's).
IMAGES_PUSH = re.search(r"`make (images-push REGISTRY=)\S+`", (REPO_ROOT / "docs/instructors.md").read_text()).group(1)
# 4_fastapi's core in quick mode (a few requests per measurement); the kernel is on this machine (STAND_INS).
QUICK_4 = {"FASTAPI_URL": "http://127.0.0.1:8000", "FLASK_URL": "http://127.0.0.1:5000", "WAIT_S": 300,
           "SEQUENTIAL_REQUESTS": 4, "SENDERS": 3, "CONCURRENT_REQUESTS": 9, "WARMUP": 1, "APP_PORT": free_port()}
PROLOGUE = "%colors nocolor"
# The Triton notebooks in quick mode; stages switched by the clone's own servelab, as the node's image has it.
QUICK_TRITON = {"TRITON_URL": "127.0.0.1:8000", "FLASK_URL": "http://127.0.0.1:5000", "WAIT_S": 300, "REQUESTS": 4,
                "WARMUP": 1, "STAGE_COMMAND": f"{sys.executable} -m servelab triton stage {{name}} --url 127.0.0.1:8000",
                "PA_WINDOW_S": 1.0, "PA_EXTRA": ["--percentile=95", "--max-trials=3", "--stability-percentage=1000"]}
QUICK_TRITON_OWN = {
    # perf_analyzer on one stage, at each of its loads (the same command on other stages and arrival processes,
    # onnx-dyn's constant and Poisson rates too, runs in the quick lab: test_lab.py). The blocks students write
    # (docs/instructors.md's answers), as they would type them.
    "6_triton_python": {"TRITON_GRPC_URL": "127.0.0.1:8001", "BATCH_REQUESTS": 2, "PA_STAGES": ["pt-1"],
                        "MY_INSTANCE_GROUP": "instance_group [\n  { count: 2, kind: KIND_GPU, gpus: [ 0 ] },\n"
                                             "  { count: 2, kind: KIND_GPU, gpus: [ 1 ] }\n]\n"},
    "7_triton_onnx": {"RATES": [20, 40], "RATE_SECONDS": 0.4, "BATCH_REQUESTS": 2, "PA_STAGES": [],
                      "MY_INSTANCE_GROUP": "instance_group [ { count: 2, kind: KIND_GPU, gpus: [ 0, 1 ] } ]\n",
                      "MY_DYNAMIC_BATCHING": "dynamic_batching {\n  preferred_batch_size: [ 4, 6, 8 ]\n"
                                             "  max_queue_delay_microseconds: 100\n}\n"},
    "8_triton_more": {}}
# The instructor's line on the node to be snapshotted (docs/instructors.md, "A prepared node").
SNAPSHOT = re.search(r"`(cd ~/servelab && bin/node-setup --snapshot)`", (REPO_ROOT / "docs/instructors.md").read_text()).group(1)
FASTAPI_DOWN = "cd ~/servelab\ndocker compose -f docker/docker-compose-fastapi.yaml down"


TRITON_NOTEBOOKS = ["6_triton_python", "7_triton_onnx", "8_triton_more"]
# Each notebook's stages in quick mode (pt-4x4: 8 CPU instances; the variants: as in `make lab`, not here).
QUICK_STAGES = {"6_triton_python": ["pt-1", "pt-dyn", "pt-2x2"],
                "7_triton_onnx": ["onnx-1", "onnx-2", "onnx-dyn", "onnx-b16"], "8_triton_more": ["ensemble"]}

# After each notebook: its runs are the newest records of the file the three share (RECORDS_BEFORE were there
# before it), servelab's are EXPECTED, and perf_analyzer ran right after servelab at every load of the stages in
# PA_STAGES, with the same stage, load and batch.
CHECK_TRITON = """
from servelab.measure.records import read_records

records = read_records(records_file)
assert len(records) == RECORDS_BEFORE + len(runs) and records[RECORDS_BEFORE:] == runs
measured_by = {tool: [r for r in runs if r.tool == tool] for tool in ("servelab", "perf_analyzer")}
# The runs students typed, whose CSV a check cell read (7_triton_onnx, 8_triton_more), at loads servelab measured.
typed = [r for r in measured_by["perf_analyzer"] if "typed" in r.target]
assert {(r.stage, r.load.label()) for r in typed} <= {(r.stage, r.load.label()) for r in measured_by["servelab"]}
assert all(r.stats.throughput_rps > 0 and r.stats.latency.p95_ms for r in typed), typed
measured_by["perf_analyzer"] = [r for r in measured_by["perf_analyzer"] if r not in typed]
assert [(r.stage, r.load.label(), r.batch) for r in measured_by["perf_analyzer"]] == [
    (r.stage, r.load.label(), r.batch) for r in measured_by["servelab"] if r.stage in PA_STAGES]
for r in measured_by["perf_analyzer"]:
    assert r.failed is None and r.stats.successes and r.stats.latency.p95_ms, (r.stage, r.failed)
    assert "--percentile=95" in r.target["command"] and "--input-data" in r.target["command"]
records = measured_by["servelab"]
assert [(r.stage, r.load.label(), r.batch) for r in records] == EXPECTED
for r in records:
    assert r.tool == "servelab" and r.stats.error_count == 0 and r.stats.successes, (r.stage, r.stats)
    assert r.breakdown.source == "triton-stats" and r.breakdown.server_requests >= r.stats.successes
    assert r.stand_in, r.stage  # the offline model everywhere, and the local ONNX stand-in where used
    if r.stage.startswith(("onnx", "ensemble")):
        assert "LOCAL STAND-IN" in r.stand_in
"""

CHECK_PYTHON = CHECK_TRITON + """
# Without dynamic batching Triton runs exactly the batches clients send.
assert {b for r in records if r.stage == "pt-1" for b in r.breakdown.batch_sizes} == {1, 16}
assert set(records[3].breakdown.batch_sizes) == {16}
assert [g["count"] for g in records[5].config["instance_group"]] == [4]  # 2 + 2, on the CPU here
"""

CHECK_ONNX = CHECK_TRITON + """
assert {b for r in records if r.stage == "onnx-1" for b in r.breakdown.batch_sizes} == {1}
assert {b for r in records if r.stage == "onnx-b16" for b in r.breakdown.batch_sizes} == {16}  # the client's batches
assert sum(after.values()) > sum(before.values())
"""

CHECK_MORE = CHECK_TRITON + """
assert "ensemble" not in PA_STAGES  # by default the optional stages are measured by servelab load alone
assert records[-1].config["platform"] == "ensemble"
# The report covers every stage the three notebooks measured, the open-loop runs of 7_triton_onnx too (and
# 4_fastapi's: the node has one results folder).
assert set(ALL_STAGES) <= {r.stage for r in newest}, {r.stage for r in newest}
for plot in ("report.md", "latency_throughput_vs_concurrency.png", "latency_throughput_vs_rate.png",
             "batch_sizes.png", "utilization.png"):
    assert (report.parent / plot).exists(), plot
assert all(stage in report.read_text() for stage in ALL_STAGES)
"""

EXPECTED = {
    "6_triton_python": [("pt-1", "sequential", 1), ("pt-1", "concurrency 8", 1), ("pt-1", "concurrency 16", 1),
                        ("pt-1", "sequential", 16), ("pt-dyn", "concurrency 8", 1), ("pt-2x2", "concurrency 8", 1)],
    "7_triton_onnx": [("onnx-1", "sequential", 1), ("onnx-1", "concurrency 8", 1),
                      *[("onnx-1", f"{arrivals} {rate} req/s", 1) for rate in (20, 40) for arrivals in ("constant", "poisson")],
                      ("onnx-2", "concurrency 8", 1), ("onnx-2", "concurrency 16", 1),
                      *[("onnx-dyn", f"{arrivals} {rate} req/s", 1) for rate in (20, 40) for arrivals in ("constant", "poisson")],
                      ("onnx-b16", "sequential", 16), ("onnx-b16", "concurrency 4", 16)],
    "8_triton_more": [("ensemble", "sequential", 1), ("ensemble", "concurrency 8", 1)],
}


@pytest.fixture(scope="module")
def docker(docker_engine):
    return compose_tool.docker(docker_engine.env, get_settings().servelab_containers_cache.expanduser())


@pytest.fixture(scope="module")
def node(docker_engine, standin_args, docker, artifacts, tmp_path_factory):
    """The node: its HOME and ~/.profile (the stand-ins' variables), and the local compose overrides."""
    cache = get_settings().servelab_containers_cache.expanduser()
    root = tmp_path_factory.mktemp("rehearsal")
    work = root / "overrides"
    runner = StageRunner(docker, work, standin_args)
    for stage in (STAGES["fastapi-pt"], STAGES["triton"]):  # health checks every 3 s, ulimits within this VM's
        runner._write_local_override(stage, None)
        (work / f"{stage.project}.local.yaml").rename(work / stage.compose_file)
    home = root / "home"
    home.mkdir()
    profile = {**docker_engine.env, "DOCKER_CONFIG": str(compose_tool.docker_config(cache)),
               "REHEARSAL_CACHE": str(cache), "REHEARSAL_WORK": str(work), "PYTHONPATH": str(home / "servelab"),
               "MODEL_SOURCE": "offline", **standin_args}
    node = Node(home, profile)
    node.write_profile(root / "stand-ins")
    yield node
    for name in ("fastapi", "triton"):
        node.session(f"teardown {name}", [f"cd ~/servelab\ndocker compose -f docker/docker-compose-{name}.yaml down"],
                     check=False)
    node.steps = [s for s in node.steps if not s["step"].startswith("teardown")]
    if os.environ.get("REHEARSAL_RECORD"):
        write_record(node.steps, RECORD)


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kernel")


@pytest.fixture(scope="module")
def class_registry(tmp_path_factory) -> Iterator[str]:
    """A class registry on 127.0.0.1: Debian's `docker-registry` (the CNCF distribution registry); its name as
    docker/.env writes it. CI must have it (.ci/run installs it)."""
    if not (binary := shutil.which("docker-registry")):
        (pytest.fail if os.environ.get("CI") == "true" else pytest.skip)("no `docker-registry` (apt-get install it)")
    root, port = tmp_path_factory.mktemp("registry"), free_port()
    config = root / "config.yml"
    config.write_text(json.dumps({"version": 0.1, "log": {"level": "warn"},
                                  "storage": {"filesystem": {"rootdirectory": str(root / "data")}},
                                  "http": {"addr": f"127.0.0.1:{port}"}}))
    with ServerProcess([binary, "serve", str(config)], ready_url=f"http://127.0.0.1:{port}/v2/", log=root / "log"):
        yield f"127.0.0.1:{port}/servelab"


def image_events(docker, since: float) -> list[str]:
    """The engine's image events since ``since``: a build tags, a pull pulls. To the millisecond: a whole second
    rounded to the nearest could reach back to the tag of a build that ended just before."""
    out = docker.run("events", "--since", f"{since:.3f}", "--until", f"{time.time() + 1:.3f}", "--filter",
                     "type=image", "--format", "{{.Action}} {{.Actor.ID}}").stdout
    return [e for e in out.splitlines() if e.startswith(("tag", "pull", "build"))]


def remove_tagged(docker, tag: str) -> None:
    """A node without this commit's images (the engine keeps its layer cache: a build replays it)."""
    refs = [r for r in docker.run("image", "ls", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
            if r.endswith(f":{tag}")]
    if refs:
        docker.run("rmi", *refs)


def test_the_node_s_commands_then_no_registry_builds_once(node, docker):
    """2_create_server_nvidia's node commands, then 3_fastapi_setup with no registry: node-setup builds the images
    under the tag compose runs, `up --wait` builds nothing more, and a second node-setup (a prepared node) skips."""
    node.session("2: clone", [node_setup.clone(str(REPO_ROOT)), node_setup.STAFF_KEYS])
    (node.checkout / ".venv").symlink_to(Path(sys.prefix))  # stand-ins: this machine's environment, the model
    shutil.copytree(get_settings().model_dir, node.checkout / "models")
    out = node.session("2: docker present, bin/node-setup --no-images", [node_setup.DOCKER[0], *node_setup.SERVELAB])
    assert "servelab's environment: ready in .venv (skipped)" in out
    tag = images.tag(node.checkout)
    remove_tagged(docker, tag)

    out = node.session("3: bin/node-setup (no registry)", [FIRST_SETUP])
    assert "docker/.env names no registry: building every image on this node" in out
    assert "images: done" in node.wait_for_images("3: images built on the node (layer cache warm)").splitlines()
    since = time.time()
    out = node.session("3: every SSH session, fastapi up --wait, /ready", [EVERY_SESSION, FASTAPI_UP, READY])
    assert json.JSONDecoder().raw_decode(out[out.index("{"):])[0]["status"] == "ready", out
    assert image_events(docker, since) == [], "compose built again what node-setup built"

    out = node.session("3: a prepared node: bin/node-setup again", [FIRST_SETUP])
    assert re.search(rf"images: all \d+ of this commit \({tag}\) on this node \(skipped\)", out), out


def test_a_node_booted_from_the_instructor_s_snapshot_loads_the_archive(node, docker):
    """docs/instructors.md's prepared node: its `bin/node-setup --snapshot` saves this commit's images into
    ~/servelab-images.tar and removes what no two nodes may share; a node booted from the snapshot has an engine
    without them (cc-snapshot leaves Docker's folder out), and its bin/node-setup loads the archive: `up --wait`
    then builds and pulls nothing."""
    root = node.home / "snapshot-root"  # stand-in: the filesystem cc-snapshot archives (no systemd: no unit)
    root.mkdir()
    node.session("teardown fastapi", [FASTAPI_DOWN])
    out = node.session("prepared node: the instructor's bin/node-setup --snapshot",
                       [f"export SNAPSHOT_ROOT={root}", SNAPSHOT])
    assert re.search(r"^  sudo cc-snapshot -e /var/lib/docker (-f )?servelab-\w+$", out, re.MULTILINE), out
    assert (node.home / "servelab-images.tar").stat().st_size > 0 and not (node.checkout / ".secrets").exists()
    remove_tagged(docker, images.tag(node.checkout))
    out = node.session("prepared node: 3: bin/node-setup (a node booted from the snapshot)", [FIRST_SETUP])
    assert "images: loading this commit's images from" in out, out
    assert "images: done" in node.wait_for_images("prepared node: 3: the archive loaded").splitlines()
    since = time.time()
    node.session("prepared node: every SSH session, fastapi up --wait, /ready", [EVERY_SESSION, FASTAPI_UP, READY])
    assert image_events(docker, since) == [], "compose built or pulled after the archive's load"


def test_a_later_ssh_session_reaches_the_same_images(node, docker):
    """A new login shell with the notebook's three lines finds this commit's images and builds none."""
    since = time.time()
    ps = "docker compose -f docker/docker-compose-fastapi.yaml ps --format json"
    out = node.session("later SSH session: its three lines, up --wait, ps", [EVERY_SESSION, FASTAPI_UP, ps])
    services = {json.loads(line)["Service"]: json.loads(line) for line in out.splitlines() if line.startswith("{")}
    tag = images.tag(node.checkout)
    assert services["fastapi_server"]["Image"] == f"servelab/fastapi_pt:{tag}", services
    assert image_events(docker, since) == []


def test_4_fastapi_s_core_against_the_containers(node, docker, kernel_dir):
    """4_fastapi's core as a student plays it: the cells in a kernel, the stage switches typed in SSH sessions,
    every measurement against the compose service; each student's cell (its answer) and its check. The switch
    builds nothing, and the ONNX service, as the notebook's core leaves it, refuses a non-photo and answers through
    GourmetGram."""
    env = node.jupyter_env(EVERY_SESSION, "docker-compose-fastapi.yaml")
    since = time.time()
    text = node.play("4_fastapi", EVERY_SESSION, kernel_dir, QUICK_4, env, prologue=PROLOGUE)
    assert image_events(docker, since) == [], "a stage switch built or pulled"
    records = read_records(node.checkout / "results" / "records.jsonl")
    assert [(r.stage, r.load.label()) for r in records] == [
        ("fastapi-pt", "sequential"), ("fastapi-pt", "concurrency 3"), ("fastapi-onnx", "sequential"),
        ("fastapi-onnx", "concurrency 3")], records
    assert all(r.stats.successes == r.load.requests and r.stats.error_count == 0 for r in records)
    checks = re.findall(r"^(right|wrong)\b.*$", text, re.MULTILINE)
    assert checks and "wrong" not in checks, text
    assert re.search(r"^right: .+ as the service says, and 400 for a non-photo$", text, re.MULTILINE), text
    bad = requests.post("http://127.0.0.1:8000/predict", json={"image": "%%%"}, timeout=30)
    assert bad.status_code in (400, 422), bad.text
    page = requests.post("http://127.0.0.1:5000/classify", files={"photo": ("dish.jpg", DEFAULT_IMAGE.read_bytes(),
                                                                            "image/jpeg")}, timeout=60)
    assert page.status_code == 200 and re.search(r'id="label">[^<]+<', page.text), page.text[:500]


def test_the_triton_stage_from_its_notebook(node):
    """5_triton_setup's blocks as written: the FastAPI stage down, Triton up on the image node-setup built, pt-1
    loaded."""
    blocks = [b for b in TRITON if "nvidia-smi" not in b]  # stand-in: no GPU
    out = node.session("5: stop fastapi, the repository, up --wait, stage pt-1", [EVERY_SESSION, *blocks])
    assert "stage pt-1" in out, out
    answer = requests.get("http://127.0.0.1:8000/v2/models/food_classifier/ready", timeout=10)
    assert answer.status_code == 200


def left_out_here(optional: bool, heading: str, kind: str) -> bool:
    """Everything but the switches to the stages QUICK_STAGES leaves out (pt-4x4: 8 CPU instances; the variants, as
    in `make lab`), whose cells then say they skip, and the monitoring section (no Prometheus or Grafana image)."""
    return "Watch it live" in heading or kind == "shell" and any(w in heading for w in ("Four on each GPU", "INT8, fp16"))


def test_the_triton_notebooks_against_the_container(node, kernel_dir):
    """6_triton_python, 7_triton_onnx and 8_triton_more one after another, as a student plays them, into the node's
    results folder: stages switched from the SSH session and from the cells (the student's config blocks),
    GourmetGram's backend switched by compose, every measurement and check against the compose Triton."""
    from servelab.measure.records import read_records

    env = node.jupyter_env(EVERY_SESSION, "docker-compose-triton.yaml")
    assert env["TRITON_INSTANCE_KIND"] == "cpu" and env["ADMIN_TOKEN"], "compose's no-GPU override, the secrets file"
    results = node.checkout / "results"
    common = {**QUICK_TRITON, "RESULTS": str(results)}
    checks = {"6_triton_python": CHECK_PYTHON, "7_triton_onnx": CHECK_ONNX, "8_triton_more": CHECK_MORE}
    prologue = f"{PROLOGUE}\n{perf_analyzer_on_path()}"
    all_stages = [stage for stages in QUICK_STAGES.values() for stage in stages]
    texts = {}
    for stem in TRITON_NOTEBOOKS:
        before = len(read_records(results / "records.jsonl")) if (results / "records.jsonl").exists() else 0
        epilogue = f"RECORDS_BEFORE = {before}\nEXPECTED = {EXPECTED[stem]!r}\nALL_STAGES = {all_stages!r}\n" + checks[stem]
        texts[stem] = node.play(stem, EVERY_SESSION, kernel_dir, {**common, "STAGES": QUICK_STAGES[stem], **QUICK_TRITON_OWN[stem]},
                                env, left_out=left_out_here, prologue=prologue, epilogue=epilogue,
                                answer_edits=TRITON_QUICK_EDITS[stem])
    python, onnx, more = (texts[stem] for stem in TRITON_NOTEBOOKS)
    # The ONNX-backend client students write (its answer): a Food-11 class and its softmax probability.
    assert re.search(rf"^({'|'.join(map(re.escape, CLASSES))}) (0\.\d{{3}}|1\.000)$", onnx, re.MULTILINE), onnx
    assert re.search(rf"^({'|'.join(map(re.escape, CLASSES))}) [0-9.e-]+$", python, re.MULTILINE), python  # 6's client
    # 6's two clients (HTTP, gRPC), each checked against servelab's own request; its two perf_analyzer runs, each
    # checked against the step's settings, at pt-2x2 a sweep of concurrency 8 and 16.
    assert len(re.findall(r"^right: .+ \([\d.]+\), as servelab's own request for the photo gets$", python, re.MULTILINE)) == 2
    # Its optional cells' checks: the batch of 16, Triton's statistics, the upload to GourmetGram.
    assert re.search(r"^right: .+, for each of the 16 photos$", python, re.MULTILINE), python
    assert re.search(r"^right: [1-9]\d* successful requests since the model was loaded$", python, re.MULTILINE), python
    assert "right: GourmetGram shows " in python
    assert python.count("right: the step's settings and load") == 2, python
    assert re.search(r"^  Concurrency: 16, throughput: [\d.]+ infer/sec, latency \d+ usec \(the step did not measure it\)$",
                     python, re.MULTILINE), python
    # The runs students type: perf_analyzer's own summary of each, and no run that could not start.
    typed = {"6_triton_python": 2, "7_triton_onnx": 7, "8_triton_more": 1}  # 7: two sweeps of two, two of one
    for stem, text in texts.items():
        said = [line for line in text.splitlines() if "rror" in line or "ailed" in line or "not found" in line]
        assert text.count(" infer/sec, latency ") >= typed[stem] and "command not found" not in text, (stem, said)
    # tritonclient code students write: a batch of 16 (6 and 7), the batch statistics (7), the ensemble's steps and
    # a request to it (8).
    assert re.search(r"^16 answers in \d+ ms: \[", python, re.MULTILINE), python
    assert re.search(r"^16 rows: \[", onnx, re.MULTILINE), onnx
    assert re.search(r"^batch of \d+: [1-9]\d* executions, [\d.]+ ms each$", onnx, re.MULTILINE), onnx
    assert re.search(r"^food_preprocess: .* -> .*$", more, re.MULTILINE), more
    # Triton's statistics, read by students: pt-1's time per request by step (6), and per ensemble step (8).
    assert re.search(r"^queue: [\d.]+ ms per request$", python, re.MULTILINE) and "compute_infer: " in python, python
    for model in ("food_preprocess", "food_classifier_onnx", "food_postprocess"):
        assert re.search(rf"^{model}: [1-9]\d* requests, queue [\d.]+ ms, compute [\d.]+ ms per request$", more,
                         re.MULTILINE), more
    assert re.search(rf"^({'|'.join(map(re.escape, CLASSES))}) [0-9.e-]+$", more, re.MULTILINE), more
    assert "$ servelab load triton --url " in python and " --model food_classifier_onnx --input tensor --stage onnx-1" in onnx
    for mode, text in (("triton", python), ("triton_onnx", onnx), ("triton_ensemble", more)):
        assert f"GourmetGram ({mode}): HTTP 200" in text
    assert "skipped: pt-4x4 is not in STAGES" in python
    assert "skipped: onnx-u8 is not in STAGES" in more
    # Each written cell's check says right: the client's class, the batch counts, each typed run's CSV.
    assert re.search(r"^correct: .* [01]\.\d{3}, as the logits food_classifier_onnx returns", onnx, re.MULTILINE), onnx
    assert "executions per batch size, as Triton counts them" in onnx
    for stage, loads, text in (("onnx-2", "concurrency 8, concurrency 16", onnx), ("onnx-1", "poisson 20 req/s, poisson 40 req/s", onnx),
                               ("onnx-dyn", "poisson 20 req/s, poisson 40 req/s", onnx), ("onnx-b16", "concurrency 4", onnx),
                               ("ensemble", "concurrency 8", more)):
        assert f"correct: your perf_analyzer run measured {stage} at {loads}; it joins the report" in text, (stage, text)
    for stage, field, text in (("pt-2x2", "instance_group", python), ("onnx-2", "instance_group", onnx),
                               ("onnx-dyn", "dynamic_batching", onnx)):
        assert f": {stage} with your block (cpu instances here)" in text  # written, then loaded by the student's cell
        assert f"correct: Triton reads this as {stage}'s `{field}`" in text
    assert "[{'name': 'food_classifier_0', 'kind': 'KIND_CPU', 'count': 4" in python  # as Triton loaded it
    # 7 shows each written config beside the one Triton runs, one line each (issue 63): for onnx-dyn they agree.
    shown = re.findall(r"^the file \(.+\): (.+)\nTriton runs \(get_model_config\): (.+)$", onnx, re.MULTILINE)
    batcher = "dynamic_batching { preferred_batch_size: [4, 6, 8] max_queue_delay_microseconds: 100 }"
    assert any(written == running and batcher in running for written, running in shown), shown
    assert any("scheduler: none" in running for _, running in shown), shown  # onnx-2: no batcher added
    # The switches the notebooks have students type ran in the SSH session (the steps' record): where a cell finds
    # another stage loaded, it runs STAGE_COMMAND itself, shows it and says how long it took.
    assert all(f"switched to {name} in " not in text for name, text in (("pt-dyn", python), ("onnx-1", onnx),
                                                                          ("ensemble", more))), texts
    assert "perf_analyzer: windows of " in python  # pt-1's batch of 16 takes longer than the test's 1 s windows
    shown = {stem: [line for line in text.splitlines() if line.startswith("$ ") and "perf_analyzer -m" in line]
             for stem, text in texts.items()}
    assert {stem: len(lines) for stem, lines in shown.items()} == {  # every load of the PA_STAGES given
        "6_triton_python": 4, "7_triton_onnx": 0, "8_triton_more": 0}
    assert "perf_analyzer: not run for ensemble (not in PA_STAGES); servelab load measures it" in more




def test_a_failed_registry_then_the_way_on(node, docker):
    """docker/.env names a registry that does not answer: node-setup's log says FAILED and the runbook's row; the
    way on it names (`bin/node-setup --build`) builds under the registry's names, and compose pulls nothing."""
    node.session("teardown triton", ["cd ~/servelab\ndocker compose -f docker/docker-compose-triton.yaml down"])
    env_file = node.checkout / "docker" / ".env"
    env_file.write_text(re.sub(r"(?m)^SERVELAB_REGISTRY=.*$", f"SERVELAB_REGISTRY=127.0.0.1:{free_port()}/servelab",
                               env_file.read_text()))
    (node.home / "images.log").unlink()
    (node.home / "servelab-images.tar").unlink()  # a node booted from Chameleon's image: no prepared archive
    node.session("registry fails: bin/node-setup", [FIRST_SETUP])
    log = node.wait_for_images("registry fails: ~/images.log")
    assert "images: FAILED" in log and runbook.REGISTRY.advice() in log and "images: done" not in log.splitlines(), log
    way_on = re.search(r"`(bin/node-setup --build)`", runbook.REGISTRY.todo).group(1)
    (node.home / "images.log").unlink()
    node.session("the way on: bin/node-setup --build", [f"cd ~/servelab\n{way_on}"])
    assert "images: done" in node.wait_for_images("the way on: images built under the registry's names").splitlines()
    since = time.time()
    node.session("the way on: every SSH session, fastapi up --wait", [EVERY_SESSION, FASTAPI_UP, READY])
    assert image_events(docker, since) == [], "compose pulled or built after the way on"


def test_a_class_registry_the_instructor_pushes_and_an_empty_node_pulls(node, class_registry, tmp_path):
    """The class's way (docs/instructors.md): the instructor names the registry in docker/.env, commits it and runs
    `make images-push`; a student's node with an empty engine (no base, no layer cache: nothing to build from)
    clones that repository and runs 3_fastapi_setup: node-setup pulls this commit's images, and the stage comes up
    on them alone, building and pulling nothing more."""
    node.session("teardown fastapi", [FASTAPI_DOWN])
    node.session("registry: the instructor names it in docker/.env, commits, make images-push", [
        "cd ~/servelab", f"sed -i 's|^SERVELAB_REGISTRY=.*|SERVELAB_REGISTRY={class_registry}|' docker/.env",
        "git -c user.name=instructor -c user.email=i@example.edu commit -qm 'class registry' docker/.env",
        # stand-in: the environment is this machine's (.venv links to it), so make must not rebuild it
        f"make -o .venv/.installed {IMAGES_PUSH}{class_registry}"], timeout=3600)
    catalog = requests.get(f"http://{class_registry.split('/')[0]}/v2/_catalog", timeout=10).json()["repositories"]
    assert {f"servelab/{name}" for name in ("fastapi_pt", "fastapi_onnx", "flask", "jupyter", "triton_server")} <= set(catalog)

    with Engine(get_settings().servelab_containers_cache.expanduser()) as engine:
        assert not engine.owns_cache, "the student's engine has a data root of its own: nothing built is there"
        docker = compose_tool.docker(engine.env, get_settings().servelab_containers_cache.expanduser())
        student = Node(tmp_path / "student", {**node.profile, **engine.env,
                                               "PYTHONPATH": str(tmp_path / "student" / "servelab")}, node.steps)
        student.home.mkdir()
        student.write_profile(tmp_path / "student-tools")
        student.session("registry: 2: clone the class's repository", [node_setup.clone(str(node.checkout))])
        (student.checkout / ".venv").symlink_to(Path(sys.prefix))
        shutil.copytree(get_settings().model_dir, student.checkout / "models")
        out = student.session("registry: 3: bin/node-setup", [FIRST_SETUP])
        assert "pulling this commit's images" in out, out
        assert "images: done" in student.wait_for_images("registry: 3: images pulled").splitlines()
        since = time.time()
        try:
            student.session("registry: every SSH session, fastapi up --wait, /ready", [EVERY_SESSION, FASTAPI_UP, READY])
            assert image_events(docker, since) == [], "compose pulled or built after node-setup's pull"
            assert_pulled_not_built(docker, class_registry, images.tag(student.checkout))
        finally:
            student.session("teardown student", [FASTAPI_DOWN], check=False)


def assert_pulled_not_built(docker, registry: str, tag: str) -> None:
    """The engine holds this commit's images from the registry, each with its digest there, and nothing else: a
    build would have needed (and left) a base and intermediate images."""
    listed = docker.run("image", "ls", "--all", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
    assert listed and all(ref.startswith(f"{registry}/") and ref.endswith(f":{tag}") for ref in listed), listed
    for ref in listed:
        (image,) = json.loads(docker.run("image", "inspect", ref).stdout)
        assert any(d.startswith(ref.rpartition(":")[0] + "@sha256:") for d in image["RepoDigests"]), image


def test_the_results_are_saved_as_11_delete_resources_says(node, tmp_path):
    """11_delete_resources' scp lines, on the student's computer (a HOME of its own), bring the node's results."""
    laptop = Node(tmp_path / "laptop", {"REHEARSAL_NODE_HOME": str(node.home)}, node.steps)
    laptop.home.mkdir()
    laptop.write_profile(tmp_path / "laptop-tools")
    laptop.session("11: save the results (scp)", SAVE)
    saved = laptop.home / "servelab-results"
    assert (saved / "records.jsonl").is_file() and (laptop.home / "servelab-notebooks").is_dir()
