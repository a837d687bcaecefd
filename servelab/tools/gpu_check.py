"""``servelab gpu-check`` (``make gpu-check``): prove the GPU paths on the machine at hand, and record it.

On a machine where ``nvidia-smi`` lists a GPU it runs the GPU tests (``pytest -m gpu``), a short lab on the
GPU (``servelab lab --plan gpu-check --device gpu``: each GPU lesson once), FastAPI's two designs and the
model's own ceiling (ONNX Runtime alone, fp32 and fp16), and writes ``docs/gpu/<gpu-name>.md``. What cannot
run here (perf_analyzer, Ray, Prometheus) is named before the run starts and skipped. Where there is no GPU
it says so and exits 0: there is nothing to check.

It fits a lent GPU machine's minutes: by default the whole check has ``DEFAULT_BUDGET_S``; ``--stages`` and
``--full`` choose more, with no limit unless ``--budget`` sets one. Whatever the budget cuts is named in the
record as not run, never counted as passed. The record is built from the lab's own records
(``record_markdown``), so it can be checked on a CPU lab's records too.
"""

import datetime as dt
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servelab.core.catalogue import SERVICES
from servelab.core.hardware import NO_GPU, describe, gpu_count, stack, stage_env
from servelab.core.installers.prometheus_install import PrometheusNotFound, locate
from servelab.core.paths import DEFAULT_IMAGE, REPO_ROOT, checkout
from servelab.core.procs import ServerProcess, free_port, log_tail
from servelab.core.settings import get_settings
from servelab.core.tables import markdown, num
from servelab.measure.ceiling import BATCHES, Ceiling, ceiling_markdown, measure_ceiling
from servelab.measure.fractions import closed_run, fractions_markdown, ratios
from servelab.measure.loadgen import Labels, run_bench
from servelab.measure.records import Load, Record, read_records
from servelab.measure.targets import FastAPITarget
from servelab.report import TEMPLATES
from servelab.report.render import triton_config_table
from servelab.run.lab import preflight
from servelab.run.lab_run import RUN_FILE, LabRun
from servelab.run.plan import LAB_STAGES
from servelab.run.side_by_side import stage_inputs
from servelab.servers.fastapi.child import fastapi_process

DOCS = REPO_ROOT / "docs" / "gpu"
GPU_TESTS = "tests/integration/test_gpu.py"
# The default check's seconds, install not included: with `make gpu-check`'s offline install it should end
# within 6 minutes on a machine with one GPU and 16 cores. On an H200 with 16 cores on 2026-11-28 it took 320 s,
# install included, the check itself 271 s (docs/records/gpu-h200-2026-11-28.toml).
DEFAULT_BUDGET_S = 285.0
CEILING_S = 45.0  # kept back for the ceiling at the end of the budget
# fastapi-onnx as the H200 ran it (the lab's default on a GPU: stage_env) and the design built for a GPU that no GPU
# has run yet; the check serves it both ways in turn, at saturation, and its record says which served more.
DESIGNS = {"one server process with its model (as on the H200)": {"WORKERS": "1"},
           "server processes in front of one batcher process": {"WORKERS": "auto", "SHARED_BATCHER": "1"}}
DESIGN_SENDERS, DESIGN_WINDOW_S = 64, 10.0
DESIGN_SERVICE = next(name for name, runtime in SERVICES.items() if runtime == "onnx")
DESIGNS_S = 90.0  # kept back for them: two starts, warm-ups and windows
FIT_BATCHES = (1, 16, 64, 128)  # the ceiling's batch sizes in a budgeted check (the full check: 1 to 128)


@dataclass
class PytestOutcome:
    """What ``pytest -m gpu`` reported (its JUnit XML): each test's result, and their counts."""

    results: list[tuple[str, str, str]] = field(default_factory=list)  # (test, "pass" | "FAIL" | "skip", message)
    passed = property(lambda self: sum(r[1] == "pass" for r in self.results))
    failed = property(lambda self: sum(r[1] == "FAIL" for r in self.results))
    skipped = property(lambda self: sum(r[1] == "skip" for r in self.results))

    @classmethod
    def from_junit(cls, path: Path) -> "PytestOutcome":
        results = []
        for case in ET.parse(path).getroot().iter("testcase"):
            name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
            said = {e.tag: e.get("message") or "" for e in reversed(case) if e.tag in ("failure", "error", "skipped")}
            bad = said.get("failure", said.get("error"))
            results.append((name, "FAIL", bad.partition("\n")[0][:200]) if bad is not None else
                           (name, "skip", said["skipped"][:200]) if "skipped" in said else (name, "pass", ""))
        return cls(results)


