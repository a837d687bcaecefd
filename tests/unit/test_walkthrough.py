"""The pure parts of the measurement notebooks' steps (servelab.run.walkthrough), on stored real records.

The steps that talk to servers run end to end in tests/e2e/test_notebooks_measure.py.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from servelab.measure.records import Load, Record, read_records, GpuSeries
from servelab.core.procs import free_port
from servelab.servers.triton.configs import STAGES
from servelab.run.walkthrough.common import gourmetgram_label, latest, utilization, wait_until
from servelab.run.walkthrough.walk_fastapi import Service, queueing, serving
from servelab.run.walkthrough.stage_switch import COMPOSE_LOG, run_switch
from servelab.run.walkthrough.walk_triton import batch_count_change, describe_config, open_loads, running_stage

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
    config = {"instance_group": [{"count": 2, "kind": "KIND_GPU", "gpus": [0]}, {"count": 2, "kind": "KIND_CPU"}],
              "dynamic_batching": {"max_queue_delay_microseconds": "100"}}
    assert describe_config("onnx-dyn", config).splitlines() == [
        f"Triton runs onnx-dyn: {STAGES['onnx-dyn'].about}",
        '  instances: 2 x KIND_GPU [0], 2 x KIND_CPU; dynamic_batching: {"max_queue_delay_microseconds": "100"}',
    ]
    assert describe_config("pt-1", {}).endswith("instances: -; dynamic_batching: \"off\"")


# --- waiting, and what a probe says when nothing answers -------------------------------------


def test_wait_until_reports_each_new_state_once(capsys: pytest.CaptureFixture[str]) -> None:
    states = iter(["loading", "loading", "pt-1", "pt-dyn"])
    wait_until("pt-dyn", lambda: next(states), "pt-dyn", wait_s=10, interval_s=0)
    assert capsys.readouterr().out.splitlines() == ["waiting for pt-dyn; now: loading", "waiting for pt-dyn; now: pt-1"]


def test_wait_until_gives_up_saying_what_it_saw() -> None:
    with pytest.raises(TimeoutError, match="waited 0.05 s for stage x; still: loading"):
        wait_until("stage x", lambda: "loading", "ready", wait_s=0.05, interval_s=0.01)


def test_probes_say_when_nothing_answers() -> None:
    url = f"127.0.0.1:{free_port()}"
    assert serving(f"http://{url}") == "no answer (ConnectionError)"
    assert running_stage(url, "food_classifier") == "food_classifier not ready (URLError)"


def test_service_carries_config_and_stand_in() -> None:
    ready = {"service": "fastapi_onnx", "model": "food11", "runtime": {"providers": ["CPUExecutionProvider"]},
             "batching": {"enabled": True}, "stand_in": True, "description": "zero-shot stand-in", "status": "ok",
             "variant": {"name": "fp32", "file": "food11.onnx"}}
    service = Service("fastapi-onnx-dyn", "http://127.0.0.1:1", ready)
    assert service.config == {**{key: ready[key] for key in ("service", "model", "runtime", "batching")}, "variant": "fp32"}
    assert service.stand_in == "zero-shot stand-in"
    assert Service("s", "u", {**ready, "stand_in": False}).stand_in is None


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
