"""docs/architecture.md's "Adding things": a stage, followed to the letter in a copy of the checkout: one `Stage`
in `CATALOGUE`, its pair in `PAIRS` of the catalogue's test, then `make notebooks`; then the tests that read the
catalogue pass with the new stage in them (the lease plan times a notebook from its recorded cells, so a stage needs
no rate of its own). A step the doc forgets fails here. And a family: its `Family` record in `FAMILIES` and one
`Adapter` in `ADAPTERS`, which the lab then runs, scrapes with the record's queries and reports as it does the
others."""

import os
import re
import shutil
import subprocess
import sys
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import psutil
import pytest

from servelab.core.artifacts import load_manifest
from servelab.core.catalogue import FAMILIES, Stage
from servelab.core.family import Family, Queries
from servelab.core.installers.prometheus_install import PrometheusNotFound
from servelab.core.installers.prometheus_install import locate as locate_prometheus
from servelab.core.paths import REPO_ROOT
from servelab.measure.targets import FastAPITarget
from servelab.report import server_view
from servelab.report.render import render_report
from servelab.run.families import ADAPTERS, Adapter, Runs
from servelab.run.lab import Lab, preflight
from servelab.run.plan import BATCH, Plan
from tinyserver import running
from tools import located_or_skipped

pytestmark = pytest.mark.slow

COPY = ("pyproject.toml", "README.md", "Makefile", "constraints.txt", "servelab", "tests", "notebooks", "docs",
        "docker", "models_staging", "fastapi_pt", "fastapi_onnx", "flask_app", "benchmarks")
# What the catalogue's readers check of a stage: the catalogue itself, every runner, the lease plan, the notebooks.
READERS = ["tests/unit/test_catalogue.py", "tests/unit/test_stages.py", "tests/unit/test_lease_plan.py",
           "tests/unit/test_notebooks_content.py"]
# A Ray stage of an optional lesson: a core lesson's stage would also need a measurement in its notebook's core path.
STAGE = ('    Stage("ray-3", "Ray Serve, 3 replicas", RayPart(replicas=3), lesson=Lesson.REPLICAS, '
         'baseline="ray-1"),\n')


def run(checkout: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)},
                          capture_output=True, text=True, timeout=600)


def test_a_stage_added_as_the_architecture_doc_says_reaches_every_reader(tmp_path):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in COPY:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, checkout / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, checkout / name)
    doc = (checkout / "docs" / "architecture.md").read_text()
    assert "**A stage.** One `Stage` in `CATALOGUE`" in doc and "its pair in `PAIRS`" in doc
    assert "`<!-- generated: stage-config NAME PREVIOUS -->`" in doc
    # 1. One Stage in CATALOGUE, in the notebook group that teaches it.
    catalogue = checkout / "servelab" / "core" / "catalogue.py"
    text = catalogue.read_text()
    anchor = '          lesson=Lesson.REPLICAS, baseline="ray-1"),\n'
    assert text.count(anchor) == 1  # ray-4's end, in 10_ray's group: the new stage comes after it
    catalogue.write_text(text.replace(anchor, anchor + STAGE, 1))
    # 2. Its pair in PAIRS.
    test_catalogue = checkout / "tests" / "unit" / "test_catalogue.py"
    text = test_catalogue.read_text()
    text, n = re.subn(r'"replicas": \(\("ray-2", "ray-1"\), \("ray-4", "ray-1"\)\)',
                      '"replicas": (("ray-2", "ray-1"), ("ray-4", "ray-1"), ("ray-3", "ray-1"))', text)
    assert n == 1
    test_catalogue.write_text(text)
    # 3. `make notebooks`.
    rendered = run(checkout, "-m", "servelab.tools.render_notebooks")
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr
    after = run(checkout, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'a'}", *READERS)
    assert after.returncode == 0, after.stdout[-4000:] + after.stderr[-2000:]
    # And it is where the doc says: in the lab's full plan and its lesson's pairs.
    probe = run(checkout, "-c", "from servelab.core.catalogue import Lesson, compared; from servelab.run.plan import "
                "Plan; print(('ray-3', 'ray-1') in compared(Lesson.REPLICAS), "
                "'ray-3' in [s.name for s in Plan.full().stages])")
    assert probe.stdout.split() == ["True", "True"], probe.stdout + probe.stderr


@dataclass(frozen=True)
class TinyPart:
    """A stage of the new family: tests/tinyserver.py at a service time."""

    service_ms: float


# Its record: tinyserver's /metrics counts its answers by status, which the lab's Prometheus scrapes.
TINY = Family("tiny", "Tiny", TinyPart, Queries(
    all_requests="sum(tiny_requests_total{$sel})", successes='tiny_requests_total{$sel,status="200"}',
    series={"request rate (req/s)": 'sum(rate(tiny_requests_total{$sel,status="200"}[$w]))'},
    note="tinyserver counts answers, nothing of their latency"))


