"""The lease plan: how long each notebook takes a student on the lab node, low, median and high.

The machine: each code cell's seconds in the e2e notebook run (``CELL_TIMES``) times one node factor, and the
waits a ```shell line starts or no cell shows. The students: the prose's words, and each task counted in the
text at its allowance. Every figure is in ``servelab/data/node_rates.toml`` with its source; the cells the record
lacks are named in the plan's notes, never counted as no time silently.
"""

import json
import math
import re
import sys
import tempfile
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import jupytext

from servelab.core.catalogue import NOTEBOOKS
from servelab.core.hardware import NODE_TYPES
from servelab.core.paths import DATA_DIR, REPO_ROOT, git, recorded_at
from servelab.core.tables import prose

RATES_FILE = DATA_DIR / "node_rates.toml"
CELL_TIMES = REPO_ROOT / "docs" / "records" / "notebook-cell-times.json"
REHEARSAL = REPO_ROOT / "docs" / "records" / "rehearsal-2cpu.json"  # `make rehearse`'s step times (issue #62)
CORE = tuple(name for name, notebook in NOTEBOOKS.items() if notebook.core)
LEASE_MIN = 175  # the lease: 2 h 55
CORE_AIM_MIN = 125  # issue #52: a core path of 2 h 05, so that a walk's median fits in 2 h 15
CALIBRATED = ("4_fastapi", "6_triton_python", "7_triton_onnx", "8_triton_more")  # the notebooks [cells] prices
WALK = REPO_ROOT / "docs" / "records" / "lease-walk.json"  # issue #66's walk, and these rules on what it walked
OPTIONAL = re.compile(r"\(optional\)\s*$")
SHELL = re.compile(r"^```shell\n(.*?)^```", re.DOTALL | re.MULTILINE)
SHOWN = re.compile(r"<!-- generated: (?:excerpt|stage-config) .*?-->(.*?)<!-- end generated -->", re.DOTALL)
QUESTION = re.compile(r"[*_]*Questions?(?![a-z])")  # *Questions:*, *Questions,*, **Question.**, Question: ...
# In a paragraph, not a heading; "open" followed by what it opens ("open a second SSH connection" is no page).
BROWSER = re.compile(r"\bbrowser\b|\bopen\s+(the\s+)?`?(https?://|Jupyter|GourmetGram)", re.IGNORECASE)
YOUR_CODE = re.compile(r"^# YOUR CODE: (.+)$", re.MULTILINE)
PRINTS = re.compile(r"\b(print|display)\(|\blab\.\w+\(|^await ", re.MULTILINE)  # a cell whose output is read
PA_FLAG = re.compile(r"--(measurement-interval|max-trials|concurrency-range|request-rate-range)[ =](\S+)")
Span = tuple[float, float, float]  # seconds: low, median, high


@cache
def rates() -> dict:
    """node_rates.toml (its ``wait``: per notebook, the waits no cell or shell line shows), read when a plan is made,
    not on import: the dress rehearsal, which writes its record, imports this module's readers of the answers. A
    [shell.NAME] that names a ``rehearsal`` step gets its seconds from that record: the step's wall time times its
    ``scale`` (low, median, high), and its source says so."""
    loaded = tomllib.loads(RATES_FILE.read_text(encoding="utf-8"))
    record = json.loads(REHEARSAL.read_text(encoding="utf-8"))
    walls = {step["step"]: step["wall_s"] for step in record["steps"] if step["rc"] == 0}
    for row in loaded["shell"].values():
        if step := row.get("rehearsal"):
            if step not in walls:
                raise ValueError(f"{RATES_FILE.name}: the rehearsal step {step!r} is not in {REHEARSAL.name}")
            row["seconds"] = [round(walls[step] * s, 1) for s in row["scale"]]
            row["source"] = (f"measured: `{step}` took {walls[step]:g} s in the dress rehearsal (docs/records/"
                             f"{REHEARSAL.name}, {record['machine']['cpus']} CPUs, at {record['commit'][:7]}) × "
                             f"{' / '.join(f'{s:g}' for s in row['scale'])}; {row['source']}")
    return loaded


