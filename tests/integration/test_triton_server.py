"""A real tritonserver (the nvidia-pytriton build, started by the fixture) serving every stage.

One server for the tier (tests/integration/conftest.py's ``local_triton``): tests switch it between stages
with the same model-control calls `servelab triton stage` makes, so only one startup is paid. The CLI test
starts a second one on a repository of its own. Stages render with KIND_CPU (the venv's
torch is a CPU build); the ONNX model runs as the local Python-backend stand-in. The model
repository is a temporary copy of the base configs whose version folders link to the checkout's,
so the tests leave no generated configs behind.
"""

import base64
import json
import os
import signal
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from checkout_guard import in_dev_shm, named_shm
from photos import variants
from servelab import cli
from servelab.core.artifacts import load_manifest
from servelab.core.catalogue import get_stage
from servelab.core.inference import OnnxClassifier, TorchClassifier
from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.postprocess import Prediction, top1
from servelab.core.preprocess import crop_pixels, preprocess_batch
from servelab.core.procs import free_port
from servelab.core.settings import get_settings
from servelab.run.walkthrough.walk_triton import TritonWalkthrough, running_stage
from servelab.servers.triton import client, server
from servelab.servers.triton.configs import STAGES, meant
from triton_repo import make_repository

PHOTOS = variants()
FOUR = [PHOTOS[k] for k in ("jpeg", "grayscale_jpeg", "rgba_png", "palette_gif")]
SIXTEEN = [*PHOTOS.values(), *list(PHOTOS.values())[:7]]
TRUNCATED = PHOTOS["jpeg"][: len(PHOTOS["jpeg"]) // 3]
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def repository(artifacts, tmp_path_factory) -> Path:
    return make_repository(tmp_path_factory.mktemp("model_repository"))


@pytest.fixture
def triton(local_triton) -> server.LocalTriton:
    """The tier's tritonserver (tests/integration/conftest.py); each test switches it to the stage it needs."""
    return local_triton


@pytest.fixture(scope="module")
def reference(artifacts):
    """servelab's in-process PyTorch and ONNX Runtime paths, for the same images."""
    manifest = load_manifest(artifacts.manifest)
    torch_model, onnx_model = TorchClassifier(artifacts.manifest), OnnxClassifier(artifacts.onnx)

    def predict(images: list[bytes], runtime: str) -> list[Prediction]:
        batch = preprocess_batch(images, **manifest.preprocess_kwargs())
        return top1((torch_model if runtime == "torch" else onnx_model).infer(batch), manifest.classes)

    return predict


def pixels(images: list[bytes]) -> np.ndarray:
    """The uint8 crops the variants with preprocessing in the graph take."""
    return np.stack([crop_pixels(im) for im in images])



def http(triton) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(triton.url, network_timeout=120)


def infer_images(triton, model: str, images: list[bytes], protocol: str = "http",
                 encoding: str = "base64") -> list[Prediction]:
    if protocol == "http":
        connection = http(triton)
    else:
        connection = grpcclient.InferenceServerClient(triton.grpc_url)
    try:
        result = connection.infer(model, client.image_inputs(protocol, images, encoding),
                                  outputs=client.label_outputs(protocol))
    finally:
        connection.close()
    return client.predictions(result)


def assert_close(actual: list[Prediction], expected: list[Prediction], tolerance: float = TOLERANCE) -> None:
    assert [p.label for p in actual] == [p.label for p in expected]
    np.testing.assert_allclose([p.probability for p in actual], [p.probability for p in expected], atol=tolerance)


def stats(triton, model: str) -> dict:
    with urllib.request.urlopen(f"http://{triton.url}/v2/models/{model}/stats") as response:
        return json.loads(response.read())["model_stats"][0]


def batch_sizes(entry: dict) -> dict[int, int]:
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in entry.get("batch_stats", [])}


def concurrently(calls) -> list:
    """Run the calls at once, one thread each (released together); each result or exception."""
    start = threading.Barrier(len(calls))

    def run(call):
        start.wait()
        try:
            return call()
        except InferenceServerException as exc:
            return exc

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


