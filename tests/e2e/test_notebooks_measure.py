"""The lab's stage notebooks (3_ to 8_, and 10_ray): their shell commands match the compose files (their
servelab commands parse: test_shown_commands.py), and 4_fastapi runs end to end against real local stages
(10_ray: test_ray_walkthrough.py; the Triton notebooks are played against the compose Triton by the dress
rehearsal, tests/e2e/test_rehearsal.py, and their walkthrough's failure paths are held here against the bundled
tritonserver).

``4_fastapi`` runs against ``servelab serve`` processes (PyTorch, ONNX Runtime with and without dynamic batching,
the variants, the bounded and the cached service) and a GourmetGram in front of the first, in quick mode (a few
requests per measurement) through its parameters cells.
"""

from __future__ import annotations

import ast
import asyncio
import re
import shlex
import sys
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import pytest
from pydantic import ValidationError

from dockerspec import REPO, dockerfile_for, load_compose
from notebook_harness import execute, parameters_cells
from servelab.core.catalogue import QUEUE_BOUND, STAGES, bounded, cached_name, stages_taught_in, with_cache
from servelab.core.installers.redis_install import RedisNotFound
from servelab.core.installers.redis_install import locate as locate_redis
from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.procs import ServerProcess, free_port
from servelab.core.settings import Settings
from servelab.run.walkthrough.walk_triton import TritonWalkthrough, batch_count_change
from servelab.servers.fastapi.admin import reload
from servelab.servers.fastapi.cache import LocalRedis
from servelab.servers.triton import server as triton_server
from servelab.servers.triton.configs import STAGES as TRITON_STAGES
from servelab.tools.render_notebooks import NOTEBOOK_DIR, sources, to_notebook
from tools import located_or_skipped

TRITON_NOTEBOOKS = ["6_triton_python", "7_triton_onnx", "8_triton_more"]
STAGE_NOTEBOOKS = ["3_fastapi_setup", "4_fastapi", "5_triton_setup", *TRITON_NOTEBOOKS, "10_ray"]
SHELL_BLOCK = re.compile(r"^```shell\n(.*?)^```", re.MULTILINE | re.DOTALL)
ASSIGNMENT = re.compile(r"^([A-Z_][A-Z0-9_]*)=(.*)$")
PROLOGUE = "%colors nocolor"


# --- the commands students type into the node's shell -----------------------------------------


def shell_commands(stem: str) -> list[tuple[dict[str, str], list[str]]]:
    """Every simple command in the notebook's ```shell blocks: (VAR=value prefixes, argv)."""
    commands = []
    for block in SHELL_BLOCK.findall((NOTEBOOK_DIR / f"{stem}.md").read_text()):
        for line in block.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            words: list[str] = []
            for word in [*shlex.split(line), "&&"]:
                if word not in ("&&", "|", ";"):
                    words.append(word)
                    continue
                env = {}
                while words and (m := ASSIGNMENT.match(words[0])):
                    env[m[1]] = m[2]
                    words.pop(0)
                if words:
                    commands.append((env, words))
                words = []
    return commands


def all_commands() -> list[tuple[str, dict[str, str], list[str]]]:
    return [(stem, env, argv) for stem in STAGE_NOTEBOOKS for env, argv in shell_commands(stem)]


def commands_of(program: str) -> list:
    """The commands running ``program``, as test parameters named by the command line."""
    return [pytest.param(stem, env, argv, id=f"{stem}: {shlex.join([f'{k}={v}' for k, v in env.items()] + argv)}")
            for stem, env, argv in all_commands() if argv[0] == program]


def parameters(stem: str) -> dict:
    """The default values of the notebook's parameters."""
    values = {}
    for cell in parameters_cells(to_notebook(NOTEBOOK_DIR / f"{stem}.md")):
        for statement in ast.parse(cell.source).body:
            target = statement.targets[0] if isinstance(statement, ast.Assign) else statement.target
            values[target.id] = ast.literal_eval(statement.value)
    return values


def test_stage_notebooks_exist() -> None:
    assert set(STAGE_NOTEBOOKS) <= {source.stem for source in sources()}