def _add(*spans: Span) -> Span:
    return tuple(map(sum, zip((0.0, 0.0, 0.0), *spans)))  # type: ignore[return-value]


def _times(n: float, span: Span) -> Span:
    return tuple(n * s for s in span)  # type: ignore[return-value]


@dataclass
class Part:  # the core or the optional part of one notebook
    words: int = 0
    tasks: Counter[str] = field(default_factory=Counter)  # [allowance.NAME]: how many
    cells_s: float = 0.0  # the record's seconds of its code cells
    shell_waits: Counter[str] = field(default_factory=Counter)  # [shell.NAME]: how many lines start one
    unrecorded: list[str] = field(default_factory=list)  # its code cells the record lacks (first lines)
    read_before_s: float = 0.0  # its reading done during an earlier notebook's waits (``read_during_waits``)
    typed_pa: list[Span] = field(default_factory=list)  # each perf_analyzer line typed, at the node (``typed_run``)
    chores: Span = (0.0, 0.0, 0.0)  # what its text does not count (``[[task.NAME]]``)
    factor: float = 1.0  # the node's seconds per second of the record (``node_factor``)

    @property
    def reading_s(self) -> float:
        return 60 * self.words / rates()["reading_wpm"] - self.read_before_s

    @property
    def students(self) -> Span:
        return _add(self.chores, *(_times(n, rates()["allowance"][name]["seconds"]) for name, n in self.tasks.items()))

    @property
    def shell_s(self) -> Span:
        return _add(*(_times(n, rates()["shell"][name]["seconds"]) for name, n in self.shell_waits.items()))

    @property
    def machine(self) -> Span:
        return _add((self.cells_s * self.factor,) * 3, self.shell_s, *self.typed_pa)

    def total(self, waits: Span = (0, 0, 0)) -> Span:
        return _add((self.reading_s,) * 3, self.students, self.machine, waits)


@dataclass
class NotebookPlan:
    name: str
    core: Part
    optional: Part
    waits: Span = (0.0, 0.0, 0.0)  # the waits no cell shows (``[[wait.NAME]]``)


def sections(text: str) -> list[tuple[bool, str]]:
    """(optional, text) per ``##`` or ``###`` section; a ``###`` section is optional where its own heading
    or its ``##`` section's says so; what comes before the first heading is core."""
    parts, optional, parent, start = [], False, False, 0
    for m in re.finditer(r"^(##|###) (.*)$", text, re.MULTILINE):
        parts.append((optional, text[start:m.start()]))
        marked = bool(OPTIONAL.search(m[2]))
        if m[1] == "##":
            parent = optional = marked
        else:
            optional = parent or marked
        start = m.start()
    parts.append((optional, text[start:]))
    return parts


def _prose(text: str) -> str:
    """The author's prose: no Jupytext header, code, shell or generated blocks, or comments."""
    prose = re.sub(r"\A---\n.*?^---$", " ", text, flags=re.DOTALL | re.MULTILINE)  # Jupytext's header
    prose = re.sub(r"^```.*?^```", " ", prose, flags=re.DOTALL | re.MULTILINE)
    return re.sub(r"<!-- generated:.*?<!-- end generated -->|<!--.*?-->", " ", prose, flags=re.DOTALL)


def answers(root: Path = REPO_ROOT) -> dict[str, str]:
    """docs/instructors.md's answer to each cell students write, by the name in its first line."""
    return _answers((root / "docs" / "instructors.md").read_text(encoding="utf-8"))


@cache  # by the text, not the path: ``walked`` writes another commit's answers into a temporary folder
def _answers(text: str) -> dict[str, str]:
    return {YOUR_CODE.match(block)[1]: block  # type: ignore[index]
            for block in re.findall(r"^```python\n(# YOUR CODE: .*?)^```", text, re.DOTALL | re.MULTILINE)}


