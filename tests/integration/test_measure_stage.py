"""The one routine that measures a stage (servelab.measure.measure_stage), against a real tiny server, and the
lab and the notebooks' walkthrough measuring the same stage through it."""

import asyncio
import contextlib
import sys
import threading
import time
from collections import Counter

import psutil
import pytest

from servelab.core.artifacts import load_manifest
from servelab.core.catalogue import STAGES
from servelab.core.paths import DEFAULT_IMAGE
from servelab.measure.fractions import CAPACITY, WINDOWS, capacity, curve, curve_point
from servelab.measure.loadgen import _sender_main
from servelab.measure.measure_stage import (
    Labels,
    Sweep,
    mean_curve,
    measure_stage,
    model_stand_in,
    perf_analyzer_client,
    servelab_client,
    stand_in_note,
    sweep_capacity,
    windowed,
)
from servelab.measure.perf_analyzer import PerfAnalyzerOptions, Windows
from servelab.measure.records import Load, read_records
from servelab.measure.senders import pool
from servelab.measure.targets import FastAPITarget, TritonTarget
from servelab.run.lab import Lab
from servelab.run.plan import Plan
from servelab.run.walkthrough.walk_fastapi import FastAPIWalkthrough, ServingStage
from tinyserver import running


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
    assert stand_in_note(model_stand_in(manifest), "a stand-in for the node's set-up") == \
        f"{manifest.description}; a stand-in for the node's set-up"
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
    theirs = asyncio.run(walk.measure(ServingStage(stage.name, url, ready), load))
    assert read_records([lab.records_path]) == [ours] and read_records([walk.records_file]) == [theirs]
    assert ours.stage == theirs.stage == stage.name
    assert ours.stand_in == theirs.stand_in == manifest.description
    assert ours.model_dump().keys() == theirs.model_dump().keys()


# --- windows in seconds and capacity by saturation (issue 43) ---------------------------------------------

SERVICE_MS = 100  # one request at a time at most 10 req/s per slot, whatever the client does


def _sweep(url: str, sweep: Sweep, plan: Plan, tmp_path) -> list:
    """``plan``'s closed-loop runs on the tiny server at ``url``, swept as ``sweep`` says, kept as the lab keeps them."""
    lab = Lab(plan, tmp_path / "lab", DEFAULT_IMAGE, log=lambda line: None)
    lab.out_dir.mkdir()
    labels = Labels("tiny", {"about": "a fixed service time"}, None, None)
    return sweep_capacity(FastAPITarget(url, b"photo"), plan.load, labels, sweep, windowed(plan.windows), lab.keep)


@pytest.mark.parametrize("slots, knee", [(1, (4, 8)), (4, (16, 32))])
def test_the_sweep_stops_at_the_knee_and_its_last_record_keeps_the_curve(slots, knee, tmp_path):
    """A server that serves ``slots`` requests at a time, each in exactly 100 ms: throughput grows with the senders
    until they are as many as the slots, then stops growing; the sweep measures the last gain and the first non-gain
    again, and stops two doublings past the slots (two levels in a row that added less than 5 %), long before its
    cap; its last record holds the curve, each point from its own run."""
    plan = Plan.quick()
    sweep = Sweep(start=2, cap=64)
    with running(service_ms=SERVICE_MS, slots=slots) as url:
        records = _sweep(url, sweep, plan, tmp_path)
    levels = [r.load.concurrency for r in records]
    assert list(dict.fromkeys(levels)) == sweep.levels()[:len(set(levels))] and levels[-1] in knee  # doubling
    # The last gain and the first non-gain, each measured again once: at least two levels twice, none three times
    # (a busy machine's noise can move the last gain up a level, which is then measured again too).
    assert len(levels) >= len(set(levels)) + 2 and max(Counter(levels).values()) == 2, levels
    assert all(CAPACITY not in r.config for r in records[:-1])
    said = records[-1].config[CAPACITY]
    assert said["stopped"].startswith("the knee: ") and said["cap"] == 64 and said["growth_pct"] == 5
    assert said["curve"] == [curve_point(r) for r in records]
    means = mean_curve(said["curve"])
    best = max(means, key=means.get)
    assert (said["throughput_rps"], said["concurrency"]) == (round(means[best], 3), best)
    # What the report reads: the capacity is a run at the top of the curve, the curve the last record's.
    assert capacity(records, "tiny").load.concurrency == best and curve(records, "tiny") == said["curve"]
    assert read_records([tmp_path / "lab" / "records.jsonl"]) == records  # written as the lab writes them


def test_every_closed_loop_run_of_the_lab_is_a_window_in_seconds(tmp_path):
    """Each run of the sweep: a warm-up window, then three windows of the plan's seconds, never a count of requests;
    each window's throughput, p50 and p99 kept in the record."""
    plan = Plan.quick()
    with running(service_ms=5, slots=2) as url:
        records = _sweep(url, Sweep(start=2, max_levels=2), plan, tmp_path)
    assert [r.load.mode for r in records] == ["sequential", "closed"]
    for r in records:
        assert r.load.requests is None and r.load.duration_s == Windows.COUNT * plan.windows.window_s
        assert r.load.warmup_s == plan.warmup_s and r.warmup_requests and r.timeline is None
        said = r.config[WINDOWS]
        assert said["window_s"] == plan.windows.window_s and len(said["throughput_rps"]) == Windows.COUNT
        assert len(said["p50_ms"]) == len(said["p99_ms"]) == Windows.COUNT and said["runs"] == 1
        assert said["stable"] is None  # the quick plan takes three windows whatever their spread
    stopped = records[-1].config[CAPACITY]["stopped"]
    assert stopped == "the plan's 2 levels" or stopped.startswith("the knee: "), stopped


