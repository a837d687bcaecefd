"""Triton stages rendered from the base configs, and the Python-backend helpers (no server needed)."""

import base64
import os

import numpy as np
import pytest

from photos import variants
from servelab.core import catalogue
from servelab.core.paths import MODELS_STAGING
from servelab.core.preprocess import ImageError, preprocess
from servelab.core.settings import get_settings
from servelab.servers.triton import configs as stages
from servelab.servers.triton import python_backend as backend

STAGE_NAMES = ["pt-1", "pt-dyn", "pt-2x2", "pt-4x4", "onnx-1", "onnx-2", "onnx-dyn", "onnx-b16", "ensemble", "onnx-u8",
               "onnx-int8", "onnx-fp16"]


def config(name: str, model: str | None = None, kind: stages.Kind = "gpu", onnxruntime: bool = True):
    stage = stages.get_stage(name)
    return stages.effective_config(stage, model or stage.triton.model, kind=kind, onnxruntime=onnxruntime,
                                   repository=MODELS_STAGING)


def instances(cfg) -> list[tuple[int, str, list[int]]]:
    return [(g.count, stages.model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind), list(g.gpus))
            for g in cfg.instance_group]


def test_every_lab_configuration_is_a_stage():
    assert list(stages.STAGES) == STAGE_NAMES


def test_base_configs_are_the_labs_interfaces():
    pt = stages.base_config(MODELS_STAGING, catalogue.PT)
    assert (pt.backend, pt.max_batch_size) == ("python", 16)
    string = stages.model_config_pb2.DataType.TYPE_STRING
    assert [(i.name, i.data_type, list(i.dims)) for i in pt.input] == [("INPUT_IMAGE", string, [1])]
    assert [(o.name, list(o.dims)) for o in pt.output] == [("FOOD_LABEL", [1]), ("PROBABILITY", [1])]
    onnx = stages.base_config(MODELS_STAGING, catalogue.ONNX)
    assert (onnx.backend, onnx.max_batch_size) == ("onnxruntime", 16)
    assert [(i.name, list(i.dims)) for i in onnx.input] == [("input", [3, 224, 224])]
    assert [(o.name, list(o.dims)) for o in onnx.output] == [("output", [11])]
    assert "logits" in (MODELS_STAGING / catalogue.ONNX / "config.pbtxt").read_text().lower()


@pytest.mark.parametrize(("name", "gpu", "cpu"), [
    ("pt-1", [(1, "KIND_GPU", [0])], 1),
    ("pt-dyn", [(1, "KIND_GPU", [0])], 1),
    ("pt-2x2", [(2, "KIND_GPU", [0]), (2, "KIND_GPU", [1])], 4),
    ("pt-4x4", [(4, "KIND_GPU", [0]), (4, "KIND_GPU", [1])], 8),
    ("onnx-1", [(1, "KIND_GPU", [0])], 1),
    ("onnx-2", [(2, "KIND_GPU", [0, 1])], 4),
    ("onnx-dyn", [(1, "KIND_GPU", [0])], 1),
])
def test_instance_groups_and_their_cpu_rendering(name, gpu, cpu):
    assert instances(config(name)) == gpu
    assert instances(config(name, kind="cpu")) == [(cpu, "KIND_CPU", [])]


def test_dynamic_batching_only_where_the_lab_adds_it():
    assert config("pt-dyn").HasField("dynamic_batching")
    dyn = config("onnx-dyn").dynamic_batching
    assert (list(dyn.preferred_batch_size), dyn.max_queue_delay_microseconds) == ([4, 6, 8], 100)
    for name in ("pt-1", "pt-2x2", "pt-4x4", "onnx-1", "onnx-2"):
        assert not config(name).HasField("dynamic_batching"), name


def test_every_stage_config_is_complete_without_triton_auto_complete():
    """The servers run with --disable-auto-complete-config: each model's rendered config must say for itself
    what a backend would otherwise fill in (its inputs, outputs and batch bound; where its instances run)."""
    for stage in stages.STAGES.values():
        for model in stage.triton.models:
            cfg = config(stage.name, model)
            assert (cfg.backend or cfg.platform) and cfg.input and cfg.output, (stage.name, model)
            assert cfg.max_batch_size > 0 and all(list(t.dims) for t in (*cfg.input, *cfg.output)), (stage.name, model)
            assert cfg.platform == "ensemble" or cfg.instance_group, (stage.name, model)


