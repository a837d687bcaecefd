"""The block of docs/testing.md that says how long each tier took: written by the run, never by hand.

Registered by tests/conftest.py. At the end of a session that ran the **whole** suite (all three tiers
collected, nothing selected away: no ``-k``, ``-m``, ``--deselect``, ``--lf``, no file or test named, every
collected test reported, not stopped by ``-x`` or Ctrl-C) it rewrites the text between the two markers in
docs/testing.md with, per tier: the tests collected, passed, failed, skipped and the seconds they took (the
sum of their setup, call and teardown), and under the table the machine (CPUs, load), the date, how many
test processes ran side by side (pytest-xdist's workers, ``make test TEST_WORKERS=N``) and how long the session took. Under
pytest-xdist the controller writes it: it sees every test's report, and its workers each see only theirs. Any
other run (``make check``, one tier, one file) leaves the file alone. The file is replaced atomically (a
temporary file in the same folder, then ``os.replace``): an interrupted write never leaves half a table.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import pytest

DOC = Path("docs") / "testing.md"  # under the session's rootdir
BEGIN = "<!-- durations: written by the last run of the whole suite (tests/tier_durations.py) -->"
END = "<!-- durations: end -->"
TIERS = ("tests/unit", "tests/integration", "tests/e2e")
HEADER = ("| Tier | Collected | Passed | Failed | Skipped | Seconds |\n"
          "|---|---:|---:|---:|---:|---:|")
NOT_YET = "No run of the whole suite has written this table yet."


@dataclass
class Tier:
    collected: int = 0
    outcomes: dict[str, str] = field(default_factory=dict)  # nodeid -> passed, failed or skipped
    seconds: float = 0.0

    def count(self, outcome: str) -> int:
        return list(self.outcomes.values()).count(outcome)


@dataclass
class Run:
    """What a whole run measured: its tiers, when and where."""

    tiers: dict[str, Tier]
    day: str
    cpus: int
    load: float
    wall_s: float
    workers: int = 1  # test processes side by side (pytest-xdist's workers; 1 without)
    commit: str = ""  # the checkout's commit, "" where git cannot say


def tier_of(nodeid: str) -> str:
    """``tests/unit/test_x.py::test_y`` -> ``tests/unit``; a file directly under tests/ is its own tier."""
    parts = nodeid.split("::")[0].split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else "/".join(parts)


def _commit(root: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def block(run: Run | None) -> str:
    """The generated Markdown: the table of the tiers (the three first, in order) and the line under it."""
    if run is None:
        return NOT_YET
    rows = [HEADER]
    for name in [*TIERS, *sorted(set(run.tiers) - set(TIERS))]:
        t = run.tiers[name]
        rows.append(f"| `{name}` | {t.collected} | {t.count('passed')} | {t.count('failed')} | "
                    f"{t.count('skipped')} | {t.seconds:.0f} |")
    total = sum(t.seconds for t in run.tiers.values())
    side_by_side = ("" if run.workers == 1 else
                    ", more than the session: its tests ran side by side")
    rows.append("")
    at = f" at commit {run.commit}" if run.commit else ""
    rows.append(f"Recorded {run.day}{at} on {run.cpus} CPUs (1-minute load {run.load:.1f} at the end), "
                f"{run.workers} test process{'es' if run.workers > 1 else ''}: the whole session took "
                f"{run.wall_s:.0f} s ({run.wall_s / 60:.1f} min) with start-up and collection; the tests' own "
                f"seconds add up to {total:.0f} s{side_by_side}.")
    return "\n".join(rows)


def between_markers(doc: str) -> str:
    """The generated text of ``doc``: what lies between the two markers."""
    return doc.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def with_block(doc: str, text: str) -> str:
    """``doc`` with the text between the markers replaced by ``text``."""
    if doc.count(BEGIN) != 1 or doc.count(END) != 1:
        raise ValueError(f"expected one {BEGIN!r} and one {END!r}")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{text}\n{END}{tail}"


def write_block(path: Path, run: Run | None) -> None:
    """Rewrite the block in ``path`` atomically: a temporary file beside it, then one rename."""
    text = with_block(path.read_text(), block(run))
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, path.stat().st_mode & 0o777)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def whole_suite(config: pytest.Config, tiers: dict[str, Tier]) -> bool:
    """True when this run was asked for every test of every tier and reported every one."""
    option = config.option
    if (option.keyword or option.markexpr or getattr(option, "deselect", None) or getattr(option, "lf", False)
            or getattr(option, "failedfirst", False) or option.setupplan or option.setuponly or option.collectonly):
        return False
    if not all(tiers.get(name) and tiers[name].collected for name in TIERS):
        return False
    root = config.rootpath
    asked = [(config.invocation_params.dir / arg).resolve() for arg in config.args]
    if any("::" in arg for arg in config.args):
        return False
    # Every tier lies inside a path that was asked for (``pytest``, ``pytest tests``), not a file of it.
    if not all(any((root / name).is_relative_to(path) for path in asked) for name in TIERS):
        return False
    return all(len(t.outcomes) == t.collected for t in tiers.values())


class Recorder:
    """The pytest plugin: counts per tier while the session runs, writes the block when it ends."""

    def __init__(self) -> None:
        self.tiers: dict[str, Tier] = {}
        self.started = time.monotonic()
        self.workers: set[str] = set()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self._collected([item.nodeid for item in session.items])

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids: list[str]) -> None:
        """pytest-xdist's controller: every worker collects the same tests (xdist checks), so the first counts."""
        if not self.workers:
            self._collected(ids)
        self.workers.add(node.gateway.id)

    def _collected(self, nodeids: list[str]) -> None:
        for nodeid in nodeids:
            self.tiers.setdefault(tier_of(nodeid), Tier()).collected += 1

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        tier = self.tiers.setdefault(tier_of(report.nodeid), Tier())
        tier.seconds += report.duration
        if report.when == "call" or report.outcome != "passed":  # a skip or an error in setup is the test's outcome
            if tier.outcomes.get(report.nodeid) != "failed":
                tier.outcomes[report.nodeid] = report.outcome

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if (hasattr(session.config, "workerinput")  # an xdist worker: it ran a part; the controller writes
                or exitstatus == pytest.ExitCode.INTERRUPTED or session.shouldstop
                or not whole_suite(session.config, self.tiers)):
            return
        doc = session.config.rootpath / DOC
        if not doc.exists():
            return
        run = Run(self.tiers, date.today().isoformat(), os.cpu_count() or 0, os.getloadavg()[0],
                  time.monotonic() - self.started, max(1, len(self.workers)), _commit(session.config.rootpath))
        write_block(doc, run)
        session.config.get_terminal_writer().line(f"\n{DOC}: the tiers' counts and durations written")