# --- model control behind its own key ---

def test_model_control_answers_only_its_key(triton):
    """--http-restricted-api and --grpc-restricted-protocol on model-repository (the session's ADMIN_TOKEN): a load
    with no key or another is refused over HTTP and gRPC, one with the key loads; inference asks for none, and the
    server's log never shows the key."""
    triton.apply_stage(get_stage("pt-1"))
    model, wrong = "food_classifier", triton.key + "x"
    over_http, over_grpc = http(triton), grpcclient.InferenceServerClient(triton.grpc_url)
    try:
        for headers in (None, {server.CONTROL_HEADER: wrong}):
            with pytest.raises(InferenceServerException, match="restricted, expecting header 'admin-token'"):
                over_http.load_model(model, headers=headers)
        for headers in (None, {server.GRPC_CONTROL_HEADER: wrong}):
            with pytest.raises(InferenceServerException, match="expecting header 'triton-grpc-protocol-admin-token'"):
                over_grpc.load_model(model, headers=headers)
        with pytest.raises(RuntimeError, match="HTTP 403.*ADMIN_TOKEN"):
            server.repository_index(triton.url, key=wrong)
        over_http.load_model(model, headers=server.control_headers(triton.url))
        over_grpc.load_model(model, headers=server.control_headers(triton.url, "grpc"))
        assert over_http.is_model_ready(model) and over_grpc.is_model_ready(model)
        result = over_http.infer(model, client.image_inputs("http", FOUR[:1]))
        assert client.predictions(result)[0].label
    finally:
        over_http.close()
        over_grpc.close()
    assert triton.key not in triton.process.log.read_text()


# --- pt-1: the lab's client and what the original model.py got wrong ---

def test_the_labs_client_keeps_working(triton, reference):
    """[1,1] BYTES with base64 text, outputs read as JSON: the lab's Flask client, verbatim in spirit."""
    triton.apply_stage(get_stage("pt-1"))
    connection = http(triton)
    infer_input = httpclient.InferInput("INPUT_IMAGE", [1, 1], "BYTES")
    infer_input.set_data_from_numpy(np.array([[base64.b64encode(PHOTOS["jpeg"]).decode("utf-8")]], dtype=object))
    outputs = [httpclient.InferRequestedOutput("FOOD_LABEL", binary_data=False),
               httpclient.InferRequestedOutput("PROBABILITY", binary_data=False)]
    result = connection.infer(model_name="food_classifier", inputs=[infer_input], outputs=outputs)
    connection.close()
    label, probability = result.as_numpy("FOOD_LABEL")[0, 0], result.as_numpy("PROBABILITY")[0, 0]
    expected = reference([PHOTOS["jpeg"]], "torch")[0]
    assert label == expected.label  # JSON outputs (binary_data=False) arrive as text
    assert abs(float(probability) - expected.probability) <= TOLERANCE


def test_four_images_in_one_request_equal_four_single_requests(triton, reference):
    triton.apply_stage(get_stage("pt-1"))
    together = infer_images(triton, "food_classifier", FOUR, protocol="grpc", encoding="raw")
    alone = [infer_images(triton, "food_classifier", [image])[0] for image in FOUR]
    assert len(together) == 4
    assert_close(together, alone, 1e-4)
    assert_close(together, reference(FOUR, "torch"))


def test_batch_of_16_returns_16_results(triton, reference):
    triton.apply_stage(get_stage("pt-1"))
    assert_close(infer_images(triton, "food_classifier", SIXTEEN), reference(SIXTEEN, "torch"))


def test_a_corrupt_element_fails_its_whole_request(triton):
    """One response carries all outputs of a request, so a request with one bad image out of
    four fails as a whole (400, naming the element); nothing is half-answered."""
    triton.apply_stage(get_stage("pt-1"))
    for protocol, status in (("http", "400"), ("grpc", "StatusCode.INVALID_ARGUMENT")):
        with pytest.raises(InferenceServerException) as failure:
            infer_images(triton, "food_classifier", [*FOUR[:2], TRUNCATED, FOUR[3]], protocol)
        assert str(failure.value.status()) == status
        assert "element 2 of 4" in failure.value.message()


