"""``servelab lab`` run as a user runs it, for the e2e tests (tests/e2e/conftest.py's ``quick_lab``, test_lab.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

from servelab.measure.records import Record, read_records

REPO = Path(__file__).resolve().parents[1]
LAB_TIMEOUT_S = 900  # every stage, the Ray Serve cluster's too, and Prometheus read-back (~1 s per run)


def servers_of_this_checkout() -> set[int]:
    """PIDs of model servers started from this checkout (the lab's run here; other checkouts' test
    runs on the same machine have servers of their own)."""
    found = set()
    for p in psutil.process_iter(["cmdline", "cwd"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.info["cwd"] == str(REPO) and ("tritonserver" in cmd or "servelab serve" in cmd or "raylet" in cmd
                                           or "gcs_server" in cmd or "ray start" in cmd or "ray::" in cmd):
            found.add(p.pid)
    return found


def _as_typed_in_a_terminal() -> None:
    # A shell starts a background job (CI's runner, `make test &`) with SIGINT ignored, and a Python
    # started so never raises KeyboardInterrupt: the lab would run to its end. Typed in a terminal,
    # it starts with the default, as here.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def lab_process(out: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``servelab lab --quick --out OUT ARGS`` from the checkout, its output captured."""
    return subprocess.Popen([sys.executable, "-m", "servelab", "lab", "--quick", "--out", str(out), *args],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})}, preexec_fn=_as_typed_in_a_terminal)


@dataclass(frozen=True)
class FinishedLab:
    """One finished lab run: its folder, exit status, printout, and this checkout's servers around it."""

    out: Path
    returncode: int
    output: str
    servers_before: set[int]
    servers_after: set[int]

    @property
    def records(self) -> list[Record]:
        assert self.returncode == 0, self.output  # a failed run fails every test that reads it, with its output
        return read_records(self.out / "records.jsonl")

    def text(self, name: str) -> str:
        assert self.returncode == 0, self.output
        return (self.out / name).read_text()