def _compose_parts(argv: list[str]) -> tuple[list[Path], str, list[str]]:
    """(compose files, subcommand, service names) of a
    `docker compose -f FILE [-f FILE] [--profile NAME] SUB [opts] [services]`."""
    assert argv[:3] == ["docker", "compose", "-f"], f"name the compose file: {shlex.join(argv)}"
    paths, rest = [], argv[2:]
    while rest[0] == "-f":
        paths.append(REPO / rest[1])
        rest = rest[2:]
    while rest[0] == "--profile":
        rest = rest[2:]
    sub, *rest = rest
    services = [word for word in rest if not word.startswith("-")]
    # `exec SERVICE COMMAND...`: one service; what it runs is checked with the other commands (shown_commands.py).
    return paths, sub, services[:1] if sub == "exec" else services


@pytest.mark.parametrize(("stem", "env", "argv"), commands_of("docker"))
def test_compose_commands_name_real_files_services_and_variables(stem: str, env: dict[str, str], argv: list[str]) -> None:
    paths, sub, services = _compose_parts(argv)
    assert sub in {"up", "down", "ps", "logs", "build", "pull", "exec"}, sub
    assert all(path.is_file() for path in paths), f"{stem}: no compose file among {paths}"
    documents = [load_compose(path, **env) for path in paths]
    named = {name for document in documents for name in document["services"]}
    assert set(services) <= named, f"{stem}: unknown service in `{shlex.join(argv)}`"
    text = "".join(path.read_text() for path in paths)
    settings_fields = Settings.model_fields
    for name, value in env.items():
        assert re.search(rf"\b{name}\b", text), f"{stem}: {[p.name for p in paths]} do not use {name}"
        if name.lower() in settings_fields:
            try:
                Settings(**{name.lower(): value})
            except ValidationError as exc:
                pytest.fail(f"{stem}: {name}={value} is not a valid setting: {exc}")
    for path, document in zip(paths, documents):
        for service in document["services"].values():
            if "build" in service:
                assert dockerfile_for(service, path).is_file()


def test_pip_installs_use_the_constraints_and_real_extras() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    lines = (REPO / "bin" / "node-setup").read_text().splitlines()  # the node's installs (3_fastapi_setup runs it)
    installs = [argv for argv in (shlex.split(line) for line in lines if "pip install" in line)
                if argv[:2] == [".venv/bin/pip", "install"] and argv[-1] != "pip"]
    assert len(installs) == 2
    for argv in installs:
        assert argv[argv.index("-c") + 1] == "constraints.txt" and (REPO / "constraints.txt").is_file()
        for spec in [word for word in argv if word.startswith(".[")]:
            assert set(spec[2:-1].split(",")) <= set(extras), spec


def test_triton_notebooks_walk_every_stage() -> None:
    """Each stage is switched to by `servelab triton stage`, or loaded from the block the student wrote."""
    switched = [argv[3] for stem in TRITON_NOTEBOOKS for _, argv in shell_commands(stem)
                if argv[:3] == ["servelab", "triton", "stage"]]
    written = [name for stem in TRITON_NOTEBOOKS
               for name in re.findall(r'lab\.write_config\("([\w-]+)"', (NOTEBOOK_DIR / f"{stem}.md").read_text())]
    assert written == ["pt-2x2", "onnx-2", "onnx-dyn"] and not set(written) & set(switched)
    assert set(switched) | set(written) == set(TRITON_STAGES)
    assert switched[0] == "pt-1"
    # Every stage measured by default, each by the notebook that switches to it.
    assert [stage for stem in TRITON_NOTEBOOKS for stage in stages_taught_in(stem)] == list(TRITON_STAGES)
    for stem in TRITON_NOTEBOOKS:
        steps = re.findall(r'^servelab triton stage ([\w-]+)$|lab\.write_config\("([\w-]+)"',
                           (NOTEBOOK_DIR / f"{stem}.md").read_text(), re.MULTILINE)
        assert parameters(stem)["STAGES"] is None and stages_taught_in(stem) == list(dict.fromkeys(a or b for a, b in steps)), stem