# --- dynamic batching ---

def test_dynamic_batcher_fails_only_the_corrupt_request(triton, reference):
    triton.apply_stage(get_stage("pt-dyn"))
    before = stats(triton, "food_classifier")
    images = [PHOTOS["jpeg"], PHOTOS["png"], TRUNCATED, PHOTOS["webp"], PHOTOS["grayscale_jpeg"],
              PHOTOS["rgba_png"], PHOTOS["cmyk_jpeg"], PHOTOS["palette_gif"]]
    results = concurrently([lambda im=im: infer_images(triton, "food_classifier", [im]) for im in images])
    failed = [i for i, r in enumerate(results) if isinstance(r, Exception)]
    assert failed == [2], results
    assert "truncated or corrupt" in results[2].message()
    good = [im for i, im in enumerate(images) if i != 2]
    assert_close([r[0] for i, r in enumerate(results) if i != 2], reference(good, "torch"))
    after = stats(triton, "food_classifier")
    formed = {b: n - batch_sizes(before).get(b, 0) for b, n in batch_sizes(after).items()}
    assert max(b for b, n in formed.items() if n > 0) > 1, formed
    executions = int(after["execution_count"]) - int(before["execution_count"])
    assert executions < len(images), "the requests were not batched"


# --- every stage ---

def _one_per_layout() -> list[str]:
    """The first stage of each model, batch of images and instance layout (a stage that only adds dynamic
    batching loads as the one before it: the quick lab, tests/e2e/test_lab.py, loads and serves every stage)."""
    firsts: dict[tuple, str] = {}
    for name, stage in STAGES.items():
        if not stage.needs_gpu:
            changes = stage.triton.changes.get(stage.triton.model, {})
            firsts.setdefault((stage.triton.model, stage.triton.images, "instance_group" in changes), name)
    return list(firsts.values())


@pytest.mark.parametrize("name", _one_per_layout())
def test_each_kind_of_stage_loads_and_serves(triton, name):
    config = triton.apply_stage(get_stage(name))
    stage = STAGES[name]
    assert config["parameters"]["servelab_stage"]["string_value"] == f"{name} (cpu)"
    for model in stage.triton.models:
        with urllib.request.urlopen(f"http://{triton.url}/v2/models/{model}/ready") as response:
            assert response.status == 200
    index = server.repository_index(triton.url, ready=True)
    assert {e["name"] for e in index} == set(stage.triton.models)  # other stages' models were unloaded
    if stage.input != "bytes":
        # The local stand-in says so in the reported config and in the server log.
        assert config["backend"] == "python" and "STAND-IN" in config["parameters"]["servelab_stand_in"]["string_value"]
        assert "LOCAL STAND-IN" in triton.process.log.read_text()
        connection = http(triton)
        images = SIXTEEN[:stage.triton.images]  # as many as the lab sends it: onnx-b16's batches of 16
        batch = pixels(images) if stage.input == "uint8" else preprocess_batch(images)
        result = connection.infer(stage.triton.model, client.tensor_inputs("http", batch))
        connection.close()
        assert result.as_numpy("output").shape == (stage.triton.images, 11)
    else:
        assert len(infer_images(triton, stage.triton.model, FOUR[:1])) == 1


def test_every_stage_runs_its_own_config_with_auto_complete_off(triton):
    """Each stage this machine can run loads with auto-complete off (its configs say everything), and the config
    Triton reports after the load is the stage's: what ``check_running`` compares is really compared here."""
    for name, stage in STAGES.items():
        if stage.needs_gpu:
            continue
        triton.apply_stage(stage)
        assert triton.running == meant(stage, kind="cpu", onnxruntime=False, repository=triton.repository), name
    assert '"auto-complete-config":"false"' in triton.process.log.read_text()  # the python backend's cmdline


