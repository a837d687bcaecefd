"""The lease plan, counted from the notebooks themselves: the machine's time and the people's.

For each notebook the plan adds up:

* **measuring**: every measurement a code cell makes (``lab.measure``, ``lab.measure_variant``,
  ``lab.stage``; ``4_fastapi``'s production cases ``lab.overload``, ``lab.photo_mix``, ``lab.rollout``, a
  stage derived from one of the catalogue's at its rate), its loads evaluated from the notebook's own
  parameters, timed at the lab node's rate
  for that stage (``servelab/data/node_rates.toml``, each with its source) — and, on the Triton notebooks, perf_analyzer's
  worst case for each load it measures (every window it may try, or its hard time limit where the
  offered rate is above what the stage can serve);
* **reading**: the words of prose (code left out) at ``READING_WPM``;
* **people**: what a student does with the text, counted in it (``People``), each task at its allowance
  (``[allowance]`` in ``node_rates.toml``, each with where its figure comes from): a typed shell block, an
  SSH session or tunnel, a browser step, a config block or a cell of framework code written, a perf_analyzer
  run typed by hand, a line of shown code (excerpts and configs), a result table read, a question answered;
* **waiting**: the boot, the builds and pulls the notebook states (``WAITS``, each with its source; every
  image is built in one unattended step before the first measurement), and every stage switch (``SWITCH_S``).

A section whose heading ends in "(optional)" is left out of the core path and counted on its own.
The table is written into ``notebooks/0_intro.md`` and ``docs/instructors.md`` (``make notebooks``).
Every figure is a rate the original lab measured or an assumption that says so; rates it never measured
are assumed no faster than a stage it did. The plan is an estimate, not a timed class.
"""

import ast
import math
import re
import tomllib
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from servelab.core.catalogue import CACHED, NOTEBOOKS, OVERLOADED, STAGES, bounded, cached_name
from servelab.core.paths import DATA_DIR, REPO_ROOT
from servelab.core.tables import prose
from servelab.measure.loadgen import overload_load, rollout_load
from servelab.measure.perf_analyzer import DEFAULT_TIMEOUT_S, Windows
from servelab.measure.records import Load

RATES_FILE = DATA_DIR / "node_rates.toml"  # per stage: requests/s on the lab node, alone and busy, with sources


@dataclass(frozen=True)
class Rate:
    alone: float
    busy: float
    source: str


@dataclass(frozen=True)
class Allowance:
    seconds: float
    source: str


@cache
def allowances() -> dict[str, Allowance]:
    """Seconds per student task (``People``' fields), each with where its figure comes from."""
    table = tomllib.loads(RATES_FILE.read_text(encoding="utf-8"))["allowance"]
    return {name: Allowance(**row) for name, row in table.items()}


@cache
def node_rates() -> dict[str, Rate]:
    """Every stage's rate on the lab node; one the original lab never measured takes the rate of the stage
    it is assumed no faster than, with that said in its source."""
    table = tomllib.loads(RATES_FILE.read_text(encoding="utf-8"))
    table.pop("allowance")
    measured = {name: Rate(**row) for name, row in table.items() if "as" not in row}
    return {**measured, **{name: replace(measured[row["as"]], source=f"no figure: assumed no faster than {row['as']} "
                                         f"({measured[row['as']].source})") for name, row in table.items() if "as" in row}}


READING_WPM = 150  # technical prose with code beside it, read to answer questions (an assumption, stated)
SWITCH_S = 30  # one stage switch: a container restart or a model reload (an assumption, stated)


@dataclass(frozen=True)
class Wait:
    """What a notebook waits for besides its measurements. ``behind``: the notebooks it runs behind (a
    build started in the background earlier), whose time it does not add where it takes no longer.
    ``reads``: the notebooks whose prose the notebook asks students to read while it waits (an unattended
    step), whose reading time the wait then holds, up to its length."""

    minutes: float
    what: str
    source: str
    behind: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()


