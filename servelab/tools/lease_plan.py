"""The lease plan, computed from the notebooks themselves rather than estimated.

For each notebook the plan adds up:

* **measuring**: every measurement a code cell makes (``lab.measure``, ``lab.measure_variant``,
  ``lab.stage``; ``4_fastapi``'s production cases ``lab.overload``, ``lab.photo_mix``, ``lab.rollout``, a
  stage derived from one of the catalogue's at its rate), its loads evaluated from the notebook's own
  parameters, timed at the lab node's rate
  for that stage (``servelab/data/node_rates.toml``, each with its source) — and, on the Triton notebooks, perf_analyzer's
  worst case for each load it measures (every window it may try, or its hard time limit where the
  offered rate is above what the stage can serve);
* **reading**: the words of prose (code left out) at ``READING_WPM``;
* **waiting**: the builds, pulls and boots the notebook states (``WAITS``, each with its source), and
  every stage switch (``SWITCH_S``).

A section whose heading ends in "(optional)" is left out of the core path and counted on its own.
The table is written into ``notebooks/0_intro.md`` and ``docs/instructors.md`` (``make notebooks``).
Rates the original lab never measured are assumed no faster than a stage it did (said in the
source), so the plan errs long, never short.
"""

import ast
import math
import re
import tomllib
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from servelab.measure.loadgen import overload_load, rollout_load
from servelab.measure.perf_analyzer import DEFAULT_TIMEOUT_S, Windows
from servelab.measure.records import Load
from servelab.core.catalogue import CACHED, OVERLOADED, STAGES, bounded, cached_name
from servelab.core.paths import DATA_DIR, REPO_ROOT

RATES_FILE = DATA_DIR / "node_rates.toml"  # per stage: requests/s on the lab node, alone and busy, with sources


@dataclass(frozen=True)
class Rate:
    alone: float
    busy: float
    source: str


@cache
def node_rates() -> dict[str, Rate]:
    """Every stage's rate on the lab node; one the original lab never measured takes the rate of the stage
    it is assumed no faster than, with that said in its source."""
    table = tomllib.loads(RATES_FILE.read_text(encoding="utf-8"))
    measured = {name: Rate(**row) for name, row in table.items() if "as" not in row}
    return {**measured, **{name: replace(measured[row["as"]], source=f"no figure: assumed no faster than {row['as']} "
                                         f"({measured[row['as']].source})") for name, row in table.items() if "as" in row}}


READING_WPM = 150  # technical prose with code beside it, read to answer questions (an assumption, stated)
SWITCH_S = 30  # one stage switch: a container restart or a model reload (an assumption, stated)


@dataclass(frozen=True)
class Wait:
    """What a notebook waits for besides its measurements. ``behind``: the notebooks it runs behind (a
    build started in the background earlier), whose time it does not add where it takes no longer."""

    minutes: float
    what: str
    source: str
    behind: tuple[str, ...] = ()


WAITS: dict[str, list[Wait]] = {
    "2_create_server_nvidia": [Wait(15, "booting the bare-metal node and installing Docker and the NVIDIA toolkit",
                                    "assumed: a bare-metal boot, then the install")],
    "3_fastapi_setup": [Wait(10, "building the FastAPI images", "3_fastapi_setup: several minutes, mostly PyTorch")],
    "5_triton_setup": [Wait(20, "building the Triton image, started at the end of 3_fastapi_setup",
                            "assumed", behind=("4_fastapi",))],
    "9_ray_setup": [Wait(25, "booting two nodes and building the Ray image", "assumed: 2_create_server_nvidia and "
                         "5_triton_setup's together")],
    "11_delete_resources": [Wait(5, "copying the results off the node and deleting it", "assumed")],
}
CORE = ("2_create_server_nvidia", "3_fastapi_setup", "4_fastapi", "5_triton_setup", "6_triton_python",
        "7_triton_onnx", "8_triton_more", "11_delete_resources")
CORE_AIM_MIN = 105  # the core path must leave room in a 2 h 55 lease
OPTIONAL = re.compile(r"\(optional\)\s*$")
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)


# The stages the production cases derive from the catalogue's (a bounded queue, a cache), at the rate of theirs:
# the plan errs long, as a cache only adds speed and a bound only refuses work.
DERIVED = {bounded(STAGES[name]).name: name for name in OVERLOADED} | {cached_name(name): name for name in CACHED}
MEASURING = ("measure", "measure_variant", "stage", "overload", "photo_mix", "rollout")  # lab's calls that measure


