"""The catalogue (servelab.core.catalogue) is the one place that names stages and models: what each stage teaches
and against which stage, which model it serves and what that model takes; everything else derives from it."""

import ast
import asyncio
import re
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2

from servelab.core.catalogue import (
    CATALOGUE,
    CORE_PATH,
    FAMILIES,
    MODELS,
    NOTEBOOKS,
    OVERLOADED,
    QUEUE_BOUND,
    QUEUE_WAIT_US,
    ROLLED,
    STAGES,
    Lesson,
    bounded,
    compared,
    default_stage,
    of_family,
    queue_bound,
)
from servelab.core.paths import MODELS_STAGING
from servelab.core.variants.build import VARIANTS
from servelab.measure import fractions
from servelab.report import lessons
from servelab.run.families import TritonAdapter
from servelab.servers.triton.configs import base_config
from servelab.tools import lease_plan

SERVELAB = Path(__file__).parents[2] / "servelab"
# Each lesson of the report: (stage, its baseline) as it compares them, in catalogue order.
PAIRS = {
    "onnx": (("fastapi-onnx", "fastapi-pt"), ("onnx-1", "pt-1")),
    "batching": (("fastapi-onnx-dyn", "fastapi-onnx"), ("pt-dyn", "pt-1"), ("onnx-dyn", "onnx-1"),
                 ("ray-dyn", "ray-2")),
    "instances": (("pt-2x2", "pt-1"), ("onnx-2", "onnx-1")),
    "variant u8": (("fastapi-onnx-u8", "fastapi-onnx"), ("onnx-u8", "onnx-1")),
    "variant int8": (("fastapi-onnx-int8", "fastapi-onnx"), ("onnx-int8", "onnx-1")),
    "variant fp16": (("fastapi-onnx-fp16", "fastapi-onnx"), ("onnx-fp16", "onnx-1")),
    "server preprocessing": (("ensemble", "onnx-1"),),
    "replicas": (("ray-2", "ray-1"), ("ray-4", "ray-1")),
    "proxy": (("ray-1", "fastapi-onnx"),),
    "autoscaling": (), "node failure": (), "queueing": (),
    "shedding": (("fastapi-onnx-shed", "fastapi-onnx"), ("onnx-dyn-shed", "onnx-dyn")),  # derived: catalogue.bounded
    "cache": (("fastapi-onnx-cache", "fastapi-onnx"), ("onnx-1-cache", "onnx-1")),  # derived: catalogue.with_cache
    "rollout": (),
}
# What each input kind is in a model's config.pbtxt: (input name, data type).
CONFIG_INPUT = {"bytes": ("INPUT_IMAGE", "TYPE_STRING"), "tensor": ("input", "TYPE_FP32"),
                "uint8": ("image", "TYPE_UINT8")}


def _spelt(package: Path, names: set[str]) -> list[str]:
    """Every string literal in ``package`` (but core/catalogue.py, the catalogue) that is one of ``names``,
    as "file:line 'name'"."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if path == package / "core" / "catalogue.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.relative_to(package)}:{node.lineno} {node.value!r}")
    return found


def test_no_file_but_the_catalogue_spells_a_stage_name() -> None:
    assert _spelt(SERVELAB, set(STAGES)) == []
    assert _spelt(SERVELAB.parent / "benchmarks", set(STAGES)) == []  # they measure the catalogue's stages too


def test_no_file_but_the_catalogue_spells_a_triton_model_name() -> None:
    assert _spelt(SERVELAB, set(MODELS)) == []


def test_no_file_asks_for_a_family_by_a_typed_name() -> None:
    """A family is named once, in its record (``catalogue.FAMILIES``): code asks for its stages, or compares a
    stage's family, through the record (``TRITON.name``), so a renamed or added family is one edit."""
    asking = {"of_family", "default_stage", "get_stage", "catalogue_stage"}
    found = []
    for path in sorted(SERVELAB.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in asking:
                typed = [a for a in node.args[1:] if isinstance(a, ast.Constant)] + \
                        [a for a in node.args[:1] if isinstance(a, ast.Constant) and a.value in FAMILIES]
            elif isinstance(node, ast.Compare) and getattr(node.left, "attr", None) == "family":
                typed = [c for c in node.comparators if isinstance(c, ast.Constant)]
            else:
                continue
            found += [f"{path.relative_to(SERVELAB)}:{node.lineno} {a.value!r}" for a in typed]
    assert found == []


def test_the_scan_finds_a_spelt_name(tmp_path: Path) -> None:
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "catalogue.py").write_text('NAME = "onnx-1"\n')  # the catalogue itself is left out
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "pairs.py").write_text('"""onnx-1 in prose is fine."""\nPAIR = ("onnx-dyn", f"{1}")\n')
    assert _spelt(tmp_path, set(STAGES)) == ["report/pairs.py:2 'onnx-dyn'"]