WAITS: dict[str, list[Wait]] = {
    "2_create_server_nvidia": [
        Wait(15, "a bare-metal node from submit to ACTIVE",
             "assumed: Chameleon's bare-metal provisioning (deploying the image, rebooting), as the issue's trial saw it",
             reads=("3_fastapi_setup", "4_fastapi")),
        Wait(5, "from ACTIVE until SSH answers (the node's first boot)", "assumed"),
        Wait(8, "installing Docker and the NVIDIA toolkit, cloning and installing servelab", "assumed")],
    "3_fastapi_setup": [Wait(20, "pulling and building every image of the lab (FastAPI's two, Jupyter, GourmetGram, "
                                 "Triton's), in one unattended step before the first measurement",
                             "assumed: 4_fastapi's own bound for one image's first build (its WAIT_S, 1200 s); "
                             "the images build side by side", reads=("5_triton_setup", "6_triton_python"))],
    "9_ray_setup": [Wait(40, "booting two nodes and building the Ray image", "assumed: 2_create_server_nvidia's "
                         "boot and 3_fastapi_setup's builds together")],
    "11_delete_resources": [Wait(5, "copying the results and notebooks off the node and deleting it", "assumed")],
}
CORE = tuple(name for name, notebook in NOTEBOOKS.items() if notebook.core)
LEASE_MIN = 175  # the lease: 2 h 55
CORE_AIM_MIN = 135  # the core path must leave 40 minutes of the lease to spare
OPTIONAL = re.compile(r"\(optional\)\s*$")
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)


# The stages the production cases derive from the catalogue's (a bounded queue, a cache), at the rate of theirs:
# the plan errs long, as a cache only adds speed and a bound only refuses work.
DERIVED = {bounded(STAGES[name]).name: name for name in OVERLOADED} | {cached_name(name): name for name in CACHED}
MEASURING = ("measure", "measure_variant", "stage", "overload", "photo_mix", "rollout")  # lab's calls that measure


def rate(stage: str) -> Rate:
    return node_rates()[DERIVED.get(stage, stage)]


@dataclass
class People:
    """What a student does with a part of a notebook, counted in its text; each at its ``allowances()``."""

    shell_block: int = 0  # a ```shell block (not an SSH session, not perf_analyzer)
    ssh_session: int = 0  # a ```shell block that opens an SSH session or tunnel
    browser_step: int = 0  # a paragraph that sends the student to a browser
    block_written: int = 0  # a parameters cell the student fills in (MY_...)
    perf_analyzer_by_hand: int = 0  # a ```shell block that runs perf_analyzer, or a "# YOUR CODE: perf_analyzer ..." cell
    code_written: int = 0  # a code cell marked "# YOUR CODE" (not perf_analyzer's): framework code the student completes
    excerpt_line: int = 0  # a line of shown code or config (generated excerpts and stage configs)
    result_table: int = 0  # a table a measuring call prints, or a cell displays
    question: int = 0  # a question paragraph (*Question:* / *Questions:*)

    @property
    def seconds(self) -> float:
        rates = allowances()
        return sum(getattr(self, name) * rates[name].seconds for name in rates)


@dataclass
class Part:
    """The core part or the optional part of one notebook."""

    measure_s: float = 0.0
    perf_analyzer_s: float = 0.0
    words: int = 0
    switches: int = 0
    people: People = field(default_factory=People)
    measured: list[tuple[str, str]] = field(default_factory=list)  # (stage, load) its measuring calls measure
    over_capacity: list[str] = field(default_factory=list)  # open-loop loads above the stage's rate

    read_before_s: float = 0.0  # its reading done during an earlier notebook's wait (Wait.reads)

    @property
    def reading_s(self) -> float:
        return 60 * self.words / READING_WPM

    def total_s(self, waits_min: float = 0.0) -> float:
        return (self.measure_s + self.perf_analyzer_s + self.reading_s - self.read_before_s + self.people.seconds
                + self.switches * SWITCH_S + 60 * waits_min)


SHELL = re.compile(r"^```shell\n(.*?)^```", re.DOTALL | re.MULTILINE)
SHOWN = re.compile(r"<!-- generated: (?:excerpt|stage-config) .*?-->(.*?)<!-- end generated -->", re.DOTALL)


