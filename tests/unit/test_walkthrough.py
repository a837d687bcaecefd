"""The pure parts of the measurement notebooks' steps (servelab.run.walkthrough), on stored real records.

The steps that talk to servers run end to end in tests/e2e/test_notebooks_measure.py.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from servelab.core.paths import REPO_ROOT
from servelab.core.procs import free_port
from servelab.measure.records import CacheStats, GpuSeries, Load, PerRequest, Record, Rollout, Timeline, read_records
from servelab.run.walkthrough.common import gourmetgram_label, latest, utilization, wait_until
from servelab.run.walkthrough.production import by_version, caching, over_time, queue_words, shedding
from servelab.run.walkthrough.stage_switch import COMPOSE_LOG, run_switch
from servelab.run.walkthrough.walk_fastapi import Serving, ServingStage, check_timing, queueing, serving, switch_line
from servelab.run.walkthrough.walk_triton import (
    TritonWalkthrough,
    batch_count_change,
    describe_config,
    open_loads,
    running_stage,
)
from servelab.servers.triton.configs import STAGES

RECORDS = Path(__file__).parents[1] / "data" / "bench_records.jsonl"
# `servelab load fastapi --concurrency 1,8,16 --requests 200` against fastapi-pt and fastapi-onnx,
# 2026-11-23 on the project's 2-CPU VM, offline stand-in model, nothing else running.
OVERLAP = Path(__file__).parents[1] / "data" / "fastapi_concurrency_records.jsonl"


@pytest.fixture(scope="module")
def records() -> list[Record]:
    return read_records(RECORDS)


def _one(records: list[Record], stage: str, label: str) -> Record:
    (found,) = [r for r in records if r.stage == stage and r.load.label() == label]
    return found


# --- queueing: Little's law from a sequential and a concurrent run -----------------------------


def test_queueing_puts_the_runs_side_by_side_with_littles_law(records: list[Record]) -> None:
    alone, busy = _one(records, "tiny-20ms", "sequential"), _one(records, "tiny-20ms", "concurrency 8")
    assert queueing(alone, busy).splitlines() == [
        "one at a time: 21.1 ms per request, 47 req/s",
        "8 senders: 50 req/s = 1.05 x the rate alone, mean latency 150.8 ms = 7.2 x the time alone",
        "Little's law: 8 requests in flight / 50 req/s = 160.2 ms each",
        "the service's own account: 129.8 ms waiting + 20.0 ms being worked on",
        "one inference at a time, 20.0 ms each: at most 50 req/s",
    ]


def test_queueing_ceiling_counts_the_images_of_a_batch(records: list[Record]) -> None:
    alone, busy = _one(records, "tiny-20ms", "sequential"), _one(records, "tiny-20ms", "concurrency 8")
    batched = busy.breakdown.model_copy(update={"mean_batch_size": 4.0})
    last = queueing(alone, busy.model_copy(update={"breakdown": batched})).splitlines()[-1]
    assert last == "one inference at a time, 20.0 ms each for 4.0 images on average: at most 200 req/s"


@pytest.mark.parametrize("stage", ["fastapi-pt", "fastapi-onnx"])
def test_unbatched_fastapi_overlaps_preparing_with_inference(stage: str) -> None:
    """What 4_fastapi tells students to look for, on real runs (2-CPU VM, 200 requests each): with
    several senders an unbatched service serves more requests per second than one at a time, because
    preparing one request overlaps with inference on another, up to one inference at a time."""
    runs = [r for r in read_records(OVERLAP) if r.stage == stage]
    alone, busy = runs[0], runs[1:]
    assert [r.load.concurrency for r in runs] == [1, 8, 16]
    for run in busy:
        assert run.breakdown.mean_batch_size == 1.0
        assert run.stats.throughput_rps > 1.1 * alone.stats.throughput_rps
        ceiling = 1000 / run.breakdown.parts_ms["infer"]
        assert run.stats.throughput_rps == pytest.approx(ceiling, rel=0.03)
        assert f"at most {ceiling:.0f} req/s" in queueing(alone, run)


def test_littles_law_agrees_with_the_measured_latency(records: list[Record]) -> None:
    """N / X is the mean time in the system: the stored runs must bear it out within a few percent."""
    alone = _one(records, "pa-sample", "sequential")
    for busy in (_one(records, "pa-sample", "concurrency 16"), _one(records, "tiny-20ms", "concurrency 4")):
        predicted = 1000 * busy.load.concurrency / busy.stats.throughput_rps
        assert predicted == pytest.approx(busy.stats.latency.mean_ms, rel=0.07)
        assert f"= {predicted:.1f} ms each" in queueing(alone, busy)


def test_queueing_leaves_out_the_service_account_when_there_is_none(records: list[Record]) -> None:
    alone, busy = _one(records, "tiny-20ms", "sequential"), _one(records, "tiny-20ms", "concurrency 2")
    text = queueing(alone, busy.model_copy(update={"breakdown": None}))
    assert len(text.splitlines()) == 3 and "own account" not in text
    assert "2 senders: 50 req/s" in text


# --- utilization --------------------------------------------------------------------------------


def test_utilization_without_gpu_says_why(records: list[Record]) -> None:
    record = _one(records, "tiny-20ms", "concurrency 2")
    assert record.monitors.gpu_note.startswith("no GPU monitoring (NVMLError")
    assert utilization(record) == f"CPU 75% busy, {record.monitors.gpu_note}"
    silent = record.monitors.model_copy(update={"gpu_note": None})
    assert utilization(record.model_copy(update={"monitors": silent})) == "CPU 75% busy, no GPU samples"


def test_utilization_averages_each_gpu(records: list[Record]) -> None:
    record = _one(records, "tiny-20ms", "concurrency 4")
    gpus = [GpuSeries(index=0, name="Tesla P100", util_pct=[40, 60], mem_total_mib=16280),
            GpuSeries(index=1, name="Tesla P100", util_pct=[], mem_total_mib=16280),  # no samples: left out
            GpuSeries(index=2, name="Tesla P100", util_pct=[99, 100, 100], mem_total_mib=16280)]
    with_gpus = record.model_copy(update={"monitors": record.monitors.model_copy(update={"gpus": gpus})})
    assert utilization(with_gpus) == "CPU 75% busy, GPU 0 50% busy, GPU 2 100% busy"


def test_utilization_of_a_run_without_monitors(records: list[Record]) -> None:
    assert utilization(_one(records, "pa-sample", "sequential")) == "no utilization recorded"


# --- the newest run of each measurement -------------------------------------------------------


def test_latest_keeps_the_newest_run_of_each_measurement_in_first_run_order(records: list[Record]) -> None:
    rerun = records[0].model_copy(update={"started_at": "2030-01-01T00:00:00+00:00"})
    other_batch = records[0].model_copy(update={"batch": 16})
    newest = latest([*records, rerun, other_batch])
    assert newest[0] is rerun  # the rerun replaces the first run, in its place
    assert newest[1:] == [*records[1:], other_batch]
    assert latest(records) == records  # every stored record is its own measurement


# --- loads and Triton's batch counts ------------------------------------------------------------


def test_open_loads_pair_even_and_random_arrivals_at_each_rate() -> None:
    loads = open_loads([120, 300], 10, 50)
    assert [load.label() for load in loads] == [
        "constant 120 req/s", "poisson 120 req/s", "constant 300 req/s", "poisson 300 req/s"]
    assert all(load.mode == "open" and load.duration_s == 10 and load.warmup == 50 and load.requests is None
               for load in loads)
    assert loads[1] == Load.open(120, "poisson", duration_s=10, warmup=50)
    assert open_loads([], 10, 50) == []


def test_batch_count_change_keeps_only_what_grew() -> None:
    before = {1: 40, 4: 2}
    after = {1: 40, 2: 3, 4: 7, 8: 1}
    assert batch_count_change(before, after) == {2: 3, 4: 5, 8: 1}
    assert batch_count_change(after, after) == {}
    assert batch_count_change({}, {1: 2}) == {1: 2}


def test_describe_config_shows_instances_and_batching() -> None:
    config = {"name": "food_classifier_onnx", "max_batch_size": 16,
              "instance_group": [{"count": 2, "kind": "KIND_GPU", "gpus": [0]}, {"count": 2, "kind": "KIND_CPU"}],
              "dynamic_batching": {"max_queue_delay_microseconds": "100"}}
    assert describe_config("onnx-dyn", config).splitlines() == [
        f"Triton runs onnx-dyn: {STAGES['onnx-dyn'].about}",
        "  food_classifier_onnx: max_batch_size 16; scheduler: dynamic_batching { preferred_batch_size: [16] "
        "max_queue_delay_microseconds: 100 }; instances: 2x KIND_GPU on GPU 0 + 2x KIND_CPU; no warm-up; "
        "response cache off",
    ]
    assert "scheduler: none; instances: none" in describe_config("pt-1", {"name": "food_classifier"})


# --- waiting, and what a probe says when nothing answers -------------------------------------


def test_wait_until_reports_each_new_state_once(capsys: pytest.CaptureFixture[str]) -> None:
    states = iter(["loading", "loading", "pt-1", "pt-dyn"])
    wait_until("pt-dyn", lambda: next(states), "pt-dyn", wait_s=10, interval_s=0)
    assert capsys.readouterr().out.splitlines() == ["waiting for pt-dyn; now: loading", "waiting for pt-dyn; now: pt-1"]


def test_wait_until_gives_up_saying_what_it_saw() -> None:
    with pytest.raises(TimeoutError, match="waited 0.05 s for stage x; still: loading"):
        wait_until("stage x", lambda: "loading", "ready", wait_s=0.05, interval_s=0.01)


def test_a_long_wait_says_once_what_it_waits_for_and_what_to_type(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #66: a switch not typed yet must not look like a slow one for 20 min."""
    states = iter(["pt-1"] * 6 + ["pt-dyn"])
    wait_until("Triton to run pt-dyn", lambda: next(states), "pt-dyn", wait_s=60, interval_s=0.01, nudge_s=0.02,
               to_type="servelab triton stage pt-dyn")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "waiting for Triton to run pt-dyn; now: pt-1"
    assert out[1:] == ["still waiting after 0.000333333 min (at most 1) for Triton to run pt-dyn; if you have not typed "
                       "it yet, in your SSH session (in ~/servelab): servelab triton stage pt-dyn"]


