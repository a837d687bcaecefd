"""docs/architecture.md's "Adding things: A stage", followed to the letter in a copy of the checkout: one `Stage`
in `CATALOGUE`, its pair in `PAIRS` of the catalogue's test, then `make notebooks`; then the tests that read the catalogue pass with the new stage in them (the lease plan
times a notebook from its recorded cells, so a stage needs no rate of its own). A step the doc forgets fails here."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from servelab.core.paths import REPO_ROOT

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