def test_fastapi_notebook_switches_services_by_variables_only() -> None:
    # The stage's own commands (the monitoring containers beside it are started with a second -f).
    ups = [(env, argv) for env, argv in shell_commands("4_fastapi")
           if argv[:2] == ["docker", "compose"] and "docker/docker-compose-monitoring.yaml" not in argv]
    assert [env.get("FASTAPI_STAGE") for env, _ in ups] == ["fastapi_onnx"] * 10
    assert ups[1][0].get("MAX_BATCH_SIZE") not in (None, "1")
    assert [env.get("ONNX_VARIANT") for env, _ in ups] == [None, None, "u8", "int8", "fp16"] + [None] * 5
    # Serving in production: fp32 as it was, with the catalogue's queue bound, again, with Redis, again.
    production = [{k: v for k, v in env.items() if k != "FASTAPI_STAGE"} for env, _ in ups[5:]]
    assert production == [{}, {"MAX_QUEUE_REQUESTS": str(QUEUE_BOUND)}, {}, {"CACHE_URL": "redis://redis:6379/0"}, {}]
    assert ups[8][1][4:] == ["--profile", "cache", "up", "-d", "redis", "fastapi_server"]
    text = (NOTEBOOK_DIR / "4_fastapi.md").read_text()
    assert f'"fastapi-onnx-shed", "fastapi_onnx", batching=False, max_queue_requests={QUEUE_BOUND})' in text
    assert bounded(STAGES["fastapi-onnx"]).name == "fastapi-onnx-shed" and cached_name("fastapi-onnx") in text


# --- executed against real local stages --------------------------------------------------------


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kernel")


def _serve(args: list[str], ready_path: str, log: Path, env: dict[str, str] | None = None) -> tuple[ServerProcess, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "servelab", "serve", *args, "--port", str(port)]
    return ServerProcess(cmd, url + ready_path, log, env={"ACCESS_LOG": "0", **(env or {})}, ready_timeout=180), url


def _stop_all(servers: list[ServerProcess]) -> None:
    with ThreadPoolExecutor(len(servers)) as pool:  # each waits seconds for its own graceful stop: side by side
        list(pool.map(lambda server: server.stop(), servers))


def _start_all(stack: ExitStack, servers: list[ServerProcess]) -> None:
    """Start the servers side by side; every one is stopped when the stack closes, started or not."""
    stack.callback(_stop_all, servers)
    with ThreadPoolExecutor(len(servers)) as pool:
        for future in [pool.submit(server.start) for server in servers]:
            future.result()