def count_people(section: str, people: People) -> None:
    """Count a section's student tasks (not its measuring calls' tables: ``_Notebook.call`` counts those)."""
    for block in SHELL.findall(section):
        first = block.strip().split()[0] if block.strip() else ""
        if re.fullmatch(r"servelab triton stage [\w-]+", block.strip()):
            continue  # shown: the step runs it itself (STAGE_COMMAND)
        if first == "ssh":
            people.ssh_session += 1
        elif "perf_analyzer " in block:
            people.perf_analyzer_by_hand += 1
        else:
            people.shell_block += 1
    prose = re.sub(r"^```.*?^```", " ", section, flags=re.DOTALL | re.MULTILINE)
    paragraphs = [p for p in re.split(r"\n\s*\n", prose) if p.strip()]
    people.browser_step += sum(1 for p in paragraphs if re.search(r"\bbrowser\b", p))
    people.question += sum(1 for p in paragraphs if re.match(r"\*Questions?[:*]", p.strip()))
    people.block_written += len(re.findall(r'^```python tags=\["parameters"\]\nMY_', section, re.MULTILINE))
    written = re.findall(r"^```python\n# YOUR CODE: (.*)$", section, re.MULTILINE)
    # A perf_analyzer line typed into a cell (`!perf_analyzer ...`) is a perf_analyzer run by hand, as in a terminal.
    people.perf_analyzer_by_hand += sum(1 for name in written if name.startswith("perf_analyzer"))
    people.code_written += sum(1 for name in written if not name.startswith("perf_analyzer"))
    people.excerpt_line += sum(len(shown.strip().splitlines()) for shown in SHOWN.findall(section))
    people.result_table += len(re.findall(r"^display\(Markdown\(", section, re.MULTILINE))


def _per_s(load: Load, stage: str, images: int) -> float:
    """Requests per second the stage serves under ``load``: one at a time, or busy (several senders,
    or an open loop, whose requests overlap)."""
    r = rate(stage)
    alone = load.mode == "sequential" or (load.mode == "closed" and (load.concurrency or 1) == 1)
    return (r.alone if alone else r.busy) / images


def load_seconds(load: Load, stage: str, images: int = 1) -> tuple[float, bool]:
    """How long servelab's load generator takes for ``load`` on the node, and whether it offers more
    than the stage can serve (an open loop's backlog is served after its last arrival)."""
    per_s = _per_s(load, stage, images)
    if load.mode != "open":  # its requests, or its seconds, whichever ends first
        seconds = [(load.requests + load.warmup) / per_s] if load.requests else []
        return min(seconds + ([load.duration_s + load.warmup / per_s] if load.duration_s else [])), False
    offered = load.duration_s * load.rate if load.duration_s else load.requests or 0
    return (offered + load.warmup) / min(per_s, load.rate), load.rate > per_s


def pa_seconds(load: Load, stage: str, window_s: float, trials: int, images: int = 1) -> float:
    """perf_analyzer's worst case for one load: every trial window (each at least four requests
    long), or its hard time limit where the offered rate is above what the stage serves."""
    per_s = _per_s(load, stage, images)
    if load.mode == "open" and load.rate > per_s:
        return DEFAULT_TIMEOUT_S
    return min(DEFAULT_TIMEOUT_S, trials * max(window_s, 4 / per_s))


def parameters(text: str) -> dict[str, Any]:
    """The notebook's parameters cell, as values."""
    found: dict[str, Any] = {}
    for cell in re.findall(r'^```python tags=\["parameters"\]\n(.*?)^```', text, re.DOTALL | re.MULTILINE):
        for node in ast.parse(cell).body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                if isinstance(target, ast.Name):
                    try:
                        found[target.id] = ast.literal_eval(node.value)
                    except ValueError:
                        pass
    return found


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


def _words(text: str) -> int:
    prose = re.sub(r"\A---\n.*?^---$", " ", text, flags=re.DOTALL | re.MULTILINE)  # Jupytext's header
    prose = re.sub(r"^```.*?^```", " ", prose, flags=re.DOTALL | re.MULTILINE)
    # Generated blocks (excerpts of code, the plan itself, figures from records) are not the author's prose.
    prose = re.sub(r"<!-- generated:.*?<!-- end generated -->", " ", prose, flags=re.DOTALL)
    prose = re.sub(r"<!--.*?-->", " ", prose, flags=re.DOTALL)
    return len(re.findall(r"[A-Za-z0-9][\w'’.-]*", prose))


def _open_loads(rates, seconds, warmup):
    return [Load.open(r, arrivals, duration_s=seconds, warmup=warmup) for r in rates for arrivals in ("constant", "poisson")]