def test_what_triton_runs_reads_as_the_stage_says():
    """``served``: what a lesson varies, in the form Triton's load gives it (an empty batcher prefers the batch bound)."""
    one, dyn = stages.served(config("onnx-1")), stages.served(config("onnx-dyn"))
    assert (one["scheduler"], one["max_batch_size"], one["instances"]) == ("none", 16, "1x KIND_GPU on GPU 0")
    assert one["warmup_batch_sizes"] == list(range(1, 17)) and one["response_cache"] is False
    assert dyn["scheduler"] == "dynamic_batching { preferred_batch_size: [4, 6, 8] max_queue_delay_microseconds: 100 }"
    assert stages.served(config("pt-dyn"))["scheduler"] == "dynamic_batching { preferred_batch_size: [16] }"
    assert stages.served(config("onnx-2", kind="cpu"))["instances"] == "4x KIND_CPU"


def test_a_default_batcher_triton_added_to_onnx_1_is_a_named_difference():
    """What auto-complete does to onnx-1 on the node's ONNX Runtime backend, as Triton would report it:
    a ``dynamic_batching {}`` completed to the batch bound, which the check names with both values."""
    meant = stages.meant(stages.get_stage("onnx-1"), kind="gpu", onnxruntime=True, repository=MODELS_STAGING, gpus=2)
    completed = stages.json_format.MessageToDict(config("onnx-1"), preserving_proto_field_name=True)
    completed["dynamic_batching"] = {"preferred_batch_size": [16], "max_queue_delay_microseconds": "0"}
    completed["instance_group"][0]["count"] = 2
    running = stages.served(completed)
    assert stages.differences(meant["food_classifier_onnx"], running) == [
        "scheduler: the stage's config has 'none', Triton runs 'dynamic_batching { preferred_batch_size: [16] }'",
        "instances: the stage's config has '1x KIND_GPU on GPU 0', Triton runs '2x KIND_GPU on GPU 0'"]
    assert stages.differences(meant["food_classifier_onnx"], stages.served(config("onnx-1"))) == []


def batching_onnx_configs() -> list[tuple[str, str, stages.model_config_pb2.ModelConfig]]:
    """(stage, model, config as the node runs it) for every ONNX Runtime model of every stage that Triton
    batches: the ensemble's ONNX step too."""
    found = []
    for stage in stages.STAGES.values():
        for model in stage.triton.models:
            cfg = config(stage.name, model)
            if cfg.backend == "onnxruntime" and (cfg.HasField("dynamic_batching") or cfg.max_batch_size > 1):
                found.append((stage.name, model, cfg))
    return found


def test_every_batch_size_triton_can_form_is_warmed_before_the_model_is_ready():
    """Triton hands a batching model any size from 1 to max_batch_size (a dynamic batcher's preferred
    sizes are preferences; without one, the client's request is the batch): each must have run once."""
    found = batching_onnx_configs()
    assert {name for name, _, _ in found} >= {"onnx-1", "onnx-2", "onnx-dyn", "onnx-b16", "ensemble", "onnx-u8"}
    for name, model, cfg in found:
        warmed = {w.batch_size for w in cfg.model_warmup}
        formable = set(range(1, cfg.max_batch_size + 1))
        assert formable <= warmed, (name, model, sorted(formable - warmed))
        assert set(cfg.dynamic_batching.preferred_batch_size) <= warmed, (name, model)
        inputs = {(i.name, tuple(i.dims)) for i in cfg.input}
        assert all({(n, tuple(t.dims)) for n, t in w.inputs.items()} == inputs for w in cfg.model_warmup), name
    assert {6} <= {w.batch_size for w in config("onnx-dyn").model_warmup}  # a preferred size of onnx-dyn's
    assert len(config("onnx-1").model_warmup) == 16  # one run per size: the warm-up's cost, per instance