@pytest.fixture(scope="module")
def fastapi_stages(artifacts, fastapi_onnx: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """fastapi-onnx is the session's (tests/e2e/conftest.py); the others are started here, side by side, with
    the production section's: fastapi-onnx with its queue bounded, and with a Redis cache in front (a
    machine without redis-server skips outside CI, as tests/integration/test_response_cache.py does)."""
    logs = tmp_path_factory.mktemp("fastapi-logs")
    onnx = STAGES["fastapi-onnx"]
    with ExitStack() as stack:
        redis = stack.enter_context(LocalRedis(located_or_skipped(locate_redis, RedisNotFound, "redis-server"), logs / "redis"))
        # Each with its catalogue stage's settings, as the node's compose file starts it (fp16 needs a GPU).
        envs = {name: STAGES[name].fastapi.env for name in ("fastapi-pt", "fastapi-onnx-dyn", "fastapi-onnx-u8",
                                                            "fastapi-onnx-int8")}
        envs |= {bounded(onnx).name: bounded(onnx).fastapi.env, cached_name(onnx.name): with_cache(onnx, redis.url).fastapi.env}
        stages = {name: _serve([STAGES.get(name, onnx).fastapi.service], "/ready", logs / f"{name}.log", dict(env))
                  for name, env in envs.items()}
        urls = {name: url for name, (_, url) in stages.items()} | {"fastapi-onnx": fastapi_onnx}
        flask, flask_url = _serve(["flask", "--backend", "fastapi"], "/health", logs / "flask.log",
                                  {"FASTAPI_SERVER_URL": urls["fastapi-pt"]})
        _start_all(stack, [server for server, _ in stages.values()] + [flask])
        # The notebook rolls the session's fastapi-onnx to INT8 and back; back to fp32 whatever it got to.
        stack.callback(lambda: asyncio.run(reload(fastapi_onnx, variant="fp32")))
        yield {**urls, "flask": flask_url}


CHECK_FASTAPI = """
from servelab.measure.records import read_records

records = read_records(records_file)
assert records == runs
records, production = records[:7], records[7:]
assert [(r.stage, r.config["service"], r.load.label()) for r in records] == [
    ("fastapi-pt", "fastapi_pt", "sequential"), ("fastapi-pt", "fastapi_pt", "concurrency 3"),
    ("fastapi-onnx", "fastapi_onnx", "sequential"), ("fastapi-onnx", "fastapi_onnx", "concurrency 3"),
    ("fastapi-onnx-dyn", "fastapi_onnx", "concurrency 3"),
    ("fastapi-onnx-u8", "fastapi_onnx", "concurrency 3"), ("fastapi-onnx-int8", "fastapi_onnx", "concurrency 3"),
]
for r in records:
    assert r.stats.successes == r.load.requests and r.stats.error_count == 0, r.stats
    assert r.breakdown.source == "server-timing" and r.breakdown.service_ms > 0
    assert r.stand_in  # the offline zero-shot model, said in every record
    assert r.monitors.gpu_note  # utilization is recorded; there is no GPU here, and it says why
assert [r.config["batching"]["enabled"] for r in records] == [False] * 4 + [True] + [False] * 2
assert [r.config["variant"] for r in records] == [None] * 2 + ["fp32"] * 3 + ["u8", "int8"]
assert (report.parent / "report.md").exists() and (report.parent / "latency_throughput_vs_concurrency.png").exists()

# Serving in production: overload without and with the bound, the photo mix without and with the cache, the rollout.
assert [(r.stage, r.config["run"], r.config.get("bound")) for r in production] == [
    ("fastapi-onnx", "overload", "none"), ("fastapi-onnx-shed", "overload", "8 requests"),
    ("fastapi-onnx", "cache", None), ("fastapi-onnx-cache", "cache", None), ("fastapi-onnx", "rollout", None)]
unbounded, shed, uncached, hits, rolled = production
for r in (unbounded, shed):  # 1.5 x what 3 senders got from fp32, open loop, every request kept and accounted for
    assert r.load.mode == "open" and r.config["capacity_rps"] == round(records[3].stats.throughput_rps, 3)
    assert r.load.rate == 1.5 * records[3].stats.throughput_rps and r.load.duration_s == OVERLOAD_S
    assert r.stats.successes + sum(r.stats.shed.values()) + r.stats.error_count == r.stats.requests
    assert len(r.per_request.outcome) == r.stats.requests and r.timeline.p99_ms
assert unbounded.stats.shed == {}  # nothing refuses without a bound
for r in (uncached, hits):
    assert r.target["mix"]["popularity"] == "zipf" and r.stats.successes == MIX_REQUESTS and r.stats.error_count == 0
assert uncached.cache is None and hits.cache.errors == 0 and hits.cache.hits > 0
assert hits.cache.hits + hits.cache.misses == MIX_REQUESTS
o = rolled.rollout
assert rolled.config["to_variant"] == "int8" and o.error is None and o.failed == 0 and rolled.stats.error_count == 0
assert o.new_version and o.new_version not in o.old_versions
assert set(rolled.per_request.version) == {*o.old_versions, o.new_version}
assert back.status_code == 200 and requests.get(f"{onnx.url}/ready", timeout=5).json()["variant"]["name"] == "fp32"
"""


def _outputs(nb) -> str:
    """The code cells' text, as the notebook shows it: a cell's stream chunks run on (on a busy machine the kernel
    may send one `print` in two, `Dairy product` then ` 0.99`), cells apart."""
    return "\n".join("".join(out.get("text", "") for out in cell.get("outputs", []))
                     for cell in nb.cells if cell.cell_type == "code")


def test_fastapi_notebook_measures_every_stage(fastapi_stages: dict[str, str], artifacts, kernel_dir: Path,
                                               tmp_path: Path) -> None:
    results = tmp_path / "results"
    nb = execute(
        "4_fastapi", kernel_dir, tmp_path,
        parameters={
            "FASTAPI_URL": fastapi_stages["fastapi-pt"],
            "STAGE_URLS": {name: fastapi_stages[name] for name in ("fastapi-onnx", "fastapi-onnx-dyn", "fastapi-onnx-u8",
                                                                    "fastapi-onnx-int8", "fastapi-onnx-shed",
                                                                    "fastapi-onnx-cache")},
            "VARIANTS": ["u8", "int8"],
            "FLASK_URL": fastapi_stages["flask"], "WAIT_S": 30,
            "SEQUENTIAL_REQUESTS": 4, "SENDERS": 3, "CONCURRENT_REQUESTS": 9, "WARMUP": 1, "RESULTS": str(results),
            "OVERLOAD_S": 1.5, "MIX_REQUESTS": 30, "ROLLOUT_S": 2, "ROLLOUT_AT_S": 1,
            "MODELS": str(artifacts.manifest.parent), "APP_PORT": free_port(), "PHOTOS": 16,
        },
        prologue=PROLOGUE, epilogue=CHECK_FASTAPI, timeout=120,
    )
    text = _outputs(nb)
    # The timing loop students write (docs/instructors.md's answer), then the helper, which shows its command and
    # checks the student's figures against its own run of the same load (here and after the senders).
    assert re.search(r"^median [\d.]+ ms, p95 [\d.]+ ms, p99 [\d.]+ ms, [\d.]+ req/s$", text, re.MULTILINE), text
    assert len(re.findall(r"^right: median [\d.]+ ms \(servelab load: [\d.]+\); throughput ", text, re.MULTILINE)) == 2, text
    assert f"$ servelab load fastapi --url {fastapi_stages['fastapi-pt']} --stage fastapi-pt --requests 4 --warmup 1" in text
    # The senders students write (3 threads, 9 requests), beside the helper's run of the same load.
    assert re.search(r"^3 senders: median [\d.]+ ms, p95 [\d.]+ ms, p99 [\d.]+ ms, [\d.]+ req/s$", text, re.MULTILINE), text
    # The app students write, served in the kernel: ONNX Runtime on the CPU, the service's class, a 400 for a non-photo.
    assert "providers: ['CPUExecutionProvider']" in text
    assert re.search(r"^right: .+ \([\d.]+\) as the service says, and 400 for a non-photo$", text, re.MULTILINE), text
    # What students read themselves: the batch histogram, INT8's agreement, the shed counter, the answering version.
    assert re.search(r"^mean batch: [\d.]+ images$", text, re.MULTILINE), text
    assert re.search(r"^right: [\d.]+ images per inference, on average", text, re.MULTILINE), text
    assert re.search(r"^16 photos: INT8 and fp32 agree on [\d.]+% of top classes; largest probability change [\d.]+$",
                     text, re.MULTILINE), text
    assert 'servelab_shed_requests_total{reason="queue_full"}' in text
    versions = re.findall(r"^X-Model-Version: (\S+) model_version: (\S+)$", text, re.MULTILINE)
    assert len(versions) == 3 and all(a == b == versions[0][0] for a, b in versions), versions
    assert text.count("GourmetGram: HTTP 200") == 1
    assert "Little's law: 3 requests in flight" in text
    assert text.count("one inference at a time, ") == 3  # the ceiling, from each concurrent run's own numbers
    assert (results / "fastapi" / "report.md").exists()
    assert "skipped: fp16 is not in VARIANTS" in text
    # The batching stage's sessions, read back after its run: on a CPU one session of any shape (policy off).
    assert "shape policy off:" in text and "session for batch any:" in text
    assert re.search(r"^int8 +food11_u8_int8\.onnx +[\d.]+ +int8( +[\d.]+){4} ", text, re.MULTILINE), text
    assert "X-Cache: hit" in text and "answered by " in text and "failed requests: 0 (the aim: none)" in text
    assert {"overload_timelines.png", "rollout_timeline.png"} <= {p.name for p in (results / "fastapi").iterdir()}


@pytest.fixture(scope="module")
def triton_stages(local_triton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The session's local tritonserver (tests/e2e/conftest.py) at pt-1, registered like `servelab triton up`
    so that `servelab triton stage NAME` switches it, and one GourmetGram per Triton mode."""
    if triton_server.load_state() is not None:
        pytest.fail("a tritonserver started by `servelab triton up` is running; stop it with `servelab triton down`")
    logs = tmp_path_factory.mktemp("triton-logs")
    local = local_triton
    local.apply_stage(TRITON_STAGES["pt-1"])  # where a student starts, whatever stage an earlier test left it at

    def back_to_pt1() -> None:
        # The notebooks switch it from other processes (`servelab triton stage`), which the shared server's
        # object does not see: it forgets its stage and loads pt-1, so the two agree again.
        local.stage = ""
        local.apply_stage(TRITON_STAGES["pt-1"])

    with ExitStack() as stack:
        stack.callback(back_to_pt1)
        stack.callback(triton_server.STATE_FILE.unlink, missing_ok=True)
        triton_server.save_state(triton_server.state_of(local))
        flasks = {backend: _serve(["flask", "--backend", backend], "/health", logs / f"flask-{backend}.log",
                                  {"TRITON_SERVER_URL": local.url})
                  for backend in ("triton", "triton_onnx", "triton_ensemble")}
        _start_all(stack, [server for server, _ in flasks.values()])
        yield {"server": local.url, "grpc": local.grpc_url, **{backend: url for backend, (_, url) in flasks.items()}}


def test_a_stage_switch_that_does_not_finish_fails_in_time_with_the_servers_log(
        triton_stages: dict[str, str], tmp_path: Path) -> None:
    lab = TritonWalkthrough(triton_stages["server"], DEFAULT_IMAGE, tmp_path, wait_s=2, perf_analyzer=False,
                            stages=["pt-1", "pt-4x4"], stage_command=f"{sys.executable} -c 'import time; time.sleep(60)'")
    with pytest.raises(TimeoutError) as failure:  # raised at wait_s, not after the 60 s command ends
        lab.use_stage("pt-4x4")
    message = str(failure.value)
    assert "did not finish within 2 s" in message
    assert re.search(r"Triton says: food_classifier (READY|UNAVAILABLE)", message), message
    log = Path(triton_server.load_state()["log"])
    assert f"--- last lines of {log} ---" in message
    assert log.read_text().splitlines()[-1] in message  # the server's own words


def test_steps_for_stages_left_out_are_skipped(triton_stages: dict[str, str], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    lab = TritonWalkthrough(triton_stages["server"], DEFAULT_IMAGE, tmp_path, wait_s=2, perf_analyzer=False,
                            stages=["pt-1"], flask_urls={"triton_onnx": triton_stages["triton_onnx"]})
    lab.try_gourmetgram("triton_onnx")
    assert lab.batch_counts("onnx-dyn") == {}
    assert capsys.readouterr().out == ("skipped: no stage in STAGES serves food_classifier_onnx "
                                       "(GourmetGram's BACKEND=triton_onnx)\n")


def test_shape_changes_times_alternating_and_repeated_batch_sizes(triton_stages: dict[str, str], tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """7_triton_onnx's shape cell: one request at a time, sizes alternating, then each repeated; Triton's own
    statistics show it ran exactly those batch sizes (no dynamic batcher merged them)."""
    lab = TritonWalkthrough(triton_stages["server"], DEFAULT_IMAGE, tmp_path, wait_s=120, perf_analyzer=False,
                            stages=["onnx-1"],
                            stage_command=f"{sys.executable} -m servelab triton stage {{name}} --url {triton_stages['server']}")
    before = lab.batch_counts("onnx-1")
    found = lab.shape_changes("onnx-1", sizes=(2, 3), repeats=2)
    assert set(found) == {"alternating 2/3", "repeated 2", "repeated 3"} and all(v > 0 for v in found.values())
    assert batch_count_change(before, lab.batch_counts("onnx-1")) == {2: 5, 3: 5}  # 1 untimed + 2 + 2 each
    assert "alternating 2/3" in capsys.readouterr().out
