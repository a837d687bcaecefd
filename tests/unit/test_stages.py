"""The stage catalogue: every stage is runnable by each runner that claims it.

Each runner's own check, without starting a server: the `servelab serve` service and settings of a
FastAPI stage, the rendered Triton configs of a Triton stage (parsed by Triton's own protobuf, on the
node and locally), the Ray Serve options of a Ray stage (validated by Ray Serve itself), the compose
file of a compose stage; and the lab, the benchmark and the notebooks' lists read the same table.
"""

from dataclasses import dataclass

import pytest
import yaml
from google.protobuf import json_format

from servelab.cli import build_parser
from servelab.core.catalogue import CATALOGUE, FAMILIES, FASTAPI, STAGES, Stage, get_stage, of_family
from servelab.core.family import Family
from servelab.core.paths import MODELS_STAGING
from servelab.core.settings import RaySettings, ServeSettings
from servelab.core.variants.build import VARIANTS
from servelab.run import plan as plans
from servelab.run import side_by_side
from servelab.run.families import ADAPTERS, RayAdapter, TritonAdapter, adapter_of
from servelab.servers.rayserve import options as ray_stages
from servelab.servers.triton import configs as triton_stages
from servelab.tools.containers import compose_stages as compose
from servelab.tools.notebook_blocks import lab_stages


def by_family(family: str) -> list[Stage]:
    return list(of_family(family).values())


@dataclass(frozen=True)
class TinyPart:
    pass


def test_each_stage_is_named_once_and_belongs_to_one_family(monkeypatch) -> None:
    assert len(STAGES) == len(CATALOGUE)
    # Each family with its adapter.
    assert {s.family for s in CATALOGUE} == {"fastapi", "triton", "ray"} == set(FAMILIES) == set(ADAPTERS)
    assert [adapter_of(STAGES[name]) for name in ("fastapi-pt", "pt-1", "ray-1")] == list(ADAPTERS.values())
    tiny = Stage("tiny-1", "a family nobody registered", TinyPart())
    with pytest.raises(ValueError, match="tiny-1: its TinyPart is no family's part in FAMILIES"):
        tiny.family
    monkeypatch.setitem(FAMILIES, "tiny", Family("tiny", "Tiny", TinyPart, FASTAPI.queries))
    with pytest.raises(ValueError, match="tiny-1: no adapter for the tiny family in ADAPTERS"):
        adapter_of(tiny)
    assert sum(len(of_family(f)) for f in ("fastapi", "triton", "ray")) == len(CATALOGUE)
    assert all(s.about for s in CATALOGUE)
    with pytest.raises(TypeError, match="pt-1 is a triton stage"):
        get_stage("pt-1").fastapi
    with pytest.raises(ValueError, match="unknown ray stage 'pt-1'; stages: ray-1"):
        get_stage("pt-1", "ray")


@pytest.mark.parametrize("stage", by_family("fastapi"), ids=lambda s: s.name)
def test_a_fastapi_stage_names_a_service_and_settings_the_service_reads(stage: Stage) -> None:
    serve = build_parser().parse_args(["serve", stage.fastapi.service])
    assert serve.serve_command == stage.fastapi.service
    fields = {key.upper() for key in ServeSettings.model_fields}
    assert set(stage.fastapi.env) <= fields
    ServeSettings(**{key.lower(): value for key, value in stage.fastapi.env.items()})  # values that validate
    assert stage.fastapi.env.get("ONNX_VARIANT", stage.variant or "fp32") == (stage.variant or "fp32")
    assert not stage.variant or stage.variant in VARIANTS


@pytest.mark.parametrize("stage", by_family("triton"), ids=lambda s: s.name)
def test_a_triton_stage_renders_for_the_node_and_for_this_machine(stage: Stage) -> None:
    assert set(stage.triton.changes) <= set(stage.triton.models)
    for model in stage.triton.models:
        assert (MODELS_STAGING / model / "config.pbtxt").exists()
        for kind, onnxruntime in (("gpu", True), ("cpu", False)):
            config = triton_stages.effective_config(stage, model, kind=kind, onnxruntime=onnxruntime,
                                                    repository=MODELS_STAGING, gpus=2 if kind == "gpu" else 0)
            assert config.parameters["servelab_stage"].string_value == f"{stage.name} ({kind})"
            fields = json_format.MessageToDict(config, preserving_proto_field_name=True)
            assert set(stage.triton.changes.get(model, {})) <= set(fields), model  # the change reached it


@pytest.mark.parametrize("stage", by_family("ray"), ids=lambda s: s.name)
def test_a_ray_stage_gives_options_ray_serve_accepts(stage: Stage) -> None:
    serve = pytest.importorskip("ray.serve")
    settings = RaySettings()
    deployment = serve.deployment(lambda: None).options(**ray_stages.deployment_options(stage, settings))
    assert (deployment._deployment_config.autoscaling_config is not None) == stage.ray.autoscaling
    assert stage.ray.autoscaling or deployment.num_replicas == stage.ray.replicas
    assert deployment._replica_config.max_replicas_per_node == stage.ray.max_replicas_per_node
    assert set(ray_stages.serve_env(stage, settings)) <= {key.upper() for key in ServeSettings.model_fields}