def count_text(section: str, part: Part) -> None:
    """A section's prose and the student's tasks its text shows (the code cells: ``count_cell``)."""
    part.words += len(re.findall(r"[A-Za-z0-9][\w'’.-]*", _prose(section)))
    for block in SHELL.findall(section):
        for line in (line.strip() for line in block.splitlines()):
            if line and not line.startswith("#"):
                part.tasks["ssh_line" if line.startswith("ssh ") else "shell_line"] += 1
                part.shell_waits.update(name for name, wait in rates()["shell"].items() if re.match(wait["line"], line))
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", _prose(section))]
    part.tasks["question"] += sum(1 for p in paragraphs if QUESTION.match(p))
    part.tasks["browser_step"] += sum(1 for p in paragraphs if BROWSER.search(p) and not p.startswith("#"))
    part.tasks["excerpt_line"] += sum(len(shown.strip().splitlines()) for shown in SHOWN.findall(section))


def typed_run(line: str) -> Span:
    """A typed perf_analyzer line's seconds on the node, by its flags (``[typed_perf_analyzer]``)."""
    flags = dict(PA_FLAG.findall(line))
    start, end, step = (flags.get("concurrency-range", flags.get("request-rate-range", "1")) + "::").split(":")[:3]
    steps = len(range(int(start), int(end or start) + 1, int(step or 1)))
    window_s, trials = int(flags.get("measurement-interval", 5000)) / 1000, int(flags.get("max-trials", 10))
    return _times(steps * window_s, (3, (3 + trials) / 2, trials))


def count_cell(source: str, recorded: dict | None, part: Part, key: dict[str, str]) -> None:
    """A code cell: its recorded seconds (a typed perf_analyzer line: its node time by its flags, as the record
    ran it at 1 s windows), the reading of what it prints, and, where students write it, the length of its answer
    in ``key`` (``answers()``)."""
    first, written = source.partition("\n")[0], YOUR_CODE.match(source)
    shown = key.get(written[1], source) if written else source
    lines = [line for line in shown.splitlines() if line.strip() and not line.lstrip().startswith("#")]  # no comment
    part.typed_pa += [typed_run(line) for line in lines if written and "perf_analyzer " in line]
    if recorded is None or recorded["first_line"] != first:
        part.unrecorded.append(first)
    elif not (written and "perf_analyzer " in "".join(lines)):
        part.cells_s += recorded["seconds"]
    part.tasks["printed_output"] += bool(not written and PRINTS.search(source))
    if written or "# TODO" in source:
        given = set(source.splitlines()) if written else set()  # the answer's lines the cell holds already
        part.tasks["written_cell"] += 1
        part.tasks["written_line"] += max(1, len([line for line in lines if line not in given]))


def cell_times() -> dict:
    return json.loads(CELL_TIMES.read_text(encoding="utf-8"))


def code_cells(text: str) -> list[tuple[bool, str, str]]:
    """(optional, source, its section) per code cell, in order: the plan prices each in its part; a unit test
    checks the names each takes from the cells before."""
    code = [c.source for c in jupytext.reads(text, fmt="md").cells if c.cell_type == "code"]  # as committed
    found, at, index = [], 0, 0
    for is_optional, section in sections(text):
        end = at + len(section)
        while index < len(code) and 0 <= text.find(code[index], at) < end:  # the code cells it holds, in order
            found.append((is_optional, code[index], section))
            at, index = text.find(code[index], at) + len(code[index]), index + 1
        at = end
    return found + [(False, source, "") for source in code[index:]]  # a cell not found as written (none today)


def node_factor(record: dict) -> float:
    """The node's seconds per second of ``record``: [cells] node_loads_s over its seconds of the CALIBRATED notebooks
    (calibrated with each record, so a record taken another way cannot shift the node's total)."""
    return round(rates()["cells"]["node_loads_s"] / sum(c["seconds"] for n in CALIBRATED for c in record[n]["cells"]), 2)