@pytest.mark.parametrize("plant, says", [
    ({"dynamic_batching": {}}, "scheduler: the stage's config has 'none', Triton runs 'dynamic_batching { "
                               "preferred_batch_size: [16] }'"),
    ({"instance_group": [{"count": 2, "kind": "KIND_CPU"}]}, "instances: the stage's config has '1x KIND_CPU', "
                                                              "Triton runs '2x KIND_CPU'"),
    ({"max_batch_size": 8}, "max_batch_size: the stage's config has 16, Triton runs 8")])
def test_a_config_that_is_not_the_stages_is_refused_under_its_name(triton, plant, says):
    """A config Triton loaded other than the stage's (planted through the load API's config override, as Triton's
    auto-complete would add a batcher on the node) is refused, naming the difference, before anything measures it."""
    triton.apply_stage(get_stage("pt-1"))
    planted = {**server.model_config(triton.url, "food_classifier"), **plant}
    connection = http(triton)
    try:
        connection.load_model("food_classifier", headers=server.control_headers(triton.url), config=json.dumps(planted))
        with pytest.raises(server.ConfigDiffers, match="nothing is measured as pt-1") as refused:
            triton.apply_stage(get_stage("pt-1"))
        assert f"food_classifier: {says}" in str(refused.value)
    finally:
        connection.close()
        triton.stage = ""  # loaded behind the shared server's object: the next apply_stage loads pt-1 again
    triton.apply_stage(get_stage("pt-1"))
    assert triton.running["food_classifier"]["scheduler"] == "none"


# --- preprocessing on the server ---

def test_ensemble_matches_the_onnx_path(triton, reference):
    triton.apply_stage(get_stage("ensemble"))
    served = infer_images(triton, "food_classifier_ensemble", FOUR, encoding="raw")
    connection = http(triton)
    result = connection.infer("food_classifier_onnx", client.tensor_inputs("http", preprocess_batch(FOUR)),
                              outputs=client.tensor_outputs("http"))
    connection.close()
    assert_close(served, client.tensor_predictions(result), 1e-5)
    assert_close(served, reference(FOUR, "onnx"))


def test_ensemble_fails_only_the_corrupt_request(triton):
    triton.apply_stage(get_stage("ensemble"))
    results = concurrently([lambda im=im: infer_images(triton, "food_classifier_ensemble", [im])
                            for im in (FOUR[0], TRUNCATED, FOUR[1])])
    assert [isinstance(r, Exception) for r in results] == [False, True, False]
    assert str(results[1].status()) == "400"


def test_onnx_dynamic_batching_forms_batches(triton, reference):
    triton.apply_stage(get_stage("onnx-dyn"))
    tensors = preprocess_batch(FOUR)
    before = stats(triton, "food_classifier_onnx")
    connection = grpcclient.InferenceServerClient(triton.grpc_url)

    def send(i: int) -> list[Prediction]:
        """A closed-loop sender: three requests, each as soon as the last is answered."""
        for _ in range(3):
            result = connection.infer("food_classifier_onnx", client.tensor_inputs("grpc", tensors[i % 4][None]),
                                      outputs=client.tensor_outputs("grpc"))
        return client.tensor_predictions(result)

    results = concurrently([lambda i=i: send(i) for i in range(16)])
    connection.close()
    assert_close([r[0] for r in results[:4]], reference(FOUR, "onnx"))
    formed = batch_sizes(stats(triton, "food_classifier_onnx"))
    grown = {b: n - batch_sizes(before).get(b, 0) for b, n in formed.items()}
    assert max(b for b, n in grown.items() if n > 0) > 1, grown