def slug(name: str) -> str:
    """A file name for a GPU: "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def _cell(r: Record | None, images: bool = False) -> str:
    if r is None:
        return "-"
    return f"{num(r.stats.items_per_s if images else r.stats.throughput_rps)} / {num(r.stats.latency.p50_ms)}"


def stage_table(records: list[Record]) -> str:
    ours = [r for r in records if r.tool == "servelab"]
    # The lab's closed-loop levels, not those of a run made for another purpose (a rollout's 16 senders).
    levels = sorted({r.load.concurrency for r in ours if r.load.mode == "closed" and not r.config.get("run")})
    head = ["stage", "runs on", "sequential", *(f"concurrency {c}" for c in levels), "-b 16 (img/s / ms)",
            "GPU util mean / memory peak"]
    rows = []
    for stage in dict.fromkeys(r.stage for r in ours):
        runs = [r for r in ours if r.stage == stage]
        # NVML's mean utilization and peak memory over the stage's runs.
        util = [v for r in runs if r.monitors for g in r.monitors.gpus for v in g.util_pct]
        mem = [v for r in runs if r.monitors for g in r.monitors.gpus for v in g.mem_used_mib]
        gpu = f"{num(sum(util) / len(util), 0)} % / {num(max(mem), 0)} MiB" if util else "no NVML samples"
        rows.append([stage, runs[0].config.get("runs_on", "-"), _cell(closed_run(ours, stage, 1)),
                     *(_cell(closed_run(ours, stage, c)) for c in levels),
                     _cell(next((r for r in runs if r.batch > 1), None), images=True), gpu])
    return markdown(head, rows)


def checkout_commit(root: Path = REPO_ROOT) -> str | None:
    """The checkout's short commit, "with local changes" where tracked files differ; None without .git."""
    found = checkout(root=root)
    return found and found[0] + (" with local changes" if found[1] else "")


def compare_designs(out: Path, log=print) -> dict[str, float]:
    """req/s of ``DESIGN_SERVICE`` on the GPU in each of ``DESIGNS`` in turn, at ``DESIGN_SENDERS`` senders."""
    served = {}
    env = {**stage_env("gpu"), "MODEL_DIR": str(get_settings().model_dir)}
    for name, design in DESIGNS.items():
        port = free_port()
        with fastapi_process(DESIGN_SERVICE, port, out / f"design-{slug(name)}.log", {**env, **design}, 300):
            load = Load.closed(DESIGN_SENDERS, requests=None, duration_s=DESIGN_WINDOW_S, warmup_s=2.0)
            record = run_bench(FastAPITarget(f"http://127.0.0.1:{port}", DEFAULT_IMAGE.read_bytes()), load,
                               Labels(DESIGN_SERVICE))
        served[name] = record.stats.throughput_rps
        log(f"gpu-check: {DESIGN_SERVICE}, {name}: {served[name]:.1f} req/s, errors {record.stats.errors or 'none'}")
    return served


