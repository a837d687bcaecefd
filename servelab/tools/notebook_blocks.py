"""The parts of the notebooks generated from the project itself, so that they cannot drift from it.

A source marks such a part with a pair of HTML comments (invisible in Jupyter), on lines of their own or, for a
figure inside a sentence, on one line: ``answered in <!-- generated: original-figure pt-1-concurrency-1 average
latency -->18.7 ms<!-- end generated --> alone``. The first word after ``generated:`` names one of ``GENERATORS``,
the rest are its arguments; ``make notebooks`` rewrites every part, and a name that no longer exists fails it.
"""

import ast
import difflib
import importlib.metadata
import importlib.util
import json
import re
import textwrap
import tomllib
from collections.abc import Callable
from pathlib import Path
from statistics import median

from servelab.core import original_lab
from servelab.core.catalogue import CATALOGUE, FAMILIES, of_family
from servelab.core.paths import MODELS_STAGING, REPO_ROOT
from servelab.core.tables import markdown, prose
from servelab.measure.measure_stage import CAP_PER_CORE
from servelab.measure.perf_analyzer import Windows
from servelab.report import TEMPLATES
from servelab.report.check import CHECK_POINTS, STAGE_POINTS
from servelab.report.lessons import RUBRIC
from servelab.run.families import RayAdapter, TritonAdapter, adapter_of
from servelab.run.lab_run import LabRun, minutes
from servelab.run.plan import LAB_STAGES, Plan
from servelab.servers.triton.configs import STAGES, base_config, effective_config, render
from servelab.servers.triton.server import ALL_MODELS

# A part on lines of its own (``-->`` then a line break), or inline (``-->`` then the text, on one line, with no
# backquote or ``<`` in it: the markers quoted in inline code are no part).
BLOCK = re.compile(r"(?P<start><!-- generated: (?P<spec>[^>]*?) -->(?P<newline>\n)?)(?P<body>(?(newline).*?|[^`<\n]*?))"
                   r"(?P<end><!-- end generated -->)", re.DOTALL)


# The parts' prose, a macro a paragraph (servelab/data/notebook-blocks.md.j2).
BLOCKS = TEMPLATES.get_template("notebook-blocks.md.j2").module


def definition_source(path: Path, qualname: str) -> str:
    """The source of ``qualname`` (``Class.method``, ``outer.inner``) in ``path``, decorators included, dedented."""
    text = path.read_text(encoding="utf-8")
    scope: list[ast.stmt] = ast.parse(text).body
    for name in qualname.split("."):
        found = [n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                 and n.name == name]
        if not found:
            raise LookupError(f"{path.name} defines no {qualname} (no {name!r} there)")
        node, scope = found[0], found[0].body
    start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return textwrap.dedent("\n".join(text.splitlines()[start - 1:node.end_lineno]))


def excerpt(path: str, qualname: str) -> str:
    return f"`{qualname}` in `{path}`:\n\n```python\n{definition_source(REPO_ROOT / path, qualname)}\n```"


def node_config(stage_name: str) -> str:
    """The stage model's config as the node's Triton runs it (GPUs, onnxruntime), less every stage's label."""
    stage = STAGES[stage_name]
    config = effective_config(stage, stage.triton.model, kind="gpu", onnxruntime=True, repository=MODELS_STAGING)
    del config.parameters["servelab_stage"]
    return render(config)


def stage_config(name: str, previous: str = "") -> str:
    """A stage's config on the node, as a diff from ``previous``'s, or without one as its committed base file."""
    if not previous:
        stage = STAGES[name]
        if stage.triton.changes:
            raise ValueError(f"{name} changes its base config: show it as a diff from the stage before it")
        path = f"models_staging/{stage.triton.model}/config.pbtxt"
        return f"`{path}`, which `{name}` uses as it is:\n\n```text\n{(REPO_ROOT / path).read_text()}```"
    diff = config_diff(node_config(previous), node_config(name), f"{previous}/config.pbtxt", f"{name}/config.pbtxt")
    return f"`{name}` against `{previous}`, as Triton runs them on the node:\n\n```diff\n" + "\n".join(diff) + "\n```"