def test_the_block_a_student_writes_is_what_loads(triton, tmp_path, monkeypatch):
    """The notebooks' step: the walkthrough writes the stage's config with the student's block into the
    repository, Triton's model-control API loads it; a block Triton cannot take fails with Triton's own
    message, and the model goes on serving the last config that loaded."""
    monkeypatch.setattr(server, "STATE_FILE", tmp_path / "state.json")  # registered as `servelab triton up` does
    server.save_state(server.state_of(triton))
    triton.apply_stage(get_stage("onnx-1"))
    lab = TritonWalkthrough(triton.url, DEFAULT_IMAGE, tmp_path, wait_s=60, stages=["onnx-dyn"])
    connection = http(triton)
    try:
        before = connection.get_model_config("food_classifier_onnx")
        assert lab.check_loaded("onnx-1", before).startswith("correct: this is what Triton runs for onnx-1")
        lab.write_config("onnx-dyn", "dynamic_batching {\n  preferred_batch_size: [ 2, 3 ]\n}\n")
        # Written, not loaded: Triton still runs onnx-1, and lab.check_loaded says to load it.
        with pytest.raises(ValueError, match="Triton still runs onnx-1, not your onnx-dyn: load food_classifier_onnx"):
            lab.check_loaded("onnx-dyn", before)
        connection.load_model("food_classifier_onnx", headers=server.control_headers(triton.url))
        with pytest.raises(ValueError, match="is not the config Triton runs now .*read it again, after the load"):
            lab.check_loaded("onnx-dyn", before)  # read before the load
        with pytest.raises(ValueError, match="is not food_classifier_onnx's config"):
            lab.check_loaded("onnx-dyn", connection.get_model_config("food_classifier_onnx")["dynamic_batching"])
        loaded = connection.get_model_config("food_classifier_onnx")
        said = lab.check_loaded("onnx-dyn", loaded)
        assert said.startswith("correct: this is what Triton runs for onnx-dyn (yours)"), said
        assert "Triton runs (get_model_config): max_batch_size 16; scheduler: dynamic_batching" in said, said
        assert loaded["dynamic_batching"]["preferred_batch_size"] == [2, 3]
        assert loaded["parameters"]["servelab_stage"]["string_value"] == "onnx-dyn (yours, cpu)"
        assert running_stage(triton.url, "food_classifier_onnx") == "onnx-dyn (yours)"  # never the stage itself
        for wrong, says in (("dynamic_batching { preferred_batch_size: [ 32 ] }",  # max_batch_size is 16
                             "dynamic batching preferred size must be <= max batch size for food_classifier_onnx"),
                            ("dynamic_batching { preferred_batch_size: [ 4, }", "Expected integer, got: }")):
            lab.write_config("onnx-dyn", wrong)
            with pytest.raises(InferenceServerException, match="failed to load 'food_classifier_onnx'"):
                connection.load_model("food_classifier_onnx", headers=server.control_headers(triton.url))
            assert says in lab.triton_log()  # Triton's own reason, in its log
            result = connection.infer("food_classifier_onnx", client.tensor_inputs("http", preprocess_batch(FOUR[:1])))
            assert result.as_numpy("output").shape == (1, 11)
            assert connection.get_model_config("food_classifier_onnx")["dynamic_batching"]["preferred_batch_size"] == [2, 3]
    finally:
        connection.close()
        triton.stage = ""  # switched behind the shared server's object: the next apply_stage loads again


# --- the ONNX variants: preprocessing in the model ---

@pytest.mark.parametrize("name", [name for name, stage in STAGES.items()
                                  if stage.input == "uint8" and not stage.needs_gpu])
def test_a_variant_stage_agrees_with_the_in_process_pipeline(triton, name):
    """The uint8 crops through Triton give the service's own in-process answers (same model file)."""
    triton.apply_stage(get_stage(name))
    model = STAGES[name].triton.model
    connection = grpcclient.InferenceServerClient(triton.grpc_url)
    result = connection.infer(model, client.tensor_inputs("grpc", pixels(FOUR)), outputs=client.tensor_outputs("grpc"))
    connection.close()
    onnx = OnnxClassifier(Path(triton.repository) / model / "1" / "model.onnx")
    np.testing.assert_allclose(result.as_numpy("output"), onnx.infer(pixels(FOUR)), atol=1e-5)


# --- nothing left in /dev/shm ---

def group(local: server.LocalTriton) -> list[psutil.Process]:
    """tritonserver and its Python stubs."""
    leader = psutil.Process(local.process.pid)
    return [leader, *leader.children()]