def rate(stage: str) -> Rate:
    return node_rates()[DERIVED.get(stage, stage)]


@dataclass
class Part:
    """The core part or the optional part of one notebook."""

    measure_s: float = 0.0
    perf_analyzer_s: float = 0.0
    words: int = 0
    switches: int = 0
    over_capacity: list[str] = field(default_factory=list)  # open-loop loads above the stage's rate

    @property
    def reading_s(self) -> float:
        return 60 * self.words / READING_WPM

    def total_s(self, waits_min: float = 0.0) -> float:
        return self.measure_s + self.perf_analyzer_s + self.reading_s + self.switches * SWITCH_S + 60 * waits_min


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
    prose = re.sub(r"^```.*?^```", " ", text, flags=re.DOTALL | re.MULTILINE)
    prose = re.sub(r"<!-- generated: lease-plan -->.*?<!-- end generated -->", " ", prose, flags=re.DOTALL)  # itself
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
        for code in FENCE.findall(section):
            if not code.lstrip().startswith("# parameters") and "tags=" not in code[:40]:
                notebook.cell(code, part)
    waits = WAITS.get(path.stem, [])
    return NotebookPlan(path.stem, core, optional, waits, sum(w.minutes for w in waits))


def lease_plan(folder: Path = REPO_ROOT / "notebooks") -> list[NotebookPlan]:
    order = lambda p: int(p.stem.split("_")[0])  # noqa: E731
    plans = [plan_notebook(p) for p in sorted(folder.glob("[0-9]*_*.md"), key=order)]
    core_s = {p.name: p.core.total_s() for p in plans}
    for p in plans:
        p.waits_min = sum(max(0.0, w.minutes - sum(core_s.get(n, 0.0) for n in w.behind) / 60) for w in p.waits)
    return plans


def core_minutes(plans: list[NotebookPlan]) -> float:
    return sum(p.core.total_s(p.waits_min) for p in plans if p.name in CORE) / 60


def _m(seconds: float) -> str:
    return f"{math.ceil(seconds / 60):.0f}"


def plan_table() -> str:
    """The plan as Markdown: per notebook, minutes measuring, with perf_analyzer, reading, waiting, and the
    running clock of the core path; then what it assumed."""
    plans = lease_plan()
    lines = ["| notebook | measuring | perf_analyzer (worst case) | reading | switches and waits | core path, by | "
             "optional parts |", "|---|---:|---:|---:|---:|---:|---:|"]
    clock = 0.0
    for p in plans:
        if p.name in CORE:
            clock += p.core.total_s(p.waits_min)
            by = f"{int(clock // 3600)}:{int(clock % 3600 // 60):02d}"
        else:
            by = "–"
        optional = p.optional.total_s() + (p.core.total_s(p.waits_min) if p.name not in CORE else 0)
        lines.append(f"| `{p.name}` | {_m(p.core.measure_s)} | {_m(p.core.perf_analyzer_s)} | {_m(p.core.reading_s)} | "
                     f"{_m(p.core.switches * SWITCH_S + 60 * p.waits_min)} | {by} | {_m(optional) if optional else '–'} |")
    over = [o for p in plans for o in p.core.over_capacity + p.optional.over_capacity]
    total = core_minutes(plans)
    lines += ["", f"Minutes, rounded up. **Core path: {int(total // 60)} h {math.ceil(total % 60):02d} min** "
              f"(aim ≤ {CORE_AIM_MIN // 60} h {CORE_AIM_MIN % 60:02d}: {'met' if total <= CORE_AIM_MIN else 'MISSED'}). "
              f"Computed by `servelab/tools/lease_plan.py` from each notebook's parameters and cells: rates of the "
              f"original lab's P100 node where it measured the stage, else the slowest stage of its kind; reading "
              f"at {READING_WPM} words a minute; {SWITCH_S} s per stage switch; "
              + "; ".join(f"{w.what} {w.minutes:g} min ({w.source}"
                          + (f"; what is left after {', '.join(w.behind)})" if w.behind else ")")
                          for waits in WAITS.values() for w in waits) + "."]
    if over:
        lines.append(f"\nOpen-loop loads above the stage's rate (perf_analyzer counted at its {DEFAULT_TIMEOUT_S:g} s "
                     f"limit): " + ", ".join(over) + ".")
    return "\n".join(lines)