def plan_notebook(path: Path, record: dict | None = None, factor: float | None = None,
                  key: dict[str, str] | None = None) -> NotebookPlan:
    """``record``: the cells' seconds per notebook, ``cell_times()`` unless given; ``factor``: its ``node_factor``,
    the committed record's unless given; ``key``: the answers (``answers()``)."""
    text = path.read_text(encoding="utf-8")
    cells = (cell_times() if record is None else record).get(path.stem, {}).get("cells", [])
    factor = node_factor(cell_times()) if factor is None else factor
    key = answers() if key is None else key
    core, optional = Part(factor=factor), Part(factor=factor)
    for is_optional, section in sections(text):
        count_text(section, optional if is_optional else core)
    for index, (is_optional, source, _) in enumerate(code_cells(text)):
        count_cell(source, cells[index] if index < len(cells) else None, optional if is_optional else core, key)
    core.chores = _add(*(task["seconds"] for task in rates().get("task", {}).get(path.stem, [])))
    return NotebookPlan(path.stem, core, optional, _add(*(w["seconds"] for w in rates()["wait"].get(path.stem, []))))


def lease_plan(root: Path = REPO_ROOT, record: dict | None = None) -> list[NotebookPlan]:
    """The plan of the notebooks under ``root`` with its answers, priced with ``record`` (the committed one unless
    given) at its own ``node_factor``."""
    order = lambda p: int(p.stem.split("_")[0])  # noqa: E731
    record = cell_times() if record is None else record
    factor, key = node_factor(record), answers(root)
    plans = [plan_notebook(p, record, factor, key) for p in sorted((root / "notebooks").glob("[0-9]*_*.md"), key=order)]
    by_name = {p.name: p for p in plans}
    for p in plans:  # unattended waits hold the reading of the notebooks they ask for, up to their median
        left = p.waits[1] + p.core.shell_s[1]
        for name in rates()["read_during_waits"].get(p.name, []):
            read = min(left, by_name[name].core.reading_s)
            by_name[name].core.read_before_s += read
            left -= read
    return plans


def core_minutes(plans: list[NotebookPlan]) -> Span:
    return _times(1 / 60, _add(*(p.core.total(p.waits) for p in plans if p.name in CORE)))


def walked(commit: str) -> Span:
    """The core path's minutes by these rules on the notebooks, answers and cell record of ``commit`` (read with
    git): a plan that agrees with a walk prices what the walk walked as the walk did."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        pages = [p for p in git("ls-tree", "--name-only", commit, "notebooks/").split() if p.endswith(".md")]
        for path in [*pages, "docs/instructors.md"]:
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(git("show", f"{commit}:{path}"), encoding="utf-8")
        return core_minutes(lease_plan(root, json.loads(git("show", f"{commit}:docs/records/{CELL_TIMES.name}"))))


def write_walk_record() -> dict:
    """``WALK``: the walk's minutes ([walk] of node_rates.toml) beside ``walked`` of its commit, at this commit."""
    walk = rates()["walk"]
    record = {"walk": walk, "rules": [round(m, 1) for m in walked(walk["commit"])], "at": recorded_at(WALK)}
    WALK.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return record


def catch_up(plans: list[NotebookPlan]) -> str:
    """The cuts that save core-path minutes, each with its median minutes (issue #66: skipping what is optional
    saves nothing on the core path)."""
    a = {name: row["seconds"][1] for name, row in rates()["allowance"].items()}
    questions = sum(p.core.tasks["question"] for p in plans if p.name in CORE)
    typed = [(p.name, run[1] + a["written_cell"] + a["written_line"] + a["printed_output"]) for p in plans
             if p.name in CORE for run in p.core.typed_pa]  # the line, its run, and its check's output
    where, typed_s = " and ".join(f"`{name}`" for name in dict.fromkeys(n for n, _ in typed)), sum(s for _, s in typed)
    return (f"Behind at a checkpoint? These save core-path minutes (medians): answer the {questions} question paragraphs "
            f"after the lease ({_m(questions * a['question'])} min); skip typing the {len(typed)} perf_analyzer lines "
            f"(in {where}) and their check cells: `servelab load` measured the same stages in the step before each "
            f"({_m(typed_s)} min). Sections "
            "marked *(optional)* are not in the core path: skipping them saves nothing on it.")


def _m(seconds: float) -> str:
    return f"{math.ceil(seconds / 60):.0f}" if seconds else "–"


def _clock(minutes: float) -> str:
    whole = math.ceil(minutes)  # rounded up, as the table's minutes are
    return f"{whole // 60} h {whole % 60:02d}"