class _Notebook:
    """Walks the code cells of one notebook in order, keeping the names they assign that the plan can
    evaluate (parameters, loads, the stage each service variable waits for)."""

    def __init__(self, name: str, params: dict[str, Any]):
        self.name, self.params = name, params
        self.names: dict[str, Any] = {**params, "Load": Load, "open_loads": _open_loads}
        self.triton = "PA_STAGES" in params

    def value(self, node: ast.AST) -> Any:
        return eval(compile(ast.Expression(node), "<cell>", "eval"), {"__builtins__": {}}, self.names)  # noqa: S307

    def cell(self, code: str, part: Part) -> None:
        tree = compile(code, "<cell>", "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        for statement in tree.body:
            for call in (n for n in ast.walk(statement) if isinstance(n, ast.Call)):
                self.call(call, part)
            if isinstance(statement, ast.Assign) and isinstance(statement.targets[0], ast.Name):
                value = statement.value.value if isinstance(statement.value, ast.Await) else statement.value
                name = statement.targets[0].id
                if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "wait_for":
                    self.names[name] = self.value(value.args[0])  # a service variable: its stage
                elif not any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in
                             MEASURING for n in ast.walk(value)):
                    try:
                        self.names[name] = self.value(value)
                    except Exception:  # anything the plan cannot evaluate does not time a measurement
                        pass

    def call(self, call: ast.Call, part: Part) -> None:
        f = call.func
        if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "lab"):
            return
        kwargs = {k.arg: self.value(k.value) for k in call.keywords if k.arg}
        if f.attr == "wait_for":  # a FastAPI stage switched in the student's shell: a container restart
            part.switches += 1
            return
        extra_s, deliberate = 0.0, False
        if f.attr in ("measure", "photo_mix"):
            stage, loads = self.value(call.args[0]), self.value(call.args[1])
            loads = loads if isinstance(loads, list) else [loads]
        elif f.attr == "overload":  # (service, capacity, seconds): above the capacity on purpose
            stage, deliberate = self.value(call.args[0]), True
            loads = [overload_load(rate(self.value(call.args[0])).busy, self.value(call.args[2]))[0]]
        elif f.attr == "rollout":  # (service, variant, load, at_s): a reload during the load, and on after it
            stage, load = self.value(call.args[0]), self.value(call.args[2])
            load, _, trigger = rollout_load(lambda: None, kwargs["at_s"], load.duration_s,
                                            concurrency=load.concurrency, warmup=load.warmup)
            loads, extra_s = [load], trigger.hold_s
            part.switches += 1
        elif f.attr == "measure_variant":
            variant, loads = self.value(call.args[0]), [self.value(call.args[1])]
            if variant not in self.params.get("VARIANTS", [variant]):
                return
            stage = f"fastapi-onnx-{variant}"
            part.switches += 1
        elif f.attr == "stage":
            stage, loads = self.value(call.args[0]), [self.value(a) for a in call.args[1:3]]
            part.switches += 1
        else:
            return
        if self.triton and stage not in self.params.get("STAGES", [stage]):
            return
        images = kwargs.get("batch") or 1
        part.measure_s += extra_s
        part.measured += [(stage, load.label()) for load in loads]
        part.people.result_table += 1
        for load in loads:
            seconds, over = load_seconds(load, stage, images)
            part.measure_s += seconds
            if over and not deliberate:
                part.over_capacity.append(f"{self.name}: {stage} {load.label()}")
            if self.triton and self.params.get("PERF_ANALYZER") and stage in (self.params.get("PA_STAGES") or []):
                trials = next((int(a.split("=")[1]) for a in self.params.get("PA_EXTRA", [])
                               if a.startswith("--max-trials=")), Windows().max_trials)
                part.perf_analyzer_s += pa_seconds(load, stage, self.params.get("PA_WINDOW_S", 5), trials, images)
        if self.triton:
            part.switches += 1


@dataclass
class NotebookPlan:
    name: str
    core: Part
    optional: Part
    waits: list[Wait]
    waits_min: float = 0.0  # what is left of its waits once the notebooks they run behind are done


def plan_notebook(path: Path) -> NotebookPlan:
    text = path.read_text(encoding="utf-8")
    notebook = _Notebook(path.stem, parameters(text))
    core, optional = Part(), Part()
    for is_optional, section in sections(text):
        part = optional if is_optional else core
        part.words += _words(section)
        count_people(section, part.people)
        for code in FENCE.findall(section):
            if not code.lstrip().startswith("# parameters") and "tags=" not in code[:40]:
                notebook.cell(code, part)
    waits = WAITS.get(path.stem, [])
    return NotebookPlan(path.stem, core, optional, waits, sum(w.minutes for w in waits))


