"""`make test` leaves the user's models/, models_staging/ and results/ alone.

Each test here runs a test session (this suite's own conftest) in a copy of the checkout whose
models/ and models_staging/ hold a user's lab model: the session builds the stand-in into its own
folders, and a session that writes into the checkout anyway fails. The inner session asks for ``model``
(the stand-in, seconds), not ``artifacts`` (its variants too: a minute or more on a busy machine): both are
built into the folders ``own_folders`` chose, and it is those folders that are checked here.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from servelab.core.paths import REPO_ROOT
from triton_repo import copy_sources

# What a session of conftest.py needs; the copy's REPO_ROOT is the copy (servelab is found there first).
NEEDED = ("pyproject.toml", "servelab", "tests/conftest.py", "tests/checkout_guard.py", "tests/triton_repo.py",
          "tests/tier_durations.py", "tests/lab_process.py")
USER_FILES = {  # a model built with `servelab models build --source lab`, and a lab run's records
    "models/food11.json": '{"name": "food11-mobilenet_v2", "stand_in": false}\n',
    "models/food11.pt": "the lab's weights\n",
    "models/food11.onnx": "the lab's ONNX model\n",
    "models_staging/food_classifier/1/food11.json": '{"name": "food11-mobilenet_v2", "stand_in": false}\n',
    "models_staging/food_classifier/1/food11.pt": "the lab's weights\n",
    "models_staging/food_classifier_onnx/1/model.onnx": "the lab's ONNX model\n",
    "results/records.jsonl": "{}\n",
}


def user_checkout(dest: Path) -> Path:
    for name in NEEDED:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    copy_sources(dest / "models_staging")
    for name, text in USER_FILES.items():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_text(text)
    return dest


def run_session(checkout: Path, test: str, basetemp: Path) -> subprocess.CompletedProcess:
    (checkout / "tests" / "test_inner.py").write_text(test)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", f"--basetemp={basetemp}", "tests/test_inner.py"],
                          cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)},
                          capture_output=True, text=True, timeout=300)


BUILDS_THE_MODEL = """
from pathlib import Path

from servelab.core.artifacts import load_manifest
from servelab.core.paths import REPO_ROOT


def test_the_stand_in_is_built_into_the_sessions_own_folders(model):
    assert REPO_ROOT == Path.cwd()  # the copy's servelab, not the real checkout's
    assert load_manifest(model.manifest).stand_in
    assert not model.manifest.is_relative_to(REPO_ROOT)
"""

WRITES_RESULTS = """
from servelab.core.paths import REPO_ROOT


def test_overwrites_the_users_records():
    (REPO_ROOT / "results" / "records.jsonl").write_text("overwritten\\n")
"""


def test_a_session_builds_the_stand_in_without_touching_the_users_model(tmp_path):
    checkout = user_checkout(tmp_path / "checkout")
    before = {name: (checkout / name).stat().st_mtime_ns for name in USER_FILES}
    done = run_session(checkout, BUILDS_THE_MODEL, tmp_path / "basetemp")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    for name, text in USER_FILES.items():
        assert (checkout / name).read_text() == text, name
        assert (checkout / name).stat().st_mtime_ns == before[name], name
    assert not (checkout / "models_staging" / "food_classifier" / "configs").exists()


def test_a_session_that_writes_into_the_checkout_fails(tmp_path):
    checkout = user_checkout(tmp_path / "checkout")
    done = run_session(checkout, WRITES_RESULTS, tmp_path / "basetemp")
    assert done.returncode != 0
    assert "1 passed, 1 error" in done.stdout
    assert "the tests changed the checkout's own folders:\nE         changed results/records.jsonl\n" in done.stdout