def test_the_stable_shape_stage_is_onnx_1_fed_fixed_batches_by_its_client():
    stage = stages.get_stage("onnx-b16")
    cfg = config("onnx-b16")
    assert not cfg.HasField("dynamic_batching")  # Triton runs each request as it came: one shape
    assert stage.triton.model == catalogue.ONNX and not stage.triton.changes
    assert 1 < stage.triton.images <= cfg.max_batch_size
    assert all(s.triton.images == 1 for s in stages.STAGES.values() if s is not stage)
    assert (stage.notebook, stage.in_lab, stage.tour, stage.needs_gpu) == ("7_triton_onnx", True, False, False)


def test_a_stage_changes_only_its_fields():
    base = stages.base_config(MODELS_STAGING, catalogue.PT)
    cfg = config("pt-4x4")
    for field in ("name", "backend", "max_batch_size", "input", "output"):
        assert getattr(cfg, field) == getattr(base, field), field
    assert cfg.parameters["servelab_stage"].string_value == "pt-4x4 (gpu)"


@pytest.mark.parametrize("model", [m.name for m in catalogue.MODELS.values() if m.input == "uint8"])
def test_variant_base_configs_take_uint8_crops(model):
    cfg = stages.base_config(MODELS_STAGING, model)
    assert (cfg.name, cfg.backend, cfg.max_batch_size) == (model, "onnxruntime", 16)
    uint8, fp32 = (stages.model_config_pb2.DataType.Value(t) for t in ("TYPE_UINT8", "TYPE_FP32"))
    assert [(i.name, i.data_type, list(i.dims)) for i in cfg.input] == [("image", uint8, [224, 224, 3])]
    assert [(o.name, o.data_type, list(o.dims)) for o in cfg.output] == [("output", fp32, [11])]
    assert instances(cfg) == [(1, "KIND_GPU", [0])]


def test_onnx_stand_in_swap_is_labelled():
    real = config("onnx-1")
    assert real.backend == "onnxruntime" and "servelab_stand_in" not in real.parameters
    stand_in = config("onnx-1", kind="cpu", onnxruntime=False)
    assert stand_in.backend == "python"
    assert "STAND-IN" in stand_in.parameters["servelab_stand_in"].string_value
    # Every ONNX model runs the one stand-in file, on its own model.onnx.
    for name in ("onnx-1", "onnx-u8", "onnx-int8"):
        swapped = config(name, kind="cpu", onnxruntime=False)
        assert swapped.default_model_filename == stages.STAND_IN_FILE
        assert (MODELS_STAGING / stages.get_stage(name).triton.model / "1" / swapped.default_model_filename).resolve() == (
            MODELS_STAGING / catalogue.ONNX / "1" / "model.py").resolve()
    assert config("pt-1", onnxruntime=False).backend == "python"  # only the ONNX model is swapped


def test_ensemble_loads_its_steps_first():
    stage = stages.get_stage("ensemble")
    assert stage.triton.models == ("food_preprocess", catalogue.ONNX, "food_postprocess", catalogue.ENSEMBLE)
    steps = [s.model_name for s in config("ensemble").ensemble_scheduling.step]
    assert steps == ["food_preprocess", catalogue.ONNX, "food_postprocess"]


def test_write_effective_leaves_the_base_alone(tmp_path):
    for model in stages.get_stage("ensemble").triton.models:
        (tmp_path / model).mkdir()
        (tmp_path / model / "config.pbtxt").write_bytes((MODELS_STAGING / model / "config.pbtxt").read_bytes())
    written = stages.write_effective(stages.get_stage("ensemble"), kind="cpu", onnxruntime=False, repository=tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in written] == [
        f"{m}/configs/stage.pbtxt" for m in stages.get_stage("ensemble").triton.models]
    for model in stages.get_stage("ensemble").triton.models:
        base = (MODELS_STAGING / model / "config.pbtxt").read_bytes()
        assert (tmp_path / model / "config.pbtxt").read_bytes() == base
    assert written[1].read_text().startswith("# GENERATED")


def test_unknown_stage_and_kind():
    with pytest.raises(ValueError, match="stages: pt-1"):
        stages.get_stage("pt-3")
    with pytest.raises(ValueError):
        stages.resolve_kind("tpu")