def test_a_stability_test_measures_again_until_the_windows_agree(tmp_path):
    """Windows that must agree within 1000 % always do at once; within 0 % they never do: measured again, up to
    max_trials windows in all (three runs of three), and the record says so."""
    with running(service_ms=5, slots=1) as url:
        target, labels = FastAPITarget(url, b"photo"), Labels("tiny")
        load = Plan.quick().load(2)
        loose = windowed(Windows(stability_pct=99, max_trials=9, window_s=0.2))(target, load, labels, [])
        strict = windowed(Windows(stability_pct=0, max_trials=9, window_s=0.2))(target, load, labels, [])
    assert loose.config[WINDOWS]["runs"] == 1 and loose.config[WINDOWS]["stable"] is True
    assert strict.config[WINDOWS]["runs"] == 3 and strict.config[WINDOWS]["stable"] is False
    assert len(strict.config[WINDOWS]["discarded_rps"]) == 2 * Windows.COUNT and strict.load == load


def test_an_open_loop_given_as_a_count_is_measured_once_in_windows_over_its_schedule(tmp_path):
    """The lab's Poisson runs are a count of requests at a rate: their windows split the seconds the schedule
    spans, so the open-loop lesson's ratio has a spread too; measured once, even where windows must agree."""
    with running(service_ms=5, slots=2) as url:
        load = Load.open(40.0, "poisson", requests=60, seed=0, warmup=5)
        record = windowed(Windows(stability_pct=0, max_trials=9, window_s=0.2))(
            FastAPITarget(url, b"photo"), load, Labels("tiny"), [])
    said = record.config[WINDOWS]
    assert said["window_s"] == 60 / 40.0 / Windows.COUNT and said["runs"] == 1 and record.load == load
    assert len(said["throughput_rps"]) == Windows.COUNT and all(rps > 0 for rps in said["throughput_rps"])


def test_the_second_client_measures_one_at_a_time_and_the_capacity_s_load_after_the_sweep(tmp_path):
    """perf_analyzer's place (here servelab's own client again, told what ours measured): after the sweep, on the
    sequential load and on the load at the capacity's senders, each right after ours measured it."""
    seen = []

    def second(target, load, labels, earlier):
        seen.append([r.load.label() for r in earlier])
        return servelab_client()(target, load, labels, earlier)

    plan = Plan.quick()
    with running(service_ms=20, slots=2) as url:
        records = sweep_capacity(FastAPITarget(url, b"photo"), plan.load, Labels("tiny"), Sweep(start=2, max_levels=2),
                                 windowed(plan.windows), others=[second])
    swept, after = records[:2], records[2:]
    top = capacity(swept, "tiny")
    assert [r.load for r in after] == [swept[0].load] + ([top.load] if top is not swept[0] else [])
    assert seen == [[r.load.label()] for r in after]  # each told what ours measured of that load


def test_measuring_binds_no_socket_and_starts_only_its_senders_and_perf_analyzer():
    """measure/ starts no server, held by what its entry points do against a stub target (test_layers holds it by
    their imports): no socket bound here, no child that listens, no process but the client's own senders (and
    multiprocessing's helper) and perf_analyzer. A failed perf_analyzer run is still a run that started it."""
    seen = {"binds": [], "commands": [], "listening": set()}
    watching = threading.Event()
    me = psutil.Process()

    def audit(event, args):  # a hook cannot be removed: it records only while this test watches
        if watching.is_set() and event == "socket.bind":
            seen["binds"].append(args[1])

    def sample(before: set[int]) -> None:
        while watching.is_set():
            for child in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    # New, and not started by a process that was there before (another test's Ray cluster
                    # starts workers of its own whenever it likes).
                    if child.pid not in before and not before & {a.pid for a in child.parents()}:
                        seen["commands"].append(" ".join(child.cmdline()))
                        if any(c.status == psutil.CONN_LISTEN for c in child.net_connections("inet")):
                            seen["listening"].add(child.pid)
            time.sleep(0.05)

    sys.addaudithook(audit)
    plan = Plan.quick()
    pool(_sender_main).close()  # senders outlive a test: an earlier one's would be "there before" and go unseen
    with running(service_ms=5, slots=2) as url:
        before = {c.pid for c in me.children(recursive=True)}  # the stub target itself listens: it is not measure/'s
        watching.set()
        sampler = threading.Thread(target=sample, args=(before,), daemon=True)
        sampler.start()
        try:
            labels = Labels("tiny")
            # Two sender processes asked for: on a quiet machine the client would plan one, and start none.
            swept = sweep_capacity(FastAPITarget(url, b"photo"), plan.load, labels, Sweep(start=2, max_levels=2),
                                   windowed(plan.windows, processes=2))
            pa = measure_stage(TritonTarget(url.split("//")[-1], "food_classifier", b"photo"),
                               [Load.sequential(2, warmup=0)], labels, [perf_analyzer_client(PerfAnalyzerOptions(timeout_s=30))])
        finally:
            watching.clear()
            sampler.join()
    assert swept and not swept[0].failed and pa[0].tool == "perf_analyzer"
    assert seen["binds"] == [] and seen["listening"] == set(), seen
    assert seen["commands"], "the sampler saw no sender process: it watched nothing"
    others = {c for c in seen["commands"] if "multiprocessing" not in c and "perf_analyzer" not in c}
    assert others == set(), others