def test_a_wait_for_the_fastapi_service_names_the_line_that_switches_it() -> None:
    assert switch_line(Serving("fastapi_onnx", True, "fp32", 0, False)) == (
        "FASTAPI_STAGE=fastapi_onnx MAX_BATCH_SIZE=16 BATCH_TIMEOUT_MS=5 docker compose -f "
        "docker/docker-compose-fastapi.yaml up -d fastapi_server")
    assert switch_line(Serving("fastapi_onnx", False, "fp32", 0, True)) == (
        "CACHE_URL=redis://redis:6379/0 FASTAPI_STAGE=fastapi_onnx docker compose -f docker/docker-compose-fastapi.yaml "
        "--profile cache up -d redis fastapi_server")
    notebook = (REPO_ROOT / "notebooks" / "4_fastapi.md").read_text(encoding="utf-8")
    for want in [Serving("fastapi_onnx", False, "int8", 0, False), Serving("fastapi_onnx", False, "fp32", 8, False)]:
        assert switch_line(want) in notebook


def test_probes_say_when_nothing_answers() -> None:
    url = f"127.0.0.1:{free_port()}"
    assert serving(f"http://{url}") == "no answer (ConnectionError)"
    assert running_stage(url, "food_classifier") == "food_classifier not ready (URLError)"