class Seen(Runs):
    def __init__(self) -> None:
        self.stages: list[str] = []

    def after(self, stage: Stage, capacity: float | None) -> None:
        self.stages.append(stage.name)


class TinyAdapter(Adapter):
    """Each stage its own tinyserver process (a switch stops the last one); requests of ``BATCH`` images and both
    arrival processes besides the common loads."""

    family = TINY
    seen: ClassVar[Seen]  # the test's, given it

    def __init__(self, prometheus) -> None:
        self.prometheus = prometheus

    @classmethod
    def in_lab(cls, logs, device, prometheus, manifest) -> "TinyAdapter":
        return cls(prometheus)

    @contextmanager
    def start(self, first: Stage):
        with ExitStack() as self.serving:
            self.switch(first)
            yield self

    def switch(self, stage: Stage) -> None:
        self.serving.close()
        self.url = self.serving.enter_context(running(service_ms=stage.part.service_ms, slots=2))
        [self.pid] = [p.pid for p in psutil.Process().children() if "tinyserver.py" in " ".join(p.cmdline())]
        self.scraped = self.serving.enter_context(self.prometheus.scrape(self.url.removeprefix("http://"), TINY.name))

    def target(self, stage: Stage, image: bytes, image_name: str = "") -> FastAPITarget:
        return FastAPITarget(self.url, image, image_name=image_name)

    def runs_on(self, stage: Stage) -> tuple[str, dict]:
        return "tinyserver", {}

    async def roll_out(self, stage: Stage, variant: str) -> dict:
        raise NotImplementedError("a tinyserver has one version")

    @staticmethod
    def settings(stage: Stage) -> dict[str, str]:
        return {"SERVICE_MS": f"{stage.part.service_ms:g}"}

    @staticmethod
    def batches(stage: Stage) -> bool:
        return True

    @staticmethod
    def both_arrivals(stage: Stage) -> bool:
        return True

    def runs(self, lab, manifest) -> Seen:
        return self.seen


def test_a_family_registered_in_one_place_runs_in_the_lab(model, tmp_path, monkeypatch):
    monkeypatch.setitem(FAMILIES, TINY.name, TINY)
    monkeypatch.setitem(ADAPTERS, TINY.name, TinyAdapter)
    monkeypatch.setattr(TinyAdapter, "seen", Seen(), raising=False)
    stages = [Stage(f"tiny-{ms}ms", f"tinyserver, {ms} ms a request", TinyPart(ms)) for ms in (5, 10)]
    lines: list[str] = []
    lab = Lab(Plan.quick(), tmp_path / "lab", log=lines.append)
    lab.run(stages, load_manifest(model.manifest), model)
    assert lab.failures == [] and lab.ran == ["tiny-5ms", "tiny-10ms"], "\n".join(lines)
    assert preflight(stages) == {} and TinyAdapter.seen.stages == lab.ran
    by_stage = {s.name: [r for r in lab.records if r.stage == s.name] for s in stages}
    pids = set()
    for stage in stages:
        records = by_stage[stage.name]
        assert {r.config["SERVICE_MS"] for r in records} == {f"{stage.part.service_ms:g}"}
        assert {r.config["runs_on"] for r in records} == {"tinyserver"}
        assert all(r.stats.successes and not r.stats.error_count for r in records)
        # The family's say reached the lab: a run of batched requests, and constant arrivals beside Poisson.
        assert [r.batch for r in records if r.batch > 1] == [BATCH]
        assert {r.load.arrivals for r in records if r.load.mode == "open"} == {"constant", "poisson"}
        # Sequential at the stage's service time: the stage's own server answered.
        [one] = [r for r in records if r.load.mode == "sequential" and r.batch == 1]
        assert one.stats.latency.p50_ms >= stage.part.service_ms
        pids |= {r.monitors.server_pid for r in records}
    assert len(pids) == 2 and not any(psutil.pid_exists(pid) for pid in pids)
    # And the report writes its stages up with the others'.
    assert "tiny-10ms" in render_report(lab.records, tmp_path / "lab", sources=[lab.records_path]).read_text()
    located_or_skipped(locate_prometheus, PrometheusNotFound, "Prometheus")  # else the lab ran unscraped
    # Its record's queries ran: Prometheus scraped each stage's server, which counted what servelab sent, and the
    # report's Prometheus section has both stages.
    ours = [r for r in lab.records if r.tool == "servelab" and r.prometheus and r.prometheus.requests is not None]
    assert {r.stage for r in ours} == set(lab.ran), [r.prometheus for r in lab.records]
    assert [(r.stage, r.prometheus.requests, r.prometheus.client_requests) for r in ours
            if r.prometheus.requests != r.prometheus.client_requests] == []
    assert all("request rate (req/s)" in r.prometheus.series for r in ours)
    assert all(name in server_view.section(lab.records)["table"] for name in lab.ran)