def config_diff(before: str, after: str, before_name: str, after_name: str, context: int = 2) -> list[str]:
    """A unified diff of two rendered configs in which each line is matched only within the same
    top-level field: a plain line diff pairs one field's closing ``}`` with another's (an inserted
    ``dynamic_batching { ... }`` before ``parameters`` showed as ``+}`` first and its own ``}`` kept)."""
    def keyed(text: str) -> tuple[list[str], list[tuple[str, str]]]:
        lines, keys, field = text.splitlines(), [], ""
        for line in lines:
            field = field if line.startswith(" ") or line == "}" else line
            keys.append((field, line))
        return lines, keys

    def span(start: int, end: int) -> str:  # as difflib's unified_diff writes a hunk's range
        return f"{start + 1}" if end - start == 1 else f"{start + (end > start)},{end - start}"

    (a, a_keys), (b, b_keys) = keyed(before), keyed(after)
    out = [f"--- {before_name}", f"+++ {after_name}"]
    for group in difflib.SequenceMatcher(None, a_keys, b_keys, autojunk=False).get_grouped_opcodes(context):
        out.append(f"@@ -{span(group[0][1], group[-1][2])} +{span(group[0][3], group[-1][4])} @@")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out += [" " + line for line in a[i1:i2]]
                continue
            out += ["-" + line for line in a[i1:i2]] + ["+" + line for line in b[j1:j2]]
    return out


def triton_models() -> str:
    """Each model of the repository: which backend runs it on the node, and which locally."""
    def runner(config) -> str:
        if config.HasField("ensemble_scheduling"):  # an ensemble: Triton schedules its steps
            return "Triton's ensemble scheduler (no code of ours)"
        if config.backend == "onnxruntime":
            return "Triton's `onnxruntime` backend (C++, no Python)"
        if "servelab_stand_in" in config.parameters:
            return ("**LOCAL STAND-IN**: `python` backend, `food_classifier_onnx/1/model.py` calling ONNX Runtime on "
                    "its own `1/model.onnx`")
        return "`python` backend, `1/model.py`"

    any_stage = {m: s for s in STAGES.values() for m in s.triton.models}
    return markdown(("model", "on the lab node", "locally (`make lab`, `servelab triton up`)"), [
        (f"`{model}`", runner(base_config(MODELS_STAGING, model)), runner(effective_config(
            any_stage[model], model, kind="cpu", onnxruntime=False, repository=MODELS_STAGING))) for model in ALL_MODELS])


def lab_stages() -> str:
    """The stages `servelab lab --full` measures, those the tour (`make lab`) does, and those only the node runs."""
    notes = {TritonAdapter.STAND_IN: " (**LOCAL STAND-IN** for the ONNX Runtime backend)",
             RayAdapter.STAND_IN: " (**LOCAL STAND-IN**: the Ray nodes are processes on this machine)", "": ""}
    table = markdown(("stage", "what it serves", "in `make lab` (else `--full` only)"), [
        (f"`{s.name}`", s.about + notes[adapter_of(s).stand_in(s)], "yes" if s.tour else "") for s in LAB_STAGES])
    left_out = [f"`{s.name}` ({s.about})" for s in CATALOGUE if not s.in_lab]
    return table + (f"\n\nOnly on the node: {', '.join(left_out)}." if left_out else "")