def record_markdown(records: list[Record], found: dict[str, Any], tests: PytestOutcome | None, lab: str,
                    when: str, skipped: dict[str, str] | None = None, ceiling: Ceiling | None = None,
                    not_run: dict[str, str] | None = None, commit: str | None = None,
                    designs: dict[str, float] | None = None, failures: list[str] | None = None) -> str:
    """The GPU record (servelab/data/gpu-record.md.j2); ``designs``: what ``compare_designs`` measured; ``failures``:
    the lab's stages that failed before a run (run.json's), a Triton config that was not the stage's among them."""
    best = max(designs, key=designs.get) if designs else ""
    ratio_rows = [(what, which, num(value, 2)) for what, which, value in ratios(records)] or [("-", "-", "-")]
    return TEMPLATES.get_template("gpu-record.md.j2").render(
        gpu=(found.get("gpus") or [NO_GPU])[0].split(": ", 1)[-1].split(",")[0], when=when, commit=commit,
        hardware=describe(found), skipped=skipped or {}, not_run=not_run or {}, tests=tests, tests_part=TESTS,
        test_table=tests and markdown(("test", "outcome", "message"), tests.results), lab=lab,
        stages=records and stage_table(records),
        failed=sorted({f"{r.stage}: {r.failed.splitlines()[0][:200]}" for r in records if r.failed}
                      | {line.splitlines()[0][:600] for line in failures or ()}),
        triton_configs=triton_config_table(records),
        ratios=markdown(("what", "stages", "ratio"), ratio_rows, "llr"), ceiling=ceiling and ceiling_markdown(ceiling),
        fractions=ceiling and fractions_markdown(records, ceiling, stage_inputs()),
        designs=designs and markdown(("design", "req/s"), [(name, num(rps, 1)) for name, rps in designs.items()], "lr"),
        senders=DESIGN_SENDERS, window_s=DESIGN_WINDOW_S, best=best,
        best_ratio=designs[best] / max(min(designs.values()), 1e-9) if designs else None)


TESTS, CEILING, DESIGNS_PART = "GPU tests", "ceiling", "FastAPI's two designs"


def run_within(cmd: list[str], timeout: float | None, log: Path) -> int | None:
    """``cmd``'s exit status (its output to ``log``), or None where it was stopped after ``timeout`` seconds, as our
    servers are stopped: its process group, then what is left of its session (a test's or a lab's servers)."""
    server = ServerProcess(cmd, None, log, cwd=REPO_ROOT)
    proc = server.start().proc
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None
    finally:
        server.stop()
        print(log_tail(log, 30))  # its verdict, on the terminal of a machine whose files may not come back


TESTS_LOG, TESTS_JUNIT = "gpu-tests.log", "gpu-tests.xml"