def lease_plan(folder: Path = REPO_ROOT / "notebooks") -> list[NotebookPlan]:
    order = lambda p: int(p.stem.split("_")[0])  # noqa: E731
    plans = [plan_notebook(p) for p in sorted(folder.glob("[0-9]*_*.md"), key=order)]
    core_s = {p.name: p.core.total_s() for p in plans}
    reading_s = {p.name: p.core.reading_s for p in plans}
    for p in plans:  # a boot's waits run one after another: what is read during them is read once
        left = {name: reading_s.get(name, 0.0) for w in p.waits for name in w.reads}
        p.waits_min = 0.0
        for w in p.waits:
            held = sum(core_s.get(n, 0.0) for n in w.behind)
            for name in w.reads:
                read = min(left[name], 60 * w.minutes - held)
                left[name] -= read
                held += read
            p.waits_min += max(0.0, w.minutes - held / 60)
        for name, unread in left.items():  # read during the wait: not again in its own notebook
            next(q for q in plans if q.name == name).core.read_before_s = reading_s[name] - unread
    return plans


def core_minutes(plans: list[NotebookPlan]) -> float:
    return sum(p.core.total_s(p.waits_min) for p in plans if p.name in CORE) / 60


def _m(seconds: float) -> str:
    return f"{math.ceil(seconds / 60):.0f}"


def _clock(seconds: float) -> str:
    return f"{int(seconds // 3600)}:{int(seconds % 3600 // 60):02d}"


def plan_table() -> str:
    """The plan as Markdown: per notebook, minutes measuring, with perf_analyzer, reading, the students' own
    tasks, waiting, and the running clock of the core path; then what it assumed and where each figure comes from."""
    plans = lease_plan()
    lines = ["| notebook | measuring | perf_analyzer (worst case) | reading (not done in a wait) | students' tasks | "
             "switches and waits | core path, by | optional parts |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    clock = 0.0
    for p in plans:
        if p.name in CORE:
            clock += p.core.total_s(p.waits_min)
            by = _clock(clock)
        else:
            by = "–"
        optional = p.optional.total_s() + (p.core.total_s(p.waits_min) if p.name not in CORE else 0)
        lines.append(f"| `{p.name}` | {_m(p.core.measure_s)} | {_m(p.core.perf_analyzer_s)} | "
                     f"{_m(p.core.reading_s - p.core.read_before_s)} | "
                     f"{_m(p.core.people.seconds)} | {_m(p.core.switches * SWITCH_S + 60 * p.waits_min)} | {by} | "
                     f"{_m(optional) if optional else '–'} |")
    over = [o for p in plans for o in p.core.over_capacity + p.optional.over_capacity]
    total = core_minutes(plans)
    rounded = math.ceil(total)
    item = lambda text, depth=0: prose("  " * depth + "- " + text, indent="  " * (depth + 1))  # noqa: E731
    lines += ["", prose(f"Minutes, rounded up. **Core path: {rounded // 60} h {rounded % 60:02d} min** of a "
                        f"{LEASE_MIN // 60} h {LEASE_MIN % 60:02d} lease (aim ≤ {CORE_AIM_MIN // 60} h "
                        f"{CORE_AIM_MIN % 60:02d}: {'met' if total <= CORE_AIM_MIN else 'MISSED'}). An estimate, not a "
                        "timed class: counted by `servelab/tools/lease_plan.py` from each notebook's parameters, cells "
                        "and text, from these figures:"), "",
              item("**Measuring:** rates of the original lab's P100 node where it measured the stage, else a stage "
                   "it is assumed no faster than (`servelab/data/node_rates.toml`)."),
              item(f"**Reading:** {READING_WPM} words a minute (assumed)."),
              item(f"**A stage switch:** {SWITCH_S} s (assumed; every image is built before the first measurement)."),
              item("**Students' tasks**, each counted in the text:")]
    lines += [item(f"{name.replace('_', ' ')}: {a.seconds:g} s ({a.source})", 1) for name, a in allowances().items()]
    lines += [item("**Waits:**")]
    lines += [item(f"{w.what}: {w.minutes:g} min ({w.source}"
                   + (f"; what is left after {', '.join(w.behind)})" if w.behind else ")"), 1)
              for waits in WAITS.values() for w in waits]
    if over:
        lines += ["", prose(f"Open-loop loads above the stage's rate (perf_analyzer counted at its "
                            f"{DEFAULT_TIMEOUT_S:g} s limit): " + ", ".join(over) + ".")]
    return "\n".join(lines)
