"""`servelab lab --quick` end to end, and no server left behind, also after Ctrl-C.

One quick lab (every stage; tests/e2e/conftest.py's ``quick_lab``) is run per session and each test below reads
its part of it: the stages, Ray Serve, both clients on Triton, the report and run record, where each stage
ran, the GPU record made from it. Three more runs need their own: the variant stages alone, one without
perf_analyzer, one interrupted."""

import os
import re
import signal
import time
from collections import Counter

import psutil
import pytest

from lab_process import LAB_TIMEOUT_S, lab_process
from servelab.core.catalogue import CACHED, OVERLOADED, QUEUE_BOUND, QUEUE_WAIT_US, ROLLED, bounded, cached_name
from servelab.core.catalogue import STAGES as STAGES_BY_NAME
from servelab.core.hardware import stack
from servelab.measure.ceiling import measure_ceiling
from servelab.measure.fractions import capacity, where
from servelab.measure.limit import LIMIT_FILE, Limit, simple_app_line
from servelab.measure.records import read_records
from servelab.run.lab import preflight
from servelab.run.lab_run import LabRun
from servelab.run.plan import LAB_STAGES as STAGES
from servelab.run.plan import Plan
from servelab.servers.triton.configs import gpu_count
from servelab.tools.gpu_check import record_markdown

RUN = [s for s in STAGES if not s.needs_gpu or gpu_count()]  # the fp16 stages need a GPU
TRITON = {s.name for s in RUN if s.family == "triton"}
RAY = {s.name for s in RUN if s.family == "ray"}

# Every test here reads a real lab run or makes one: minutes on 2 CPUs (`-m "not slow"` leaves them out).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(LAB_TIMEOUT_S + 120)]


def _prometheus_here() -> bool:
    """Prometheus can run here; CI installs it, so there it must."""
    from servelab.core.installers.prometheus_install import PrometheusNotFound, locate

    try:
        return bool(locate())
    except PrometheusNotFound:
        assert not os.environ.get("CI"), "CI runs make test, which installs Prometheus"
        return False


# --- one `servelab lab --quick` (tests/e2e/conftest.py's quick_lab), read by each test below -------------


def test_quick_lab_measures_every_stage_and_leaves_no_server(quick_lab):
    records, output = quick_lab.records, quick_lab.output
    twins = {bounded(STAGES_BY_NAME[n]).name for n in OVERLOADED} | {cached_name(n) for n in CACHED}
    assert {r.stage for r in records} == {s.name for s in RUN} | twins
    assert gpu_count() or all(f"[{s.name}] skipped: it needs a GPU" in output for s in STAGES if s.needs_gpu)
    failure = [r for r in records if r.config.get("run") == "node failure"]
    assert all(r.stats.error_count == 0 and r.stats.successes and not r.failed for r in records if r not in failure)
    assert all(r.stand_in for r in records)  # the offline model is a stand-in, and says so
    assert not quick_lab.left_running


def test_quick_lab_starts_each_server_once_per_stage_it_serves(quick_lab):
    """A switch to what is already served does nothing (run/families.py): a FastAPI stage's server starts, and a Ray
    stage is deployed, once each time the lab comes to it from another stage's records (its cache or bounded twin,
    the other stage of a lesson's rounds, the node-failure run that comes back to its stage last) or after a
    rollout (which leaves the stage served as it no longer starts); one tritonserver serves every Triton stage.
    Counted from the servers' own logs (the limit's servers log into logs/limit/)."""
    assert quick_lab.returncode == 0, quick_lab.output
    logs = quick_lab.out / "logs"
    records = [r for r in quick_lab.records if r.tool == "servelab"]
    came = Counter(r.stage for before, r in zip([None, *records], records)
                   if before is None or before.stage != r.stage or before.config.get("run") == "rollout")
    started = Counter(re.sub(r"-\d+$", "", p.stem) for p in logs.glob("fastapi-*.log"))
    assert list((logs / "limit").glob("fastapi-onnx-*.log"))  # the limit's own, apart
    assert started == {name: n for name, n in came.items() if name.startswith("fastapi")}
    assert any(r.config.get("run") == "rounds" for r in records)  # the rounds switch back and forth, and count too
    ray = [s.name for s in RUN if s.family == "ray"]
    deployed = {name: (logs / f"ray-deploy-{name}.log").read_text().count(f"{name} deployed in") for name in ray}
    assert deployed == {name: came[name] for name in ray}
    assert (logs / "tritonserver.log").read_text().count("Started HTTPService") == 1