def test_the_compose_stages_are_the_fastapi_stages_marked_so_and_triton() -> None:
    assert list(compose.STAGES) == [s.name for s in by_family("fastapi") if s.fastapi.compose] + ["triton"]
    for stage in compose.STAGES.values():
        text = stage.path.read_text()
        yaml.safe_load(text)
        assert all(variable in text for variable in stage.shell), stage.name  # the file reads each one
    assert compose.STAGES["fastapi-onnx-dyn"].shell == {"FASTAPI_STAGE": "fastapi_onnx", "MAX_BATCH_SIZE": "16",
                                                         "BATCH_TIMEOUT_MS": "5"}


def test_the_lab_the_benchmark_and_the_notebooks_read_the_catalogue() -> None:
    assert [s.name for s in plans.select_stages(None)] == [s.name for s in CATALOGUE if s.tour]
    for plan in (plans.Plan.full(), plans.Plan.quick()):
        assert [s.name for s in plans.select_stages(None, plan)] == [s.name for s in CATALOGUE if s.in_lab]
    assert "pt-4x4" not in {s.name for s in plans.select_stages(None, plans.Plan.full())}
    assert [s.name for s in plans.select_stages("ray-4,pt-1")] == ["ray-4", "pt-1"]  # named stages, any plan
    assert side_by_side.STAGES == {"fastapi-pt": "pytorch", "fastapi-onnx": "onnx"}
    assert side_by_side.stage_inputs()["onnx-u8"] == "uint8" and side_by_side.stage_inputs()["ray-1"] == "bytes"
    table = lab_stages()
    assert all(f"| `{s.name}` | {s.about}" in table for s in CATALOGUE if s.in_lab)
    assert "| `onnx-dyn` | " in table and table.count("| yes |") == sum(s.tour for s in CATALOGUE)
    assert f"Only on the node: `pt-4x4` ({STAGES['pt-4x4'].about})." in table
    stand_in = {name: adapter_of(STAGES[name]).stand_in(STAGES[name]) for name in ("pt-1", "onnx-dyn", "ray-2", "fastapi-pt")}
    assert stand_in == {"pt-1": "", "onnx-dyn": TritonAdapter.STAND_IN, "ray-2": RayAdapter.STAND_IN, "fastapi-pt": ""}


def test_the_tour_shows_every_lesson_once() -> None:
    """The default `make lab` (issue 27): each family; batching off and on; one instance and more; fp32 and a
    variant of the same family; Ray replicas placed one per node, and a node's failure; both arrival
    processes at the same rates (open-loop queueing); nothing that needs a GPU or runs on the node only."""
    tour = plans.TOUR_STAGES
    names = {s.name for s in tour}
    assert {s.family for s in tour} == {"fastapi", "triton", "ray"}
    assert all(s.in_lab for s in tour)
    assert [s.variant for s in tour if s.needs_gpu] == ["fp16"]  # the GPU's lever, skipped on a CPU
    assert any(s.triton.changes.get(s.triton.model, {}).get("dynamic_batching") is not None
               for s in tour if s.family == "triton"), "batching on"
    assert {"onnx-1", "onnx-2"} <= names
    # perf_analyzer, the node's tool, on the stage that teaches batching and queueing; never on a FastAPI stage.
    assert plans.Plan.tour().with_perf_analyzer(STAGES["onnx-dyn"]) and not plans.Plan.tour().with_perf_analyzer(STAGES["onnx-1"])
    assert plans.Plan.full().with_perf_analyzer(STAGES["onnx-1"]) and not plans.Plan.full().with_perf_analyzer(STAGES["fastapi-pt"])
    assert any(s.variant not in ("", "fp32") for s in tour) and any(s.variant == "fp32" for s in tour)
    assert any(s.family == "ray" and s.ray.max_replicas_per_node == 1 and s.ray.replicas > 1 for s in tour)
    assert any(s.family == "ray" and s.ray.node_failure for s in tour)
    assert any(s.family == "triton" and s.triton.both_arrivals for s in tour) and plans.Plan.tour().poisson_fractions
    assert len(tour) < len(plans.LAB_STAGES)


def test_the_gpu_check_shows_each_gpu_lesson_once() -> None:
    """`make gpu-check`'s default (issue 31): FastAPI + ONNX Runtime with and without batching, one PyTorch
    stage, Triton's onnx-1 and onnx-dyn, fp16; both clients on the batching Triton stage; nothing on the
    node only or from a family the GPU environment does not carry (Ray)."""
    check = plans.GPU_CHECK_STAGES
    fastapi = [s for s in check if s.family == "fastapi"]
    assert {s.fastapi.backend for s in fastapi} == {"pytorch", "onnx"}
    onnx = [s for s in fastapi if s.fastapi.backend == "onnx"]
    assert {int(s.fastapi.env["MAX_BATCH_SIZE"]) > 1 for s in onnx} == {True, False}
    triton = [s for s in check if s.family == "triton"]
    batching = [s for s in triton if s.triton.changes.get(s.triton.model, {}).get("dynamic_batching") is not None]
    assert batching and len(batching) < len(triton)
    assert any(s.variant == "fp16" for s in check) and all(s.in_lab for s in check)
    assert {s.family for s in check} == {"fastapi", "triton"}
    plan = plans.Plan.gpu_check()
    assert plan.stages == check and plan.sweep.start == 8 and plan.sweep.max_levels is None  # to the knee
    assert [s.name for s in triton if plan.with_perf_analyzer(s)] == [s.name for s in batching]