def plan_table() -> str:
    """The plan as Markdown, lines of at most 200 characters: a row per notebook, then each figure's source."""
    record = cell_times()
    plans = lease_plan(record=record)
    lines = ["| notebook | reading | students' tasks | machine | core: low / median / high | core path, by | optional |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    clock = 0.0
    for p in plans:
        core = p.core.total(p.waits)
        optional = p.optional.total()[1] + (core[1] if p.name not in CORE else 0)
        if p.name in CORE:
            clock += core[1]
        lines.append(f"| `{p.name}` | {_m(p.core.reading_s)} | {_m(p.core.students[1])} | "
                     f"{_m(p.core.machine[1] + p.waits[1])} | "
                     + (f"{' / '.join(_m(s) for s in core)} | {_clock(clock / 60)} |" if p.name in CORE else "– | – |")
                     + f" {_m(optional)} |")
    low, median, high = core_minutes(plans)
    r = rates()
    lines += ["", f"Minutes, rounded up. **Core path: {_clock(median)} at the median** (low {_clock(low)}, high "
              f"{_clock(high)}) of a {_clock(LEASE_MIN)} lease; the aim, ≤ {_clock(CORE_AIM_MIN)}: "
              f"{'met' if median <= CORE_AIM_MIN else 'MISSED'}. An estimate, not a timed class "
              "(`servelab/tools/lease_plan.py`).", "", prose(catch_up(plans)), "",
              prose("- The node: booted from the class's prepared image (docs/instructors.md, \"A prepared node\"); from "
                    "Chameleon's own image, `2_create_server_nvidia` and `bin/node-setup` also install and fetch (the "
                    "rows below).", indent="  "),
              f"- Reading: {r['reading_wpm']} words a minute; the notebooks a wait asks students to read meanwhile are "
              "read then, not again.",
              prose(f"- The node type: `gpu_p100`, the original lab's. On {', '.join(f'`{t}`' for t in NODE_TYPES if t != 'gpu_p100')}, "
                    f"a prediction (no run recorded): {r['other_node_types']['prediction']}.", indent="  "),
              f"- Machine: each code cell's seconds in the e2e notebook run's `docs/records/{CELL_TIMES.name}` "
              f"× {node_factor(record):g}:", prose(f"  {r['cells']['source']}.", indent="  ")]
    runs = {f"{run['machine']}, at {run['commit']}" for run in record.values()}
    lines += [f"  Recorded on {run}." for run in sorted(runs)]
    walk = json.loads(WALK.read_text(encoding="utf-8"))
    (low_w, med_w, high_w), (low_r, med_r, high_r) = walk["walk"]["minutes"], walk["rules"]
    lines.append(prose(f"- Against a walk: {walk['walk']['source']}, took {low_w:g} / {med_w:g} / {high_w:g} min; these "
                       f"rules, on the notebooks, answers and cell record it walked, give {low_r:.0f} / {med_r:.0f} / "
                       f"{high_r:.0f} (the median {100 * (med_r / med_w - 1):+.0f} %; `docs/records/{WALK.name}`, at "
                       f"{walk['at']}).", indent="  "))
    for name, row in [*r["allowance"].items(), *r["shell"].items()]:
        lines.append(prose(f"- {name.replace('_', ' ')}: {' / '.join(f'{s:g}' for s in row['seconds'])} s ({row['source']}).",
                           indent="  "))
    for name, rows in r["wait"].items():
        lines += [prose(f"- `{name}`, {w['what']}: {' / '.join(f'{round(s / 60, 2):g}' for s in w['seconds'])} min ({w['source']}).",
                        indent="  ") for w in rows]
    missing = [f"`{p.name}` ({len(p.core.unrecorded) + len(p.optional.unrecorded)})" for p in plans
               if p.core.unrecorded or p.optional.unrecorded]
    if missing:
        lines.append(prose(f"- Code cells not in the record, counted as no time: {', '.join(missing)}.", indent="  "))
    return "\n".join(lines)


if __name__ == "__main__":  # `python -m servelab.tools.lease_plan --walked`: write WALK again
    if sys.argv[1:] != ["--walked"]:
        sys.exit("usage: python -m servelab.tools.lease_plan --walked")
    print(json.dumps(write_walk_record()))