def test_quick_lab_overloads_a_stage_without_a_bound_and_with_one(quick_lab):
    """The overload case: 1.5× each OVERLOADED stage's capacity, open loop, as it is and with its queue bounded."""
    runs = {r.stage: r for r in quick_lab.records if r.config.get("run") == "overload"}
    twins = {name: bounded(STAGES_BY_NAME[name]).name for name in OVERLOADED}
    assert set(runs) == set(twins) | set(twins.values())
    for name, twin in twins.items():
        free, shed = runs[name], runs[twin]
        assert shed.config["capacity_rps"] == free.config["capacity_rps"]  # the same load offered to both
        # FastAPI bounds the requests it holds, Triton the wait (a full max_queue_size queue stalls its batcher).
        said = {"fastapi": f"{QUEUE_BOUND} requests", "triton": f"{QUEUE_WAIT_US // 1000} ms"}[STAGES_BY_NAME[name].family]
        assert (free.config["bound"], shed.config["bound"]) == ("none", said)
        assert not free.stats.shed and free.stats.error_count == 0 and free.timeline and free.per_request
        assert shed.stats.error_count == 0 and sum(shed.stats.shed.values()) > 0, shed.stats  # the excess refused
    report = quick_lab.text("report.md")
    assert "## Overload and load shedding" in report and (quick_lab.out / "overload_timelines.png").exists()
    assert "- **A bounded queue under load above capacity**." in report and "- fastapi-onnx-shed ÷ fastapi-onnx, " in report


def test_quick_lab_sends_a_skewed_mix_of_photos_without_a_cache_and_with_one(quick_lab):
    """The cache case: the same seeded Zipf mix of the bundled photos on each CACHED stage and on its twin with a
    cache (Redis in front of FastAPI, Triton's own); the twin's record holds the hit ratio from the server's counters."""
    runs = {r.stage: r for r in quick_lab.records if r.config.get("run") == "cache"}
    assert set(runs) == {n for name in CACHED for n in (name, cached_name(name))}
    for name in CACHED:
        plain, cached = runs[name], runs[cached_name(name)]
        assert plain.target["mix"] == cached.target["mix"] and plain.target["mix"]["popularity"] == "zipf"
        assert plain.cache is None and cached.cache.hits > 0, cached.cache  # a few dozen requests: some repeat
        assert plain.stats.error_count == cached.stats.error_count == 0
    assert "- **A response cache under a skewed mix of photos**." in quick_lab.text("report.md")


def test_quick_lab_rolls_out_a_new_version_under_load_with_nothing_failed(quick_lab):
    """The rollout case under 16 senders: fastapi-onnx swaps fp32 for its ROLLED variant (POST /admin/reload),
    Triton's onnx-1 loads version 2 and retires version 1 (the repository keeps version 1 alone after it), Ray
    Serve's ray-1 reloads its replica in place."""
    runs = {r.stage: r for r in quick_lab.records if r.config.get("run") == "rollout"}
    assert set(runs) == set(ROLLED)
    for stage, run in runs.items():
        o = run.rollout
        assert run.config["to_variant"] == ROLLED[stage]
        assert o.error is None and o.failed == 0 and run.stats.error_count == 0, o  # the aim: nothing dropped
        assert o.new_version and o.new_version not in o.old_versions and o.first_new_s is not None
        assert o.old_sent_after_ready == 0  # no request sent once the new version was ready got the old one
    assert runs["onnx-1"].rollout.old_versions == ["1"] and runs["onnx-1"].rollout.new_version == "2"
    model = STAGES_BY_NAME["onnx-1"].triton.model
    assert sorted(p.name for p in (quick_lab.repository / model).iterdir() if p.name.isdigit()) == ["1"]
    assert "- **A new model version rolled out under load**." in quick_lab.text("report.md")