def test_elements_can_be_raw_bytes_or_base64_text():
    jpeg = variants()["jpeg"]
    text = base64.b64encode(jpeg)
    assert backend.image_bytes(jpeg) == jpeg
    assert backend.image_bytes(text) == jpeg
    assert backend.image_bytes(text.decode()) == jpeg
    assert backend.image_bytes(b"data:image/jpeg;base64," + text) == jpeg
    for name, data in variants().items():  # no encoded image passes for base64 text
        assert backend.image_bytes(data) == data, name


def test_request_images_name_the_bad_element():
    """One request's images (food_classifier's and food_preprocess's loops answer each request
    on its own; test_triton_server checks that the other requests of a batch still succeed)."""
    good = variants()
    truncated = good["jpeg"][: len(good["jpeg"]) // 3]
    images = backend.request_images(np.array([[good["jpeg"]], [base64.b64encode(good["grayscale_jpeg"])]],
                                             dtype=np.object_))
    assert [i.shape for i in images] == [(3, 224, 224)] * 2
    np.testing.assert_array_equal(images[1], preprocess(good["grayscale_jpeg"]))
    with pytest.raises(ImageError, match="^INPUT_IMAGE element 1 of 2"):
        backend.request_images(np.array([[good["webp"]], [truncated]], dtype=np.object_))


def test_threads_per_instance_shares_the_cores():
    cores = len(os.sched_getaffinity(0))
    one = {"instance_group": [{"count": 1, "kind": "KIND_CPU"}]}
    assert backend.threads_per_instance(one) == max(1, cores - 1)
    eight = {"instance_group": [{"count": 4, "gpus": [0]}, {"count": 4, "gpus": [1]}]}
    assert backend.threads_per_instance(eight) == max(1, (cores - 1) // 8)


def test_threads_per_instance_setting(monkeypatch):
    monkeypatch.setenv("TRITON_THREADS_PER_INSTANCE", "3")
    get_settings.cache_clear()
    try:
        assert backend.threads_per_instance({"instance_group": [{"count": 8}]}) == 3
    finally:
        monkeypatch.delenv("TRITON_THREADS_PER_INSTANCE")
        get_settings.cache_clear()


@pytest.mark.parametrize(("name", "one_gpu"), [
    ("pt-2x2", [(2, "KIND_GPU", [0]), (2, "KIND_GPU", [0])]),
    ("onnx-2", [(2, "KIND_GPU", [0]), (2, "KIND_GPU", [0])]),
    ("pt-1", [(1, "KIND_GPU", [0])]),
])
def test_kind_gpu_on_the_gpus_there_are(name, one_gpu):
    """Two GPUs: the P100 node's placement as written; one GPU: every instance on it, and the config says so."""
    stage = stages.get_stage(name)
    on_two = stages.effective_config(stage, stage.triton.model, kind="gpu", onnxruntime=True, repository=MODELS_STAGING, gpus=2)
    assert instances(on_two) == instances(config(name)) and "servelab_gpu_placement" not in on_two.parameters
    on_one = stages.effective_config(stage, stage.triton.model, kind="gpu", onnxruntime=True, repository=MODELS_STAGING, gpus=1)
    assert instances(on_one) == one_gpu
    assert ("servelab_gpu_placement" in on_one.parameters) == (len(one_gpu) > 1)
    if len(one_gpu) > 1:
        assert "this machine has 1, so the instances of GPU 1 run on GPU 0" in \
            on_one.parameters["servelab_gpu_placement"].string_value


@pytest.mark.parametrize(("value", "onnxruntime"), [(None, True), ("false", False)])
def test_a_server_up_did_not_start_has_the_onnxruntime_backend_unless_told(monkeypatch, value, onnxruntime):
    """`servelab triton stage` against a compose Triton: NVIDIA's image has the backend; a Triton on the stand-in
    base has not (TRITON_ONNXRUNTIME=false, `servelab containers` and the dress rehearsal)."""
    from servelab.servers.triton import server

    if value is not None:
        monkeypatch.setenv("TRITON_ONNXRUNTIME", value)
    get_settings.cache_clear()
    try:
        assert server.switch_target("127.0.0.1:1", "cpu").onnxruntime is onnxruntime  # not a server `up` started
    finally:
        monkeypatch.delenv("TRITON_ONNXRUNTIME", raising=False)
        get_settings.cache_clear()