def run_tests(out: Path, timeout: float | None, target: str = GPU_TESTS,
              log=print) -> tuple[int | None, PytestOutcome | None]:
    """``pytest -m gpu`` on ``target`` for at most ``timeout`` seconds: its exit status (None: stopped) and outcome
    (None without a JUnit report). Its files go to ``out`` only once it has ended: the tests' session fails where
    the checkout's results/ changed while they ran (tests/conftest.py's ``own_folders``)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in (TESTS_LOG, TESTS_JUNIT):
        (out / name).unlink(missing_ok=True)  # an earlier run's, before the tests start
    with tempfile.TemporaryDirectory(prefix="servelab-gpu-tests-") as tmp:
        output, junit = Path(tmp) / TESTS_LOG, Path(tmp) / TESTS_JUNIT
        log(f"gpu-check: pytest -m gpu {target} (its output: {output} while it runs, then {out / TESTS_LOG})")
        code = run_within([sys.executable, "-m", "pytest", "-m", "gpu", target, "-rs", "-q", f"--junitxml={junit}"],
                          timeout, output)
        for path in (output, junit):
            if path.exists():
                shutil.move(path, out / path.name)
    junit = out / TESTS_JUNIT
    return code, PytestOutcome.from_junit(junit) if code is not None and junit.exists() else None


def run_lab(out: Path, full: bool, stages: str | None, budget_s: float | None,
            log=print) -> tuple[int | None, str, list[Record], dict[str, str], list[str]]:
    """The GPU lab within ``budget_s`` (None: no limit): its exit status (None: stopped), its label for the record,
    its records, the parts it did not run and the failures before a run that run.json names."""
    lab_args = ["--device", "gpu"] + (["--full"] if full else ["--quick"] if stages else ["--plan", "gpu-check"])
    lab_args += ["--stages", stages] if stages else []
    lab_args += ["--budget", f"{budget_s:.0f}"] if budget_s is not None else []
    log(f"gpu-check: servelab lab {' '.join(lab_args)} (its output: {out / 'lab.log'})")
    # The lab keeps to its budget stage by stage; the margin is for a stage that overruns its guess.
    lab_code = run_within([sys.executable, "-m", "servelab", "lab", *lab_args, "--out", str(out / "lab")],
                          None if budget_s is None else budget_s + CEILING_S, out / "lab.log")
    records_path, run_path = out / "lab" / "records.jsonl", out / "lab" / RUN_FILE
    records = read_records(records_path) if records_path.exists() else []
    not_run: dict[str, str] = {}
    failures: list[str] = []
    if lab_code is None:
        not_run["lab"] = f"stopped by the time budget ({budget_s:.0f} s for it) while a stage ran"
    elif run_path.exists():
        run = LabRun.read(run_path)
        not_run, failures = run.not_run, run.failures
    label = f"`servelab lab {' '.join(lab_args)}`, " + (f"exit {lab_code}" if lab_code is not None else "stopped")
    return lab_code, label, records, not_run, failures


def check(out: Path, docs: Path, full: bool = False, stages: str | None = None, budget_s: float | None = None,
          log=print) -> int:
    """Run the GPU tests and the GPU lab; write the record. 0 when everything that ran passed, 1 otherwise.
    ``budget_s``: the whole check's seconds (``DEFAULT_BUDGET_S`` unless ``full`` or ``stages``; 0: no limit)."""
    if gpu_count() == 0:
        log(f"gpu-check: {NO_GPU}: nothing to check on this machine")
        return 0
    if budget_s is None:
        budget_s = 0 if full or stages else DEFAULT_BUDGET_S
    started = time.monotonic()

    def left(keep: float = 0.0) -> float | None:
        return None if not budget_s else max(budget_s - (time.monotonic() - started) - keep, 0.0)

    out.mkdir(parents=True, exist_ok=True)
    skipped = preflight(list(LAB_STAGES))  # what will not run here and why, named before it starts
    try:
        locate()
    except PrometheusNotFound as exc:
        skipped["prometheus"] = f"{exc}: the lab's servers are not scraped, so no server-side series"
    for part, why in skipped.items():
        log(f"gpu-check: skips {part}: {why}")
    not_run: dict[str, str] = {}
    if budget_s:
        log(f"gpu-check: {budget_s:g} s budget for the whole check")
    code, tests = run_tests(out, left(CEILING_S), log=log)
    if code is None:
        not_run[TESTS] = f"stopped by the time budget ({budget_s:g} s) before they ended"
    lab_code, label, records, lab_not_run, failures = run_lab(out, full, stages, left(CEILING_S + DESIGNS_S), log)
    not_run.update(lab_not_run)
    designs = None
    if left(CEILING_S) == 0:
        not_run[DESIGNS_PART] = f"no time left of the budget ({budget_s:g} s)"
    else:
        log(f"gpu-check: {DESIGN_SERVICE} in each of FastAPI's two designs, at saturation")
        designs = compare_designs(out, log)
    ceiling = None
    if left() == 0:
        not_run[CEILING] = f"no time left of the budget ({budget_s:g} s)"
    else:
        log("gpu-check: the model alone at batch 1-128, fp32 and fp16 (its ceiling)")
        ceiling = measure_ceiling(get_settings().model_dir, batches=BATCHES if full or not budget_s else FIT_BATCHES,
                                  log=log)
        (out / "ceiling.json").write_text(ceiling.model_dump_json(indent=1), encoding="utf-8")
    found = stack()
    name = (found.get("gpus") or ["gpu"])[0].split(": ", 1)[-1].split(",")[0]
    docs.mkdir(parents=True, exist_ok=True)
    path = docs / f"{slug(name)}.md"
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    path.write_text(record_markdown(records, found, tests, label, when, skipped, ceiling, not_run, checkout_commit(),
                                    designs, failures), encoding="utf-8")
    ok = code == 0 and lab_code == 0 and tests is not None and tests.failed == 0
    for part, why in not_run.items():
        log(f"gpu-check: NOT RUN {part}: {why}")
    log(f"gpu-check: {'PASSED' if ok else 'FAILED'} in {time.monotonic() - started:.0f} s; record in {path}")
    return 0 if ok else 1