def test_quick_lab_ray_stages_place_replicas_step_the_load_and_lose_a_node(quick_lab):
    """Ray Serve: placement by node id in every record, a step load with replicas sampled, a node killed."""
    records = quick_lab.records
    failure = [r for r in records if r.config.get("run") == "node failure"]
    ray = [r for r in records if r.stage in RAY]
    assert all(r.config["replicas_per_node"] for r in ray)
    assert max(len(r.config["replicas_per_node"]) for r in ray if r.stage == "ray-2") == 2
    step = [r for r in ray if r.config.get("run") == "step load"]
    assert len(step) == 1 and step[0].timeline.replicas and step[0].load.phases
    assert len(failure) == 1 and failure[0].stage == "ray-2" and "worker node killed" in failure[0].timeline.events
    assert failure[0].stats.successes
    if _prometheus_here():  # Prometheus read Ray's own metrics: its proxy counted what our client sent
        counted = [r.prometheus for r in ray if r not in failure]
        assert all(p.requests == p.client_requests for p in counted) and any("compute (ms)" in p.series for p in counted), counted
    report = quick_lab.text("report.md")
    assert "## Ray Serve: placement" in report and (quick_lab.out / "ray_timelines.png").exists()


def test_quick_lab_measures_the_triton_loads_with_both_clients(quick_lab):
    """Every Triton stage by servelab's client; perf_analyzer right after it on the same loads, on one stage
    per way it is fed (Plan.quick); batched requests where the stage batches."""
    records = quick_lab.records
    ours = [(r.stage, r.load.label(), r.batch) for r in records if r.tool == "servelab" and r.stage in TRITON]
    theirs = [(r.stage, r.load.label(), r.batch) for r in records if r.tool == "perf_analyzer"]
    assert {stage for stage, _, _ in ours} == TRITON
    assert set(theirs) <= set(ours) and {stage for stage, _, _ in theirs} == set(Plan.quick().perf_analyzer) & TRITON
    assert {"pt-1", "onnx-dyn", "onnx-b16", "onnx-u8", "ensemble"} <= {stage for stage, _, _ in theirs}
    assert {(stage, batch) for stage, _, batch in theirs if batch > 1} == {("pt-1", 16), ("onnx-dyn", 16), ("onnx-b16", 16)}
    assert {batch for stage, _, batch in ours if stage == "onnx-b16"} == {16}  # its client's batches only
    assert {label.split()[0] for stage, label, _ in theirs if stage == "onnx-dyn"} >= {"constant", "poisson"}
    assert "perf_analyzer vs servelab" in quick_lab.output and "## Two clients, one server" in quick_lab.text("report-tables.md")


def test_quick_lab_writes_the_report_the_run_record_and_the_printout(quick_lab):
    records, output = quick_lab.records, quick_lab.output
    report, tables = quick_lab.text("report.md"), quick_lab.text("report-tables.md")  # the long tables, linked
    assert "| pt-2x2 |" in tables and (quick_lab.out / "latency_cdf.png").exists()
    assert "## What this run shows" in report and "- onnx-1 ÷ pt-1, capacities: each at its own capacity's senders" in report  # its rounds' line (#65)
    assert "## Capacity: each stage's concurrency sweep" in report
    assert "lab finished" in output and "p50" in output
    run = LabRun.read(quick_lab.out / "run.json")  # what the run was and how long it took, as printed
    assert run.plan == "quick" and run.stages == [s.name for s in RUN] and run.failures == []
    assert 0 < run.models_s < run.total_s and run.timing() in output
    # Every run is in the tables and the printout, the open-loop ones of every stage too.
    assert "| fastapi-pt | servelab | poisson " in tables and "| pt-1 | servelab | poisson " in tables
    assert len([line for line in output.splitlines() if line.strip().startswith(("servelab ", "perf_analyzer "))
                and "req/s" in line]) == len(records)
    # The machine's limit, measured after the stages, and the service's defaults beside the simple app.
    limit = Limit.model_validate_json((quick_lab.out / LIMIT_FILE).read_text())
    assert limit.rps > 0 and set(limit.simple_app) == {"simple app", "fastapi-onnx, no settings"}
    assert f"limit: {limit.rps:.1f} req/s" in output and simple_app_line(limit) in report