def lab_requirements() -> str:
    """What `make lab` needs: our Python, and the platform and Pythons nvidia-pytriton's tritonserver runs on."""
    # Deferred: pip's, not a declared dependency; only this check needs it.
    from packaging.specifiers import SpecifierSet

    from servelab.tools.gpu_constraints import pins  # deferred, with packaging

    requires = SpecifierSet(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    wheel = importlib.metadata.distribution("nvidia-pytriton")
    glibc, arch = re.search(r"manylinux_(\d+_\d+)_(\w+)", wheel.read_text("WHEEL") or "").groups()
    stubs = Path(importlib.util.find_spec("pytriton").submodule_search_locations[0]) / "tritonserver" / "python_backend_stubs"
    pythons = sorted((v.name for v in stubs.iterdir() if v.name in requires), key=lambda v: tuple(map(int, v.split("."))))
    # The bundled tritonserver has stubs for more Pythons than the pins install on: the claim is the
    # version CI runs (`.ci/run`, `make test`), not every stub's.
    return prose(BLOCKS.lab_requirements(arch.replace("_", "-"), glibc.replace("_", "."), pythons[0],
                                         " and ".join(pythons[1:]), pins(REPO_ROOT / "constraints.txt")["numpy"]))


LAB_RUN = REPO_ROOT / "docs" / "records" / "make-lab.json"  # a copy of a tour's results/run.json


def lab_time() -> str:
    """How long the default `make lab` took, from the run recorded in docs/records/make-lab.json."""
    return prose(BLOCKS.lab_time(LabRun.read(LAB_RUN), minutes))


def lab_plans() -> str:
    """The loads of the tour (`make lab`) and of `--full`, from ``servelab.run.plan.Plan``."""

    def pct(values) -> str:
        said = [f"{100 * v:g} %" for v in values]
        return ", ".join(said[:-1]) + f" and {said[-1]}" if len(said) > 1 else said[0]

    def perf(p: Plan) -> str:
        stages = ", ".join(f"`{s}`" for s in p.perf_analyzer) if p.perf_analyzer else "every Triton stage"
        return stages + "; one at a time and at the capacity's senders, the same windows"

    def windows(p: Plan) -> str:
        w = p.windows
        said = f"a {p.warmup_s:g} s warm-up, then {Windows.COUNT} windows of {w.window_s:g} s"
        return said + (", whatever their spread" if not w.tested else
                       f" within {w.stability_pct:g} % of each other, at most {w.max_trials} windows")

    def sweep(p: Plan) -> str:
        s = p.sweep
        cap = f"{s.cap} senders" if s.cap else f"{CAP_PER_CORE} × the cores"
        levels = f", at most {s.max_levels} levels" if s.max_levels else ""
        return (f"one at a time, then {s.start}, {2 * s.start}, ... senders until two doublings in a row add less "
                f"than {100 * s.growth:g} % (the knee) or {cap}{levels}")

    plans = (Plan.tour(), Plan.full())
    rows = [("every closed-loop run", windows),
            ("capacity: the highest throughput of a concurrency sweep", sweep),
            ("each lesson's two stages, alternating", lambda p: f"{p.rounds} rounds, each run {Windows.COUNT} windows "
                                                             f"of {p.round_window_s:g} s"),
            ("Poisson arrivals, of the capacity", lambda p: f"{pct(p.poisson_fractions)}, {p.poisson_seconds:g} s each"),
            ("requests of 16 images, one at a time, where the stage batches", lambda p: "one closed-loop run"),
            ("perf_analyzer after servelab's client, same load", perf),
            ("Ray: worker node killed mid-load; step load (`ray-auto`)",
             lambda p: f"{p.failure_s:g} s; {' + '.join(f'{s:g}' for s in p.steps_s)} s")]
    return markdown(("", "the tour (`make lab`)", "`--full`"), [(what, *map(cell, plans)) for what, cell in rows])


def lab_summary() -> str:
    """What the recorded `make lab` showed: its report's first screen."""
    return "\n".join(line for line in LabRun.read(LAB_RUN).summary if not line.startswith("## ")).strip()


def family_stages(family: str) -> str:
    """How many stages the catalogue has in ``family``, and their names in the order it teaches them:
    a count typed in prose went stale when a stage was added."""
    names = list(of_family(family))  # type: ignore[arg-type]
    return f"The catalogue (`servelab/core/catalogue.py`) has {len(names)} {FAMILIES[family].title} stages: " + ", ".join(f"`{n}`" for n in names) + "."


GPU_RECORD = REPO_ROOT / "docs" / "records" / "gpu-h100-2026-11-24.toml"  # the first GPU run's figures


def gpu_figures() -> set[tuple[float, str]]:
    """(value, unit) of every figure the H100 record holds."""
    record = tomllib.loads(GPU_RECORD.read_text(encoding="utf-8"))
    return {(f["value"], f["unit"]) for step in record.values() if isinstance(step, dict) for f in step["figures"]}


def gpu_record(key: str) -> str:
    """One step of the H100 run, as a sentence: what ran, its figures, where the record and its log are."""
    record = tomllib.loads(GPU_RECORD.read_text(encoding="utf-8"))
    step = record[key]
    figures = "; ".join(f"{f['measures']} {f['value']:g} {f['unit']}" for f in step["figures"])
    return prose(BLOCKS.gpu_record(record, step, figures, GPU_RECORD.name))


SIMULATED_GPU_RECORD = REPO_ROOT / "docs" / "records" / "simulated-gpu-2cpu.json"  # benchmarks/shared_batcher.py's
GPU_H200_RECORD = REPO_ROOT / "docs" / "records" / "gpu-h200-2026-11-28.toml"  # where its flat cost comes from


def simulated_gpu() -> str:
    """What batching did behind the GPU-shaped stand-in: each service's median over its record's rounds, the ratios."""
    run = json.loads(SIMULATED_GPU_RECORD.read_text(encoding="utf-8"))
    h200 = tomllib.loads(GPU_H200_RECORD.read_text(encoding="utf-8"))
    batch_1 = next(f["value"] for f in h200["fp16-vs-fp32"]["figures"] if f["measures"] == "fp32, batch 1")
    cores, cpus = (int(re.search(pattern, text)[1]) for pattern, text in ((r"(\d+) Xeon cores", h200["machine"]),
                                                                            (r"(\d+) CPUs", run["machine"])))
    head = prose(BLOCKS.simulated_gpu(run, SIMULATED_GPU_RECORD.name, batch_1, GPU_H200_RECORD.name, cores, cpus))
    rows = []
    for name in run["rounds"][0]:
        rps, batch, cpu = (median(r[name][key] for r in run["rounds"]) for key in ("rps", "mean_batch", "cpu_ms_per_request"))
        busy = median(r[name]["rps"] / r[name]["mean_batch"] * run["simulated_gpu_ms"] / 10 for r in run["rounds"])
        rows.append((name, f"{rps:.1f}", f"{batch:.2f}", f"{busy:.0f} %", f"{cpu:.1f}"))
    ratios = [(f"{r['top']} ÷ {r['bottom']}", ", ".join(f"{x:.2f}" for x in r["each_round"]), f"**{r['median']:.2f}×**",
               f"≥ {r['aim']:g}×") for r in run["ratios"]]
    return "\n\n".join([head, markdown(("service", "req/s", "mean batch", "simulated GPU busy",
                                         "service CPU ms per request"), rows, "lrrrr"),
                         markdown(("ratio of req/s", "each round", "median", "aim"), ratios, "llrr")])


def original_figure(key: str, *measures: str) -> str:
    """One figure of servelab/data/original_lab.toml, as a sentence writes it (``18.7 ms``)."""
    step = original_lab.step(key)
    wanted = " ".join(measures)
    if not (found := [f for f in step.figures if f.measures == wanted]):
        raise LookupError(f"{key} has no figure {wanted!r}; it has: {', '.join(f.measures for f in step.figures)}")
    return f"{found[0].value:g} {found[0].unit}"


def class_rubric() -> str:
    """The rubric's points (``servelab class grade``) and each graded ratio's predictions and range, from the records."""
    rows = [("no finding from the check, held to the student's leases", "—", "—", "—", str(CHECK_POINTS)),
            ("each stage of the core path (`CORE_PATH`) with all its runs", "—", "—", "—", f"{STAGE_POINTS} each")]
    for g in RUBRIC:
        (low, high), said = g.bounds(), g.predictions()
        p100 = f"{said['P100, original lab']:.2f}× ({' ÷ '.join(g.p100)})" if g.p100 else "—"
        h200 = f"{said['H200 run']:.2f}×" if "H200 run" in said else "—"
        rows.append((f"`{g.pair.rstrip(',')}` ({g.lesson})", p100, h200, f"{low:.2f}–{high:.2f}×", f"{g.points}, half "
                     "outside the range on the side the notebooks teach"))
    return markdown(("what", "P100: the original lab's figures", "H200 run", "range (a prediction)", "points"), rows)


GENERATORS: dict[str, Callable[..., str]] = {
    "class-rubric": class_rubric,
    "excerpt": excerpt,
    "stage-config": stage_config,
    "triton-models": triton_models,
    "lab-stages": lab_stages,
    "lab-requirements": lab_requirements,
    "lab-time": lab_time,
    "lab-summary": lab_summary,
    "lab-plans": lab_plans,
    "original-lab": lambda key: original_lab.step(key).sentence(),
    "original-figure": original_figure,
    "family-stages": family_stages,
    # Deferred, not a circle: lease_plan reads the notebooks this module writes into.
    "lease-plan": lambda: importlib.import_module("servelab.tools.lease_plan").plan_table(),
    "gpu-record": gpu_record,
    "simulated-gpu": simulated_gpu,
}


def generate(spec: str) -> str:
    kind, *args = spec.split()
    if kind not in GENERATORS:
        raise ValueError(f"unknown generated part {kind!r}; known: {', '.join(GENERATORS)}")
    return GENERATORS[kind](*args)


def expand(text: str) -> str:
    """``text`` with every generated part rewritten from the project as it is now."""
    def part(m: re.Match) -> str:
        body = generate(m["spec"])
        if not m["newline"]:
            if "\n" in body:
                raise ValueError(f"generated part {m['spec']!r} is inline (on one line) but spans lines")
            if not m.string[m.string.rfind("\n", 0, m.start()) + 1:m.start()].strip():
                # CommonMark starts an HTML block at a line that begins with <!--: the sentence would break.
                raise ValueError(f"inline generated part {m['spec']!r} begins its line: put a word before it")
        return f"{m['start']}{body}{m['newline'] or ''}{m['end']}"

    return BLOCK.sub(part, text)


def specs(text: str) -> list[str]:
    return [m["spec"] for m in BLOCK.finditer(text)]
