"""Execute a lab notebook the way a student would, in a fresh kernel of this interpreter.

The notebook is rendered from its Markdown source (the committed .ipynb is checked to be the same
elsewhere). Tests can give values to the names assigned in cells tagged ``parameters`` (a cell
with the new values goes right after the cell that assigns them, as papermill does), and put
cells before and after the notebook's own: a prologue that installs doubles, an epilogue that
asserts what the notebook did. A cell students write (one that starts with ``# YOUR CODE: <name>``) runs as
the answer docs/instructors.md gives for it (a ```python block that starts with the same line), so that
what the notebook asks them to write is executed against the same servers.

With ``SERVELAB_RECORD_CELL_TIMES=1`` a run writes the seconds each of the notebook's own code cells took
(nbclient's timestamps) into docs/records/notebook-cell-times.json, which servelab/tools/lease_plan.py scales to
the lab node; by default the committed record is left as it is (a run of the suite must not change what the
plan in the notebooks says, nor two test processes overwrite each other's entries).
"""

from __future__ import annotations

import ast
import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any

import nbformat
from ipykernel.kernelspec import write_kernel_spec
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from servelab.core.artifacts import write_atomic
from servelab.core.paths import recorded_at
from servelab.core.variants.build import machine
from servelab.tools.lease_plan import CELL_TIMES, YOUR_CODE, answers  # one reader of docs/instructors.md's answers
from servelab.tools.render_notebooks import NOTEBOOK_DIR, to_notebook

TESTS_DIR = Path(__file__).resolve().parent
KERNEL_NAME = "python3"

# The perf_analyzer lines students type in the Triton notebooks (docs/instructors.md's answers) as a quick test runs
# them: 1 s windows, no stability search and, at onnx-1 and onnx-dyn, the quick rates (RATES = [20, 40]).
# 6's lines carry the step's stability settings after the window (issue 52): the quick ones replace them there; 7 and
# 8's carry the helper's, which would win over flags added before them (7's Poisson lines: 5 trials, issue #66).
_STABLE = {"--measurement-interval 5000": "--measurement-interval 1000",
           "--stability-percentage 10 --max-trials 10": "--stability-percentage 1000 --max-trials 3"}
TRITON_QUICK_EDITS = {
    "6_triton_python": {"--measurement-interval 5000 --stability-percentage 10 --max-trials 5":
                        "--measurement-interval 1000 --stability-percentage 1000 --max-trials 3"},
    "7_triton_onnx": {**_STABLE, "--stability-percentage 10 --max-trials 5": "--stability-percentage 1000 --max-trials 3",
                      "--request-rate-range 40:120:80": "--request-rate-range 20:40:20"},
    "8_triton_more": _STABLE}


def perf_analyzer_on_path() -> str:
    """A prologue that puts the project's perf_analyzer on the kernel's PATH for the `!perf_analyzer` lines, as the
    node's Jupyter image has it."""
    from servelab.core.installers.perf_analyzer_install import locate

    pa = locate()
    return (f"import os\nos.environ['PATH'] = {str(pa.path.parent)!r} + os.pathsep + os.environ['PATH']\n"
            f"os.environ['LD_LIBRARY_PATH'] = {pa.env().get('LD_LIBRARY_PATH', '')!r}")


def parameter_names(cell: nbformat.NotebookNode) -> list[str]:
    """The names a ``parameters`` cell assigns, in order."""
    names = []
    for statement in ast.parse(cell.source).body:
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        names += [target.id for target in targets]
    return names


def parameters_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [cell for cell in nb.cells if "parameters" in cell.metadata.get("tags", [])]


def kernel_manager(directory: Path) -> KernelManager:
    """A kernel manager whose ``python3`` is this interpreter, whatever else is installed.

    Writes a spec for ``sys.executable`` into ``directory`` and looks nowhere else, so a
    user's or the system's own ``python3`` kernel (maybe another Python) is never picked.
    """
    spec_dir = directory / "kernels" / KERNEL_NAME
    if not spec_dir.exists():
        write_kernel_spec(spec_dir, overrides={"env": {"IPYTHONDIR": str(directory / "ipython")}})
    specs = KernelSpecManager(kernel_dirs=[str(spec_dir.parent)], ensure_native_kernel=False)
    return KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=specs)


def students_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [cell for cell in nb.cells if cell.cell_type == "code" and YOUR_CODE.match(cell.source)]