def test_a_stage_switch_and_a_stop_leave_nothing_in_dev_shm(repository, tmp_path):
    """Each stub's segment goes with its model: when a switch unloads it, and when the stop does, given time to
    unload eight PyTorch stubs on 2 CPUs (with 2 s, tritonserver exited with them loaded)."""
    log = tmp_path / "tritonserver.log"
    with server.start_local(get_stage("onnx-1"), kind="cpu", repository=repository, log=log) as local:
        first = named_shm(group(local))
        local.apply_stage(get_stage("pt-4x4"))
        eight = named_shm(group(local))
        assert len(first) == 1 and len(eight) == 8 and not first & in_dev_shm()
    assert not eight & in_dev_shm()
    assert "Exit timeout expired" not in log.read_text()


def test_what_a_sigkill_leaves_in_dev_shm_the_stop_removes_and_no_other_servers(triton, repository, tmp_path):
    """A SIGKILL of tritonserver with its stubs (of the whole group: the stop's last resort, or someone else's) leaves
    their segments, with nothing of Triton's left to unlink them. The stop removes them by the name this server gave
    them, and leaves those of another server (the tier's, running)."""
    others = named_shm(group(triton))
    local = server.start_local(get_stage("pt-1"), kind="cpu", repository=repository, log=tmp_path / "tritonserver.log")
    try:
        processes = group(local)
        named = named_shm(processes)
        os.killpg(local.process.pid, signal.SIGKILL)
        psutil.wait_procs(processes, timeout=10)
        assert named and named <= in_dev_shm()
    finally:
        local.stop()
    assert not named & in_dev_shm()
    assert others and others <= in_dev_shm()


# --- the CLI ---

def test_cli_up_stage_down(repository, tmp_path, monkeypatch, capsys):
    """`servelab triton up`, `stage` and `down` on a second server (state file in a temporary folder). Without an
    ADMIN_TOKEN, `up` makes the server a key of its own, which `stage` reads from the state file (this user's only)."""
    monkeypatch.setattr(server, "STATE_FILE", tmp_path / "state.json")
    monkeypatch.delenv("ADMIN_TOKEN")
    monkeypatch.setenv("TRITON_MODEL_REPOSITORY", str(repository))
    monkeypatch.setenv("TRITON_INSTANCE_KIND", "cpu")
    get_settings.cache_clear()
    port = free_port()
    try:
        assert cli.main(["triton", "up", "--stage", "pt-1", "--port", str(port),
                         "--grpc-port", str(free_port()), "--metrics-port", str(free_port())]) == 0
        state = server.load_state()
        assert state is not None and state["url"] == f"127.0.0.1:{port}"
        assert state["key"] and (tmp_path / "state.json").stat().st_mode & 0o777 == 0o600
        connection = httpclient.InferenceServerClient(state["url"])
        result = connection.infer("food_classifier", client.image_inputs("http", FOUR[:1]))
        connection.close()
        assert client.predictions(result)[0].label
        capsys.readouterr()
        assert cli.main(["triton", "stage", "onnx-dyn"]) == 0
        printed = capsys.readouterr().out
        reported = json.loads(printed[printed.index("\n{") + 1:])
        assert reported["dynamic_batching"]["preferred_batch_size"] == [4, 6, 8]
        # The stage's config and the one Triton runs, one line each: the same, read back after the load.
        lines = [line for line in printed.splitlines() if line.startswith("# food_classifier_onnx, ")]
        assert [line.partition(": ")[2] for line in lines] == [lines[0].partition(": ")[2]] * 2 and len(lines) == 2
        assert "scheduler: dynamic_batching { preferred_batch_size: [4, 6, 8] max_queue_delay_microseconds: 100 }" in lines[1]
        assert reported["parameters"]["servelab_stage"]["string_value"] == "onnx-dyn (cpu)"
        assert "onnx-dyn (cpu)" in (repository / "food_classifier_onnx" / "configs" / "stage.pbtxt").read_text()
    finally:
        assert cli.main(["triton", "down"]) == 0
        get_settings.cache_clear()
    assert server.load_state() is None
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/live", timeout=2)
