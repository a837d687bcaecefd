"""The one routine that measures a stage (servelab.measure.measure_stage), against a real tiny server, and the
lab and the notebooks' walkthrough measuring the same stage through it."""

import asyncio

import pytest
from tinyserver import running

from servelab.core.artifacts import load_manifest
from servelab.measure.targets import FastAPITarget
from servelab.measure.records import Load, read_records
from servelab.run.lab import Lab, Plan
from servelab.measure.measure_stage import (ONNX_STAND_IN, Labels, family_stand_in, measure_stage, model_stand_in,
                                            servelab_client, stand_in_note)
from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.catalogue import STAGES
from servelab.run.walkthrough.walk_fastapi import FastAPIWalkthrough, Service


@pytest.fixture(scope="module")
def url():
    with running(service_ms=2) as base:
        yield base


def test_each_load_is_measured_by_each_client_in_turn(url):
    seen = []

    def second(target, load, labels, earlier):
        seen.append([r.load.label() for r in earlier])  # perf_analyzer sizes its window from servelab's run
        return servelab_client(timeout_s=5)(target, load, labels, earlier)

    def keep(measure, load):
        record = measure()
        record.config = {**record.config, "kept": load.label()}
        return record

    loads = [Load.sequential(3, warmup=0), Load.closed(2, 4, warmup=0)]
    records = measure_stage(FastAPITarget(url, b"photo"), loads, Labels("tiny", {"about": "x"}, "a stand-in", 1),
                            [servelab_client(), second], keep)
    assert [r.load.label() for r in records] == ["sequential", "sequential", "concurrency 2", "concurrency 2"]
    assert seen == [["sequential"], ["concurrency 2"]]
    assert all(r.stage == "tiny" and r.stand_in == "a stand-in" and r.stats.successes > 0 for r in records)
    assert [r.config["kept"] for r in records] == [r.load.label() for r in records]


def test_the_stand_in_note_names_every_stand_in_once_in_order(model):
    manifest = load_manifest(model.manifest)
    assert stand_in_note() is None and stand_in_note(None, "") is None
    assert stand_in_note(model_stand_in(manifest), family_stand_in(STAGES["onnx-dyn"])) == \
        f"{manifest.description}; {ONNX_STAND_IN}"
    assert model_stand_in(manifest.model_copy(update={"stand_in": False})) is None


def test_the_lab_and_the_walkthrough_label_a_stage_alike(url, model, tmp_path):
    """Both measure through the one routine: the same stage gives records with the same fields, stage
    and stand-in note (the model's own, as the lab reads its manifest and the service its /ready)."""
    manifest = load_manifest(model.manifest)
    stage, load = STAGES["fastapi-pt"], Load.sequential(3, warmup=0)
    lab = Lab(Plan.quick(), tmp_path / "lab", DEFAULT_IMAGE, log=lambda line: None)
    lab.out_dir.mkdir()
    [ours] = measure_stage(FastAPITarget(url, lab.image), [load], lab.labels(stage, manifest, None, "CPU"),
                           keep=lab.keep)
    walk = FastAPIWalkthrough(url, DEFAULT_IMAGE, tmp_path / "walk.jsonl", wait_s=1)
    ready = {"service": "fastapi_pt", "model": manifest.name, "runtime": {}, "batching": {}, "stand_in": True,
             "description": manifest.description}
    theirs = asyncio.run(walk.measure(Service(stage.name, url, ready), load))
    assert read_records([lab.records_path]) == [ours] and read_records([walk.records_file]) == [theirs]
    assert ours.stage == theirs.stage == stage.name
    assert ours.stand_in == theirs.stand_in == manifest.description
    assert ours.model_dump().keys() == theirs.model_dump().keys()