def test_quick_lab_runs_are_windows_and_each_stage_s_sweep_keeps_its_curve(quick_lab):
    """Every closed-loop run of servelab's client lasts the plan's windows (a warm-up window, then three windows
    of seconds), never a count of requests; each stage's sweep (one at a time, then 2 senders in the quick plan)
    ends in a record that keeps the curve, and perf_analyzer measures in time windows."""
    plan = Plan.quick()
    closed = [r for r in quick_lab.records if r.tool == "servelab" and r.load.mode in ("sequential", "closed")
              and r.config.get("run") not in ("rollout", "node failure")]
    assert closed and all(r.load.requests is None and r.load.duration_s for r in closed)
    swept = [r for r in closed if r.config.get("run") != "cache"]
    window = plan.load(1)  # the plan's warm-up window, then its measured windows
    assert all(r.load.warmup_s == window.warmup_s == plan.warmup_s and r.load.duration_s == window.duration_s
               for r in swept)
    assert all(len(r.config["windows"]["throughput_rps"]) <= 3 for r in swept)
    curves = {r.stage: r.config["capacity"]["curve"] for r in swept if "capacity" in r.config}
    assert set(curves) == {s.name for s in RUN}  # every stage's sweep (a bounded twin only has its service time)
    assert all([p["concurrency"] for p in c] in ([1], [1, 2]) for c in curves.values())
    theirs = [r for r in quick_lab.records if r.tool == "perf_analyzer" and r.load.mode != "open"]
    assert theirs and all("--measurement-interval" in r.target["command"] for r in theirs)  # open loops: count windows


def test_quick_lab_says_where_each_stage_ran(quick_lab):
    """Where each stage ran, as its server reported it, in every record of ours and in the report."""
    ours = [r for r in quick_lab.records if r.tool == "servelab"]
    assert {r.config["device"] for r in ours} == {"cpu"}
    runs_on = {r.stage: r.config["runs_on"] for r in ours}
    assert runs_on["fastapi-onnx"] == "onnxruntime CPUExecutionProvider" and runs_on["fastapi-pt"] == "torch cpu float32"
    assert runs_on["pt-2x2"] == "triton python: 4x KIND_CPU; instances say: 4x PyTorch on cpu"
    assert runs_on["onnx-2"] == "triton python: 4x KIND_CPU; instances say: 4x CPUExecutionProvider on cpu"
    assert runs_on["ensemble"] == "triton ensemble: no instance group"
    report = quick_lab.text("report.md")
    assert "## Hardware and versions" in report and f"| pt-2x2 | {runs_on['pt-2x2']} |" in report


def test_quick_lab_records_make_the_gpu_record(quick_lab):
    _check_gpu_record(quick_lab.records, quick_lab.model_dir)


def _check_gpu_record(records, model_dir):
    """The GPU record (`servelab gpu-check`), written from this real lab's records."""
    ceiling = measure_ceiling(model_dir, batches=(1, 8), repeats=1, max_seconds=0.1, log=lambda *_: None)
    md = record_markdown(records, stack(), None, "`servelab lab --quick`", "today", {"ray": "not installed here"},
                         ceiling)
    stage_table = md.split("## The model's own ceiling")[0]  # the later tables have rows per stage too
    rows = {line.split(" | ")[0].strip("| "): line for line in stage_table.splitlines() if line.startswith("| ")}
    assert {s.name for s in RUN} <= set(rows)
    assert "| concurrency 2 |" in md and "no NVML samples" in rows["pt-1"]
    assert rows["pt-1"].split(" | ")[4] != "-" and rows["onnx-1"].split(" | ")[4] == "-"  # -b 16 where it batches
    # Capacity ÷ capacity: each stage at the top of its own sweep (the quick plan's: one at a time, then 2 senders).
    top = {s: capacity(records, s) for s in ("onnx-1", "onnx-2")}
    ratio = top["onnx-2"].stats.throughput_rps / top["onnx-1"].stats.throughput_rps
    assert f"| two instances per GPU ÷ one instance | onnx-2 ÷ onnx-1, capacity {where(top['onnx-2'], top['onnx-1'])} " \
           f"| {ratio:.2f} |" in md
    assert "pt-dyn ÷ pt-1, capacity " in md and "## GPU tests (`pytest -m gpu`)" in md
    assert "## Skipped before the run\n\n- **ray**: not installed here\n" in md
    # The ceiling measured on this CPU, and the stages against it: aims shown, never judged on a CPU.
    # What Triton ran, read back after each load: onnx-1 with no batcher (auto-complete would have added one).
    ran = md.split("## What Triton ran")[1]
    assert "| onnx-1 | food_classifier_onnx | max_batch_size 16; scheduler: none; instances: 1x KIND_CPU;" in ran
    assert "| onnx-dyn | food_classifier_onnx | max_batch_size 16; scheduler: dynamic_batching { preferred_batch_size: " \
           "[4, 6, 8] max_queue_delay_microseconds: 100 };" in ran
    assert "## The model's own ceiling" in md and "CPU figures" in md
    assert "## Every stage, ratio and aim against the ceiling" in md and "information only" in md and "| met |" not in md