def test_the_notebooks_table_is_the_notebooks_folder_and_what_names_a_notebook_names_one_of_it() -> None:
    """NOTEBOOKS lists notebooks/ in its order; the stages, the report's expectations and the lease plan's waits
    name notebooks from it (a renamed notebook fails here, not in a student's report)."""
    folder = Path(__file__).resolve().parents[2] / "notebooks"
    assert sorted(NOTEBOOKS) == sorted(p.stem for p in folder.glob("[0-9]*_*.md"))
    assert list(NOTEBOOKS) == sorted(NOTEBOOKS, key=lambda n: int(n.split("_")[0]))
    assert {s.notebook for s in CATALOGUE} - {""} <= set(NOTEBOOKS)
    said = {e.notebook for v in lessons.EXPECT.values() for e in (v.values() if isinstance(v, dict) else [v])}
    assert said - {"", "the lab"} <= set(NOTEBOOKS)
    assert set(lease_plan.rates()["wait"]) <= set(NOTEBOOKS) and set(lease_plan.CORE) < set(NOTEBOOKS)


MEASURED = re.compile(r"await lab\.measure\((\w+|\"[\w-]+\"),(.*?)\)\n", re.DOTALL)


def test_the_core_path_is_what_the_core_notebooks_measure_outside_their_optional_sections() -> None:
    """CORE_PATH (what the grader's check requires) is read back from the notebooks: each ``lab.measure`` call in a
    core notebook's sections not marked (optional), its stage (a name, or the ``lab.wait_for`` it was given) and
    its loads' modes (``open_loads``: open)."""
    found: dict[str, set[str]] = {}
    for name in ("4_fastapi", "6_triton_python", "7_triton_onnx", "8_triton_more"):
        assert NOTEBOOKS[name].core
        text = (Path(__file__).resolve().parents[2] / "notebooks" / f"{name}.md").read_text(encoding="utf-8")
        waited = dict(re.findall(r"^(\w+) = lab\.wait_for\(\"([\w-]+)\"", text, re.MULTILINE))
        for optional, section in lease_plan.sections(text):
            for stage, loads in ([] if optional else MEASURED.findall(section)):
                modes = {*re.findall(r"Load\.(sequential|closed|open)\(", loads), *["open"] * ("open_loads(" in loads)}
                found.setdefault(stage.strip('"') if stage.startswith('"') else waited[stage], set()).update(modes)
    assert {stage: set(modes) for stage, modes in CORE_PATH.items()} == found
    assert all(STAGES[stage].notebook for stage in CORE_PATH)


def test_the_report_writes_up_every_lesson_once() -> None:
    """The catalogue's ``Lesson`` is the one list of lessons: the report has a write-up and an expectation for each."""
    assert sorted(lesson.key for lesson in lessons.LESSONS) == sorted(Lesson)
    assert set(lessons.EXPECT) == set(Lesson)


@pytest.mark.parametrize("stage", [s for s in CATALOGUE if s.lesson or s.baseline], ids=lambda s: s.name)
def test_a_stage_teaches_a_lesson_of_the_report_against_another_stage(stage) -> None:
    assert stage.lesson in {lesson.key for lesson in lessons.LESSONS}
    assert not stage.baseline or (stage.baseline in STAGES and stage.baseline != stage.name)
    if stage.variant not in ("", "fp32"):  # a variant against its family's fp32 stage
        assert STAGES[stage.baseline].variant == "fp32" and STAGES[stage.baseline].family == stage.family
    if stage.family == "triton":  # a variant stage serves the model of its variant
        assert stage.variant in ("", MODELS[stage.triton.model].variant)