def _code_cell(source: str, tag: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(source, metadata={"tags": [tag]})


def prepare(stem: str, *, parameters: dict[str, Any] | None = None, prologue: str = "", epilogue: str = "",
            answer_edits: dict[str, str] | None = None) -> nbformat.NotebookNode:
    """``notebooks/<stem>.md`` as a test runs it: the parameters given, each student's cell as its answer, the
    prologue first and the epilogue last. A notebook's own cells stay the same objects (tests/rehearsal.py
    finds them by identity).

    ``answer_edits``: text replaced in the answers run for the cells students write (e.g. perf_analyzer's
    5 s windows made shorter for a quick test), each of which must occur in some answer the notebook runs."""
    nb = to_notebook(NOTEBOOK_DIR / f"{stem}.md")
    pending = dict(parameters or {})
    for cell in parameters_cells(nb):
        given = {name: pending.pop(name) for name in parameter_names(cell) if name in pending}
        if given:
            source = "\n".join(f"{name} = {value!r}" for name, value in given.items())
            nb.cells.insert(nb.cells.index(cell) + 1, _code_cell(source, "injected-parameters"))
    if pending:
        raise KeyError(f"{stem} has no parameters cell for {sorted(pending)}")
    given_answers = answers()
    unused = dict(answer_edits or {})
    for cell in students_cells(nb):
        cell.source = given_answers[YOUR_CODE.match(cell.source)[1]]
        for old, new in (answer_edits or {}).items():
            if old in cell.source:
                cell.source = cell.source.replace(old, new)
                unused.pop(old, None)
        cell.metadata.setdefault("tags", []).append("injected-answer")
    if unused:
        raise KeyError(f"{stem}: no answer holds {sorted(unused)}")
    if prologue:
        nb.cells.insert(0, _code_cell(prologue, "injected-prologue"))
    if epilogue:
        nb.cells.append(_code_cell(epilogue, "injected-epilogue"))
    return nb


def injected(cell: nbformat.NotebookNode) -> bool:
    """Put in by ``prepare`` (not an answer, which stands in a cell of the notebook's own)."""
    return bool({"injected-parameters", "injected-prologue", "injected-epilogue"} & set(cell.metadata.get("tags", [])))


def client(nb: nbformat.NotebookNode, kernel_dir: Path, workdir: Path, timeout: int) -> NotebookClient:
    return NotebookClient(nb, km=kernel_manager(kernel_dir), timeout=timeout, startup_timeout=60,
                          resources={"metadata": {"path": str(workdir)}})


def execute(stem: str, kernel_dir: Path, workdir: Path, *, parameters: dict[str, Any] | None = None,
            prologue: str = "", epilogue: str = "", timeout: int = 60,
            answer_edits: dict[str, str] | None = None) -> nbformat.NotebookNode:
    """Run ``notebooks/<stem>.md`` top to bottom in ``workdir`` (``prepare``); raise on the first failing cell."""
    nb = prepare(stem, parameters=parameters, prologue=prologue, epilogue=epilogue, answer_edits=answer_edits)
    own = [cell for cell in nb.cells if cell.cell_type == "code" and not injected(cell)]
    client(nb, kernel_dir, workdir, timeout).execute()
    if os.environ.get("SERVELAB_RECORD_CELL_TIMES") == "1":
        record_cell_times(stem, own, parameters or {})
    return nb


def _seconds(cell: nbformat.NotebookNode) -> float:
    timing = cell.metadata.get("execution")  # nbclient's record_timing
    if not timing:
        return 0.0  # a cell the run left out (tests/rehearsal.py's ``play``), as a cell that skips its step
    start, end = (datetime.fromisoformat(timing[key].replace("Z", "+00:00"))
                  for key in ("iopub.execute_input", "shell.execute_reply"))
    return round((end - start).total_seconds(), 3)


def record_cell_times(stem: str, own: list[nbformat.NotebookNode], parameters: dict[str, Any]) -> None:
    """Keep this run's seconds per code cell of the notebook (by index and first line, an answer run in place of a
    student's cell under the cell's own first line), the machine, the commit and the parameters the run gave."""
    commit = recorded_at(CELL_TIMES)
    record = json.loads(CELL_TIMES.read_text(encoding="utf-8")) if CELL_TIMES.exists() else {}
    record[stem] = {
        "machine": machine(), "commit": commit,
        "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0],
        "parameters": sorted(parameters),
        "cells": [{"index": i, "first_line": cell.source.partition("\n")[0], "seconds": _seconds(cell)}
                  for i, cell in enumerate(own)],
    }
    write_atomic(CELL_TIMES, lambda tmp: tmp.write_text(json.dumps(dict(sorted(record.items())), indent=1) + "\n",
                                                        encoding="utf-8"))