def test_what_cannot_run_here_is_skipped_before_the_first_run_with_the_reason(artifacts, tmp_path):
    """perf_analyzer missing (as on the H100 machine without libb64): no run fails for it, the log and
    the report say once why its runs are skipped; Ray installed here, so its stages are not skipped."""
    assert preflight([s for s in STAGES if s.family == "ray"]) == {}
    # pt-1: a Triton stage with no production case of its own (no overload, cache or rollout run) to wait for.
    lab = lab_process(tmp_path, "--stages", "pt-1", env={"PERF_ANALYZER": str(tmp_path / "no-perf-analyzer")})
    output, _ = lab.communicate(timeout=300)
    assert lab.returncode == 0, output
    records = read_records(tmp_path / "records.jsonl")
    assert records and {r.tool for r in records} == {"servelab"} and not any(r.failed for r in records)
    said = [line for line in output.splitlines() if line.startswith("[perf_analyzer] skipped: ")]
    assert len(said) == 1 and "no-perf-analyzer" in said[0]
    assert output.index(said[0]) < output.index("[pt-1]")  # decided before the stage ran
    assert "## Skipped\n\n- **perf_analyzer**: perf_analyzer cannot run here" in (tmp_path / "report.md").read_text()


def test_quick_lab_measures_the_variant_stages_and_compares_them(quick_lab):
    records = [r for r in quick_lab.records if r.stage in ("fastapi-onnx-u8", "onnx-u8")]
    assert {(r.stage, r.tool) for r in records} == {
        ("fastapi-onnx-u8", "servelab"), ("onnx-u8", "servelab"), ("onnx-u8", "perf_analyzer")}
    assert all(r.stats.successes and not r.failed for r in records), [
        (r.stage, r.tool, r.load.label(), r.failed) for r in records if r.failed or not r.stats.successes]
    assert all(r.config["variant"] == "u8" for r in records if r.tool == "servelab")
    assert {r.target["input"] for r in records if r.stage == "onnx-u8"} == {"uint8"}
    assert "## Model variants" in quick_lab.text("report.md") and "| fastapi-onnx-u8 | u8 |" in quick_lab.text("report.md")


def test_quick_lab_servers_counted_what_servelab_sent(quick_lab):
    """Prometheus read each server before and after every run of servelab's client: the servers counted
    exactly what it sent, on every stage of every family (a Triton stage's first run too, after the switch
    loaded its model and Triton's own warm-up requests ran)."""
    if not _prometheus_here():
        pytest.skip("Prometheus is not installed here")
    not_ray = {s.name for s in RUN if s.family != "ray"}  # Ray's proxy counts: test_quick_lab_ray_stages_...
    ours = [r for r in quick_lab.records if r.tool == "servelab" and r.stage in not_ray
            and r.prometheus and r.prometheus.requests is not None]
    assert {r.stage for r in ours} == not_ray
    assert [(r.stage, r.load.label(), r.prometheus.requests, r.prometheus.client_requests) for r in ours
            if r.prometheus.requests != r.prometheus.client_requests] == []
    assert any("compute (ms)" in r.prometheus.series for r in ours)
    assert "## The servers' own view: Prometheus" in quick_lab.text("report-tables.md")
    assert "prometheus: " in quick_lab.output and "Prometheus not running" not in quick_lab.output


def _its_servers(pid: int) -> set[int]:
    """The model servers process ``pid`` started (its children), whatever else runs on the machine."""
    found = set()
    try:
        for child in psutil.Process(pid).children(recursive=True):
            if "servelab serve" in " ".join(child.cmdline()) or "tritonserver" in child.name():
                found.add(child.pid)
    except psutil.Error:  # a process that ended while we looked
        pass
    return found


def test_ctrl_c_stops_the_servers(artifacts, tmp_path):
    lab = lab_process(tmp_path, "--stages", "fastapi-onnx,pt-1")
    deadline = time.monotonic() + 120
    while not (started := _its_servers(lab.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert started, "the lab started no server"
    lab.send_signal(signal.SIGINT)
    output, _ = lab.communicate(timeout=90)
    assert lab.returncode != 0, output
    deadline = time.monotonic() + 30
    while any(psutil.pid_exists(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(psutil.pid_exists(pid) for pid in started)
