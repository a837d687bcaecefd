"""``servelab lab`` run as a user runs it, for the e2e tests (tests/e2e/conftest.py's ``quick_lab``, test_lab.py)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import psutil
import pytest

from servelab.core.artifacts import copy_atomic, load_manifest, write_atomic
from servelab.core.variants.build import RECORD_FILE, VARIANTS
from servelab.measure.records import Record, read_records
from triton_repo import copy_sources

REPO = Path(__file__).resolve().parents[1]
LAB_TIMEOUT_S = 1800  # every stage, Ray Serve's cluster too, Prometheus read-back (~1 s per run), each lesson's round (issue 65), beside other tests: 20 min was not enough in CI once the rounds came
MARK = "SERVELAB_TEST_LAB"  # set in a lab's environment, inherited by every process it starts
VARIANTS_WAIT_S = 300  # how long the session's own variants wait for the quick lab's before building them
READERS = "tests/e2e/test_lab.py"  # the one file whose tests read the quick lab (``quick_lab``)
FOLDER = "servelab_quick_lab"  # pytest-xdist's workerinput key: the quick lab's folder


def processes_marked(mark: str) -> set[int]:
    """PIDs of the processes that carry ``mark`` in their environment: a lab's and everything it started
    (servers, Ray's daemons and workers, Prometheus, perf_analyzer), whatever other tests run beside it."""
    found = set()
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARK) == mark:
                found.add(p.pid)
        except psutil.Error:  # ended while we looked, or a zombie
            pass
    return found


def _as_typed_in_a_terminal() -> None:
    # A shell starts a background job (CI's runner, `make test &`) with SIGINT ignored, and a Python
    # started so never raises KeyboardInterrupt: the lab would run to its end. Typed in a terminal,
    # it starts with the default, as here.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def lab_process(out: Path, *args: str, env: dict[str, str] | None = None, output: IO | int = subprocess.PIPE
                ) -> subprocess.Popen:
    """``servelab lab --quick --out OUT ARGS`` from the checkout, its output captured (or written to ``output``)."""
    return subprocess.Popen([sys.executable, "-m", "servelab", "lab", "--quick", "--out", str(out), *args],
                            cwd=REPO, stdout=output, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})}, preexec_fn=_as_typed_in_a_terminal)


class LabFolder:
    """The session's quick lab as any process of the session reads it (pytest-xdist's workers too): its
    folder, where the process that started it writes ``mark`` first and ``exit`` (its exit status, or
    ``timeout``) when it has ended."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def started(self) -> bool:
        return (self.root / "mark").exists()

    def ended(self) -> str | None:
        return (self.root / "exit").read_text() if (self.root / "exit").exists() else None

    def share_variants(self, model_dir: Path) -> bool:
        """Copy the lab's model variants into ``model_dir`` once it has built them (its first step), where the lab
        built them from the same model file; whether it did. The variants' build key then matches, so
        ``build_variants`` reuses them instead of quantizing the same model again beside the lab."""
        built, deadline = self.root / "models", time.monotonic() + VARIANTS_WAIT_S
        while not (built / RECORD_FILE).exists():  # written last, whole (after every variant file)
            if self.ended() is not None or time.monotonic() > deadline:
                return False
            time.sleep(1)
        ours, its = load_manifest(Path(model_dir) / "food11.json"), load_manifest(built / "food11.json")
        if ours.onnx_sha256 != its.onnx_sha256:
            return False
        for name in [*(VARIANTS[v] for v in VARIANTS if v != "fp32"), RECORD_FILE]:
            copy_atomic(built / name, Path(model_dir) / name)
        return True

    def finish(self) -> FinishedLab:
        """Wait for the lab to end (its starter interrupts it LAB_TIMEOUT_S after its start) and read it."""
        while (status := self.ended()) is None:
            time.sleep(1)
        output = (self.root / "output.txt").read_text()
        if status == "timeout":
            raise TimeoutError(f"servelab lab --quick ran past {LAB_TIMEOUT_S} s:\n{output[-5000:]}")
        return FinishedLab(self.root / "lab", self.root / "models", self.root / "model_repository", int(status),
                           output, processes_marked((self.root / "mark").read_text()))


class BackgroundLab(LabFolder):
    """``servelab lab --quick`` started now and read later, while other tests run: in a folder of its own with
    its own model and model repository (the session's are built and switched by those tests), its output in a
    file (a pipe nobody reads would fill and stop it), its processes marked so the ones it leaves are found.
    A thread writes its exit status into the folder when it ends, or interrupts it at LAB_TIMEOUT_S."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        mark = secrets.token_hex(8)
        env = {"MODEL_DIR": str(root / "models"), MARK: mark,
               "TRITON_MODEL_REPOSITORY": str(copy_sources(root / "model_repository"))}
        with open(root / "output.txt", "w") as output:
            self.process = lab_process(root / "lab", env=env, output=output)
        write_atomic(root / "mark", lambda tmp: tmp.write_text(mark))
        threading.Thread(target=self._wait, name="quick-lab", daemon=True).start()

    def _wait(self) -> None:
        try:
            status = str(self.process.wait(timeout=LAB_TIMEOUT_S))
        except subprocess.TimeoutExpired:
            self.stop()
            status = "timeout"
        write_atomic(self.root / "exit", lambda tmp: tmp.write_text(status))

    def stop(self) -> None:
        """Interrupt it if it still runs (a session that ended early): the lab then stops its own servers."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class QuickLab:
    """The pytest plugin (tests/conftest.py registers it where the session is run: pytest's one process, or
    pytest-xdist's controller, never a worker) that starts the session's quick lab once, as soon as the tests
    are collected, if any of them reads it, and stops it when the session ends. xdist's workers find its
    folder in their ``workerinput``; the controller sees no fixtures, only test ids: READERS names the file."""

    def __init__(self) -> None:
        self.folder = LabFolder(Path(tempfile.mkdtemp(prefix="servelab-quick-lab-")))
        self.lab: BackgroundLab | None = None

    def start(self) -> None:
        if self.lab is None:
            self.lab = BackgroundLab(self.folder.root)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if any("quick_lab" in getattr(item, "fixturenames", ()) for item in session.items):
            self.start()

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        node.workerinput[FOLDER] = str(self.folder.root)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids: list[str]) -> None:
        if any(nodeid.startswith(f"{READERS}::") for nodeid in ids):
            self.start()

    def pytest_sessionfinish(self) -> None:
        if self.lab:
            self.lab.stop()
        shutil.rmtree(self.folder.root, ignore_errors=True)


def quick_lab_folder(config: pytest.Config) -> LabFolder | None:
    """The session's quick lab, where one was started: from the plugin here, or from a worker's workerinput."""
    if hasattr(config, "workerinput"):
        folder = LabFolder(Path(config.workerinput[FOLDER]))
    else:
        folder = config.pluginmanager.get_plugin("servelab-quick-lab").folder
    return folder if folder.started else None


@dataclass(frozen=True)
class FinishedLab:
    """One finished lab run: its folder, its model and model repository, exit status, printout, and what it
    left running."""

    out: Path
    model_dir: Path
    repository: Path
    returncode: int
    output: str
    left_running: set[int]  # PIDs of processes it started that outlived it

    @property
    def records(self) -> list[Record]:
        assert self.returncode == 0, self.output  # a failed run fails every test that reads it, with its output
        return read_records(self.out / "records.jsonl")

    def text(self, name: str) -> str:
        assert self.returncode == 0, self.output
        return (self.out / name).read_text()