def test_service_carries_config_and_stand_in() -> None:
    ready = {"service": "fastapi_onnx", "model": "food11", "runtime": {"providers": ["CPUExecutionProvider"]},
             "batching": {"enabled": True}, "stand_in": True, "description": "zero-shot stand-in", "status": "ok",
             "variant": {"name": "fp32", "file": "food11.onnx"}}
    service = ServingStage("fastapi-onnx-dyn", "http://127.0.0.1:1", ready)
    assert service.config == {**{key: ready[key] for key in ("service", "model", "runtime", "batching")}, "variant": "fp32"}
    assert service.stand_in == "zero-shot stand-in"
    assert ServingStage("s", "u", {**ready, "stand_in": False}).stand_in is None


def test_gourmetgram_label_reads_the_page_title() -> None:
    assert gourmetgram_label("<html><title>Dessert · GourmetGram</title>") == "Dessert"
    assert gourmetgram_label("<html><title>GourmetGram</title>") is None


# --- switching stages: progress, a bound, and why it failed -------------------------------------


def _python(code: str) -> str:
    return f"{sys.executable} -c {code!r}"


def test_a_stage_switch_shows_each_new_state_once_and_its_time(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"127.0.0.1:{free_port()}"
    took = run_switch(_python("import time; time.sleep(1)"), url, ("food_classifier",), wait_s=30, interval_s=0.1)
    shown = capsys.readouterr().out.splitlines()
    assert 1 <= took < 10
    assert shown[0] == f"$ {_python('import time; time.sleep(1)')}"
    assert len(shown) == 2 and shown[1].endswith("s  Triton does not answer (URLError)")


def test_a_failing_stage_switch_says_what_the_command_and_triton_said() -> None:
    url = f"127.0.0.1:{free_port()}"
    with pytest.raises(RuntimeError) as failure:
        run_switch(_python("print('no stage pt-9'); raise SystemExit(3)"), url, ("food_classifier",), wait_s=30)
    message = str(failure.value)
    assert "failed (exit 3):\nno stage pt-9" in message
    assert "Triton says: Triton does not answer" in message
    assert COMPOSE_LOG in message  # no server of ours here: where the log is on the node


def test_a_stage_switch_that_hangs_is_stopped_within_its_bound() -> None:
    url = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish within 1 s"):
        run_switch(_python("import time; time.sleep(60)"), url, ("food_classifier",), wait_s=1, interval_s=0.1)
    assert time.monotonic() - started < 5


# --- the production section: overload, cache, rollout ------------------------------------------


def test_queue_words_name_the_bound_as_the_catalogue_does() -> None:
    assert queue_words({"batching": {"max_queue_requests": 0, "max_queue_delay_ms": 0}}) == "none"
    assert queue_words({"batching": {"max_queue_requests": 8}}) == "8 requests"
    assert queue_words({"batching": {"max_queue_requests": 8, "max_queue_delay_ms": 20.0}}) == "8 requests, 20 ms"


def _overloaded(r: Record, bound: str, shed: dict[str, int], p99: list[float | None]) -> Record:
    timeline = Timeline(bin_s=1.0, t_s=[0.0, 1.0], throughput_rps=[50.0, 40.0], errors=[0, 1],
                        shed=[0, sum(shed.values())], p50_ms=[10.0, 20.0], p99_ms=p99, offered_rps=[60.0, 60.0])
    return r.model_copy(update={"stage": f"s-{bound}", "config": {"run": "overload", "bound": bound}, "timeline": timeline,
                                "stats": r.stats.model_copy(update={"shed": shed, "errors": {"http_500": 1}})})


def test_over_time_and_shedding_count_shed_apart_from_failed(records: list[Record]) -> None:
    alone, base = _one(records, "tiny-20ms", "sequential"), _one(records, "tiny-20ms", "concurrency 8")
    unbounded = _overloaded(base, "none", {}, [30.0, 90.0])
    shed = _overloaded(base, "8 requests", {"queue_full": 7}, [None, 25.0])
    lines = over_time(shed).splitlines()
    assert lines[0].split() == ["t", "s", "offered/s", "ok/s", "shed", "failed", "p50", "ms", "p99", "ms"]
    assert lines[-1].split() == ["1", "60", "40", "7", "1", "20", "25"] and lines[-2].split()[-1] == "-"
    header, *both = shedding(alone, unbounded, shed).splitlines()
    assert header.split()[:5] == ["stage", "bound", "ok", "shed", "failed"] and header.endswith("x the service time")
    assert re.search(r"  none +\d+ +0 +1 +30 -> 90 ", both[0]), both[0]
    assert re.search(r"  8 requests +\d+ +queue_full 7 +1 +25 -> 25 ", both[1]), both[1]
    service = alone.stats.latency.p50_ms
    assert both[1].split()[-1] == f"{base.stats.latency.p99_ms / service:.1f}"


def test_caching_reads_the_hit_ratio_from_the_servers_counters(records: list[Record]) -> None:
    base = _one(records, "tiny-20ms", "concurrency 8")
    mix = {"target": {"mix": {"photos": 11, "s": 1.0, "distinct_photos": 11}}}
    cached = base.model_copy(update={"cache": CacheStats(source="servelab_response_cache", hits=75, misses=25), **mix})
    text = caching(base.model_copy(update=mix), cached)
    assert "hits 75, misses 25, errors 0: hit ratio 75 %" in text and "= 1.00 x" in text
    assert "11 photos, Zipf s=1.0" in text


def test_by_version_counts_each_bins_answers_by_the_version_that_gave_them(records: list[Record]) -> None:
    base = _one(records, "tiny-20ms", "concurrency 8")
    # Completed at 0.1, 0.6, 0.7, 1.2 s (sent + latency): old, old, new, new; a failure at 0.65 s.
    per = PerRequest(sent_s=[0.0, 0.5, 0.6, 0.55, 1.1], latency_ms=[100.0, 100.0, 100.0, 100.0, 100.0],
                     outcome=["ok", "ok", "ok", "timeout", "ok"], version=["aaa", "aaa", "bbb", None, "bbb"])
    rollout = Rollout(trigger_s=0.5, done_s=0.6, result={"model_version": "bbb"}, old_versions=["aaa"],
                      new_version="bbb", first_new_s=0.2, failed=1, p99_before_ms=100.0, p99_during_ms=100.0,
                      p99_after_ms=100.0)
    r = base.model_copy(update={"per_request": per, "rollout": rollout, "timeline": Timeline(bin_s=0.5)})
    lines = by_version(r).splitlines()
    assert lines[0].split() == ["t", "s", "answered", "by", "aaa", "answered", "by", "bbb", "failed"]
    assert [line.split() for line in lines[1:4]] == [["0", "1", "0", "0"], ["0.5", "1", "1", "1"], ["1", "0", "1", "0"]]
    assert "aaa -> bbb" in lines[-2] and "failed requests: 1 (the aim: none)" in lines[-1]


# --- a student's config block is never measured under the stage's name ----------------------------


def test_a_students_block_loads_as_theirs_and_the_stage_is_measured_only_after_its_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """write_config labels the student's config '(yours)', which running_stage never takes for the stage;
    lab.measure refuses the stage until lab.check_block passes; the check shows the catalogue's fields only
    once it passes (a wrong block gets the diff, and measuring stays refused)."""
    import asyncio

    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from servelab.core.paths import DEFAULT_IMAGE, MODELS_STAGING
    from servelab.run.walkthrough import walk_triton
    from servelab.servers.triton.server import SwitchTarget

    model = STAGES["pt-2x2"].triton.model
    (tmp_path / model).mkdir()
    (tmp_path / model / "config.pbtxt").write_bytes((MODELS_STAGING / model / "config.pbtxt").read_bytes())
    url = f"127.0.0.1:{free_port()}"  # nothing answers there: the stage is never reached in this test
    monkeypatch.setattr(walk_triton, "switch_target", lambda _url: SwitchTarget(url, "cpu", False, tmp_path, None))
    lab = walk_triton.TritonWalkthrough(url, DEFAULT_IMAGE, tmp_path / "results", wait_s=0, stages=["pt-2x2"],
                                        perf_analyzer=False, repository=tmp_path)
    wrong = "instance_group [ { count: 1, kind: KIND_GPU, gpus: [ 0 ] } ]"  # pt-1's, the untouched answer's kind
    path = lab.write_config("pt-2x2", wrong)
    written = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    label = written.parameters["servelab_stage"].string_value
    assert label == "pt-2x2 (yours, cpu)" and walk_triton.stage_label(label) == "pt-2x2 (yours)"
    assert walk_triton.stage_label("pt-2x2 (gpu)") == "pt-2x2"
    with pytest.raises(RuntimeError, match="has not passed lab.check_block yet"):
        asyncio.run(lab.measure("pt-2x2", [Load.closed(8, 4, warmup=0)]))
    with pytest.raises(ValueError, match="not pt-2x2's `instance_group` yet"):
        lab.check_block("pt-2x2", wrong)
    with pytest.raises(RuntimeError, match="has not passed"):
        asyncio.run(lab.measure("pt-2x2", [Load.closed(8, 4, warmup=0)]))
    right = "instance_group [ { count: 2, kind: KIND_GPU, gpus: [ 0 ] }, { count: 2, kind: KIND_GPU, gpus: [ 1 ] } ]"
    said = lab.check_block("pt-2x2", right)
    assert said.startswith("correct: Triton reads this as pt-2x2's `instance_group`") and "count: 2" in said
    # Passed: measuring now waits for Triton to run the catalogue's pt-2x2 (nothing answers here: it times out).
    with pytest.raises(TimeoutError, match="servelab triton stage pt-2x2"):
        asyncio.run(lab.measure("pt-2x2", [Load.closed(8, 4, warmup=0)]))
    lab.write_config("pt-2x2", wrong)  # a new block is checked again
    with pytest.raises(RuntimeError, match="has not passed"):
        asyncio.run(lab.measure("pt-2x2", [Load.closed(8, 4, warmup=0)]))


@pytest.mark.parametrize("load", [Load.sequential(100, warmup=10), Load.closed(16, 1000, warmup=5),
                                  Load.open(120, "poisson", duration_s=10, warmup=0),
                                  Load.closed(8, requests=None, duration_s=5, warmup=0)], ids=lambda load: load.label())
def test_every_helper_run_prints_the_servelab_load_command_it_stands_for(load: Load) -> None:
    """The command line parses with the real CLI and asks for the same load, target and stage."""
    import shlex

    from servelab.cli import build_parser
    from servelab.run.walkthrough.common import load_command

    for kind, where, batch in (("fastapi", ["--url", "http://fastapi_server:8000"], 1),
                               ("triton", ["--url", "triton_server:8000", "--model", "food_classifier_onnx",
                                           "--input", "tensor"], 16)):
        shown = load_command(kind, where, load, "onnx-dyn", batch)
        assert shown.startswith("$ servelab load ")
        args = build_parser().parse_args(shlex.split(shown[2:])[1:])
        assert (args.requests, args.duration, args.warmup, args.stage, args.batch) == (
            load.requests, load.duration_s, load.warmup, "onnx-dyn", batch)
        assert args.concurrency == ([load.concurrency] if load.mode == "closed" else None)
        assert args.rate == ([load.rate] if load.mode == "open" else None)
        assert load.mode != "open" or args.arrivals == load.arrivals


# --- checks of what students write ------------------------------------------------------------


def test_a_timing_loop_is_checked_against_the_helpers_run_of_the_same_load(records: list[Record]) -> None:
    run = _one(records, "tiny-20ms", "sequential")  # 30 requests, p50 21 ms, 47 req/s
    p50, n = run.stats.latency.p50_ms, run.load.requests
    assert check_timing([p50] * n, n / run.stats.throughput_rps, run).startswith("right: median 21.1 ms")
    assert "wrong: 35 latencies, the load has 30 timed requests" in check_timing([p50] * 35, 1.0, run)  # warm-up timed
    assert "your median is over 3 x off" in check_timing([p50 / 1000] * n, n / run.stats.throughput_rps, run)  # seconds


PRINTED = """*** Measurement Settings ***
  Batch size: 1
  Service Kind: TRITON
  Using "time_windows" mode for stabilization
  Stabilizing using p95latency and throughput
  Measurement window: 5000 msec
  Using synchronous calls for inference

Request concurrency: 8
Inferences/Second vs. Client p95 Batch Latency
Concurrency: 8, throughput: 52.3 infer/sec, latency 160000 usec"""  # perf_analyzer 2.50's words, the figures made up


def test_a_typed_perf_analyzer_run_is_checked_against_the_steps_settings(records: list[Record]) -> None:
    lab = TritonWalkthrough.__new__(TritonWalkthrough)  # no server: only what the check reads
    lab.pa_window_s, lab.pa_extra = 5, ["--percentile=95", "--max-trials=5"]
    lab.runs = [_one(records, "tiny-20ms", "concurrency 8").model_copy(update={"stage": "pt-1"})]
    said = lab.check_printed_run(PRINTED.splitlines(), "pt-1")
    assert said.startswith("right: the step's settings and load\n  Concurrency: 8, throughput: 52.3 infer/sec")
    assert "(the step's servelab: 49.9 infer/sec)" in said
    other = PRINTED.replace("5000 msec", "1000 msec").replace("p95", "p99").replace("Concurrency: 8,", "Concurrency: 4,")
    said = lab.check_printed_run(other.splitlines(), "pt-1")
    assert said.startswith("wrong: Measurement window 1000 msec, the step's 5000 msec; Stabilizing using p99, the step's p95; "
                           "concurrency 4, the step's 8")
    failed = ["Request concurrency: 8", "Failed to obtain stable measurement within 5 measurement windows for concurrency 8."]
    assert lab.check_printed_run(failed, "pt-1").startswith("wrong: perf_analyzer measured nothing")