def test_the_report_and_the_ceiling_compare_the_catalogues_pairs() -> None:
    assert {lesson.key: lesson.pairs for lesson in lessons.LESSONS} == PAIRS
    assert {lesson: compared(lesson) for lesson in PAIRS} == PAIRS
    assert [(top, bottom) for _, top, bottom in fractions.RATIOS] == [
        ("pt-dyn", "pt-1"), ("onnx-dyn", "onnx-1"), ("fastapi-onnx-dyn", "fastapi-onnx"),
        ("pt-2x2", "pt-1"), ("onnx-2", "onnx-1")]
    assert fractions.BATCHING_AIM_PAIRS == (("onnx-dyn", "onnx-1"), ("fastapi-onnx-dyn", "fastapi-onnx"))


@pytest.mark.parametrize("model", list(MODELS.values()), ids=lambda m: m.name)
def test_a_model_is_a_folder_of_the_repository_and_takes_what_its_config_says(model) -> None:
    config = base_config(MODELS_STAGING, model.name)
    assert config.name == model.name
    if any(s.triton.model == model.name for s in of_family("triton").values()):  # a model clients call
        name, datatype = CONFIG_INPUT[model.input]
        assert (config.input[0].name, model_config_pb2.DataType.Name(config.input[0].data_type)) == (name, datatype)


def test_every_model_a_stage_loads_is_in_the_table_and_each_up_command_has_a_default() -> None:
    assert {m for s in of_family("triton").values() for m in s.triton.models} == set(MODELS)
    assert (default_stage("triton"), default_stage("ray")) == ("pt-1", "ray-2")


def test_bounded_twins_bound_the_queue_their_family_s_way():
    fastapi, triton = (bounded(STAGES[name]) for name in OVERLOADED)
    assert (fastapi.name, fastapi.baseline, fastapi.lesson) == ("fastapi-onnx-shed", "fastapi-onnx", "shedding")
    assert fastapi.fastapi.env == {**STAGES["fastapi-onnx"].fastapi.env, "MAX_QUEUE_REQUESTS": str(QUEUE_BOUND)}
    # Triton's bounds the wait, not the length (a full max_queue_size queue stalls Triton 2.51's batcher).
    dyn = triton.triton.changes[triton.triton.model]["dynamic_batching"]
    assert dyn["default_queue_policy"] == {"default_timeout_microseconds": QUEUE_WAIT_US, "timeout_action": "REJECT",
                                           "allow_timeout_override": False}
    assert (triton.name, triton.baseline) == ("onnx-dyn-shed", "onnx-dyn")
    assert dyn["preferred_batch_size"] == [4, 6, 8]  # the stage's own batcher, bounded
    assert [queue_bound(s) for s in (STAGES["fastapi-onnx"], fastapi, triton)] == [
        "none", f"{QUEUE_BOUND} requests", f"{QUEUE_WAIT_US // 1000} ms"]
    # A model without a dynamic batcher gets one; both bounds are named and set, a bound not given is none.
    timed = bounded(STAGES["pt-1"], max_queue_size=2, timeout_us=20_000)
    assert timed.name == "pt-1-shed-q2-20000us" and "2 requests, 20 ms" in timed.about
    assert timed.triton.changes["food_classifier"]["dynamic_batching"]["default_queue_policy"] == {
        "max_queue_size": 2, "default_timeout_microseconds": 20_000, "timeout_action": "REJECT",
        "allow_timeout_override": False}
    sized = bounded(STAGES["onnx-dyn"], max_queue_size=QUEUE_BOUND)
    assert sized.name == f"onnx-dyn-shed-q{QUEUE_BOUND}" and queue_bound(sized) == f"{QUEUE_BOUND} requests"
    assert bounded(STAGES["fastapi-onnx"], 4, 50_000).fastapi.env["MAX_QUEUE_DELAY_MS"] == "50"
    with pytest.raises(ValueError, match="Serve's own"):
        bounded(STAGES["ray-1"])
    assert fastapi.name not in STAGES  # derived, not listed


def test_a_triton_stage_rolls_out_to_the_variant_it_serves_and_the_lab_refuses_another():
    """Triton's new version keeps version 1's inputs (the clients'): a ROLLED Triton stage names its own model's
    variant, and the lab's adapter refuses any other before it touches a server."""
    for name, variant in ROLLED.items():
        stage = STAGES[name]
        assert variant in VARIANTS
        if stage.family == "triton":
            assert MODELS[stage.triton.model].variant == variant, name
    with pytest.raises(ValueError, match="cannot roll out to int8"):
        asyncio.run(TritonAdapter(Path("logs"), Path("repository")).roll_out(STAGES["onnx-1"], "int8"))
