"""``servelab report --check RESULTS``: does a student's ``results/`` hold what the lab itself wrote on a GPU node?

A grader's check, not proof: a hand edit leaves traces (derived figures that do not follow, percentiles not those
of the latencies kept, records from two machines, a report not written from them); a CPU run edited to claim a GPU
node leaves fields that still say CPU (the execution provider, the CPUs and GPUs against the node type); records
outside the student's leases (``--lease``, which ``servelab class`` reads from Chameleon) or from another server
(``machine.instance_id``, read by the run from the node's metadata) are named. The core path (``CORE_PATH``) must be
there. Each finding is one line; bad input is a finding too, never an exception.

What it cannot prove: that a submission whose every field agrees was run by its student. Without the leases, a
classmate's records, or a laptop run edited in every field read, pass; with them, a laptop run must also be given
the student's server id and times by hand. Only ``gpu_p100``'s GPU count is recorded (``hardware.NODE_TYPES``)."""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import dropwhile, takewhile
from pathlib import Path

from servelab.core.catalogue import CORE_PATH, STAGES, TRITON
from servelab.core.hardware import NODE_TYPES, UNKNOWN_INSTANCE, node_type_of, runs_on_cpu
from servelab.core.paths import MODELS_STAGING
from servelab.core.tables import text
from servelab.measure.records import DEFAULT_RECORDS, Record, why_not
from servelab.measure.stats import latency_summary
from servelab.report.lessons import RUBRIC, findings
from servelab.report.render import TABLES, markdown_table
from servelab.servers.triton.configs import differences, meant

LEASE = dt.timedelta(hours=3)  # a student's lease: 2 h 55 min (1_create_lease), and no record outside one
REL = 1e-3  # relative tolerance of figures the record derives from others (floats, written in full)
MS = 1e-3  # ms: the 0..100 curve is rounded to 0.1 µs
KEPT_MS = 0.01  # ms: per-request latencies are rounded to 1 µs
BEFORE_WINDOW_S, AFTER_WINDOW_S = 2.0, 120.0  # started_at is written, to the second, just after the window
PERCENTILES = (("p50_ms", 50), ("p90_ms", 90), ("p95_ms", 95), ("p99_ms", 99), ("max_ms", 100))
REPORT = "report.md"
GENERATED = re.compile(r"^Generated \S+ from (\d+) run records", re.MULTILINE)
SHOWN = 3  # places named in a finding that repeats
CHECK_POINTS, STAGE_POINTS = 26, 2  # the class rubric's (docs/class.md): no finding; each stage of the core path
CLOCK_S = 60.0  # a node's clock against Chameleon's: a record this close to its lease's edge is inside it


@dataclass(frozen=True)
class Placed:
    record: Record
    line: int

    @property
    def where(self) -> str:
        return f"line {self.line} ({self.record.stage}, {self.record.load.label()})"


@dataclass
class Verdict:
    path: Path
    about: str = "nothing to check"  # the records, their machine and their times, in a phrase
    findings: list[str] = field(default_factory=list)
    windows: dict[tuple[float, float], str] = field(default_factory=dict)  # measured window -> where (copies)
    records: list[Record] = field(default_factory=list)

    def lines(self) -> list[str]:
        n = len(self.findings)
        summary = f"{self.about}: " + (f"{n} finding{'s' if n != 1 else ''}" if n else "no finding")
        return [f"{self.path}: {summary}", *(f"{self.path}: {f}" for f in self.findings)]


@dataclass(frozen=True)
class Lease:
    """One of a student's leases, as Chameleon holds it: its window (Unix s) and its servers' ids (none: unchecked)."""

    start: float
    end: float
    servers: tuple[str, ...] = ()


def leases_of(given: object) -> list[Lease]:
    """Leases from JSON (a lease file: ``servelab class status --leases``): one ``{"start", "end", "servers"}``, times ISO 8601
    or Unix seconds, or a list of them; a ValueError in one line where it is not that."""
    found = []
    for lease in given if isinstance(given, list) else [given]:
        try:
            start, end = (float(t) if isinstance(t, (int, float)) else _unix(t) for t in (lease["start"], lease["end"]))
            servers = tuple(lease.get("servers") or ())
        except (TypeError, KeyError, AttributeError):
            start = end = None
        if start is None or end is None or not all(isinstance(s, str) for s in servers):
            raise ValueError(f'a lease is {{"start": ISO 8601, "end": ISO 8601, "servers": [server id, ...]}}, '
                             f"not {str(lease)[:80]}")
        found.append(Lease(start, end, servers))
    return found


def _leased(r: Record, leases: Sequence[Lease]) -> list[str]:
    """A record against the student's leases: run within one, on a server it held (its instance's UUID)."""
    times = [t for t in (_unix(r.started_at), *(r.window_unix or ())) if t is not None]
    inside = [lease for lease in leases if all(lease.start - CLOCK_S <= t <= lease.end + CLOCK_S for t in times)]
    if leases and not inside:
        return [f"ran outside the student's leases ({'; '.join(f'{_when(a.start)} to {_when(a.end)}' for a in leases)})"]
    servers = sorted({s for lease in inside for s in lease.servers})
    ran_on = str(r.machine.get("instance_id") or UNKNOWN_INSTANCE)
    if not servers or ran_on in servers:
        return []
    if ran_on == UNKNOWN_INSTANCE:
        return ["no instance recorded (machine.instance_id), so not the student's server "
                f"({', '.join(servers)}): run it with this commit's servelab on the node"]
    return [f"ran on instance {ran_on}, not on the student's server in that lease ({', '.join(servers)})"]


def _close(a: float | None, b: float | None, rel: float = REL, abs_: float = 0.0) -> bool:
    return a is None or b is None or math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


def _unix(text: str) -> float | None:
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=dt.timezone.utc)).timestamp()


def _when(unix: float) -> str:
    return f"{dt.datetime.fromtimestamp(unix, dt.timezone.utc):%Y-%m-%d %H:%M} UTC"


def read(path: Path) -> tuple[list[Placed], list[str]]:
    """The records of a JSONL file with their line numbers, and one finding per line that is not one."""
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return [], [f"cannot read {path.name}: {type(exc).__name__}: {exc}"]
    placed, bad = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            placed.append(Placed(Record.model_validate(json.loads(line)), number))
        except (ValueError, TypeError) as exc:  # JSONDecodeError and pydantic's ValidationError are ValueErrors
            bad.append(f"{path.name} line {number} is not a servelab record ({why_not(exc)})")
    return placed, bad


def record_findings(p: Placed) -> list[str]:
    """What one record says against itself: GPU, stand-in, its figures' arithmetic, its times."""
    r, found = p.record, []
    stack = r.machine.get("stack") if isinstance(r.machine.get("stack"), dict) else {}
    if not r.machine.get("gpus"):
        found.append("no GPU in the record (machine.gpus is empty): not run on a GPU node")
    elif not stack.get("driver"):
        found.append("no NVIDIA driver in the record (machine.stack.driver)")
    # `servelab lab` records its --device; the notebooks' runs leave it out (their GPUs say where they ran).
    if r.tool == "servelab" and r.config.get("device", "gpu") != "gpu":
        found.append(f"servelab ran with device {r.config.get('device')!r}, not 'gpu'")
    elif r.machine.get("gpus") and runs_on_cpu(runs_on := str(r.config.get("runs_on") or "")):
        found.append(f"its model ran on the CPU ({runs_on}), not on the GPU the record claims")
    if r.stand_in:
        found.append(f"a stand-in, not the lab's model: {r.stand_in}")
    s, shed = r.stats, sum(r.stats.shed.values())
    if not r.failed and None not in (s.requests, s.successes) and s.requests != s.successes + s.error_count + shed:
        found.append(f"requests {s.requests} != successes {s.successes} + errors {s.error_count} + shed {shed}")
    if (not r.failed and r.tool == "servelab" and s.successes is not None and s.wall_s
            and not _close(s.throughput_rps, expected := s.successes / s.wall_s)):
        found.append(f"throughput {s.throughput_rps:.4g} req/s is not its {s.successes} successes / {s.wall_s:.4g} s "
                     f"= {expected:.4g} req/s")
    if not r.failed and s.throughput_rps > 0 and not _close(s.items_per_s, s.throughput_rps * r.batch):
        found.append(f"{s.items_per_s:.4g} img/s is not throughput {s.throughput_rps:.4g} req/s x batch {r.batch}")
    return found + _percentiles(r) + _times(r) + _triton_config(r)


def _triton_config(r: Record) -> list[str]:
    """A Triton stage's record carries the config Triton reported running (``triton_config``): the catalogue's stage
    as rendered for the record's GPUs, or Triton ran something else under the stage's name."""
    stage = STAGES.get(r.stage)
    if stage is None or stage.family != TRITON.name:  # derived stages (a bound, a cache) are checked as they load
        return []
    running = r.config.get("triton_config")
    if not isinstance(running, dict) or not running:
        return ["no config read back from Triton (config.triton_config): run it with this commit's servelab"]
    gpus = r.machine.get("gpus")
    wanted = meant(stage, kind="cpu" if r.config.get("device") == "cpu" else "gpu", onnxruntime=True,
                   repository=MODELS_STAGING, gpus=len(gpus) if isinstance(gpus, list) else 0)
    return [f"Triton did not run {r.stage}'s config: {model}: {said}" for model in wanted
            for said in differences(wanted[model], running.get(model) if isinstance(running.get(model), dict) else {})]


def _percentiles(r: Record) -> list[str]:
    lat, found = r.stats.latency, []
    shown = [(name, getattr(lat, name)) for name, _ in PERCENTILES if getattr(lat, name) is not None]
    if any(a[1] > b[1] + MS for a, b in zip(shown, shown[1:])):
        found.append("percentiles out of order: " + ", ".join(f"{n} {v:.4g}" for n, v in shown))
    if cdf := lat.cdf_ms:
        if len(cdf) != 101 or any(b < a for a, b in zip(cdf, cdf[1:])):
            found.append("the latency curve (cdf_ms) is not 101 rising percentiles")
        else:
            if off := [f"{name} {getattr(lat, name):.4g} (curve {cdf[q]:.4g})" for name, q in PERCENTILES
                       if not _close(getattr(lat, name), cdf[q], 0.0, MS)]:
                found.append("percentiles do not match the latencies kept (cdf_ms): " + ", ".join(off))
            if lat.mean_ms is not None and not cdf[0] - MS <= lat.mean_ms <= cdf[100] + MS:
                found.append(f"mean {lat.mean_ms:.4g} ms lies outside its latencies ({cdf[0]:.4g} to {cdf[100]:.4g} ms)")
    if (kept := r.per_request) and kept.latency_ms and r.stats.successes is not None:
        ok = [ms for ms, outcome in zip(kept.latency_ms, kept.outcome) if outcome == "ok"]
        if len(ok) != r.stats.successes:
            found.append(f"{r.stats.successes} successes, but {len(ok)} successful requests kept (per_request)")
        elif ok:
            # The load generator's own summary of the kept latencies (``latency_summary``), not a second one.
            again = latency_summary([ms / 1e3 for ms in ok])
            if off := [f"{name} {getattr(lat, name):.4g} (requests {getattr(again, name):.4g})" for name, _ in PERCENTILES
                       if not _close(getattr(lat, name), getattr(again, name), 1e-4, KEPT_MS)]:
                found.append("percentiles do not match the requests kept (per_request): " + ", ".join(off))
    return found


def _times(r: Record) -> list[str]:
    start = _unix(r.started_at)
    if start is None:
        return [f"started_at {r.started_at!r} is not a time"]
    if not (w := r.window_unix):  # perf_analyzer's runs record theirs since #64: else a copy would go unseen
        return ["perf_analyzer's run has no measured window (window_unix): run it with this commit's servelab"] * (
            r.tool == "perf_analyzer" and not r.failed)
    if len(w) != 2 or w[1] < w[0]:
        return [f"measured window {w} is not [start, end]"]
    found = []
    if not w[0] - BEFORE_WINDOW_S <= start <= w[1] + AFTER_WINDOW_S:
        found.append(f"started_at {r.started_at} is not just after its measured window ({_when(w[0])} to {_when(w[1])})")
    if r.stats.wall_s is not None and r.stats.wall_s > (w[1] - w[0]) * 1.05 + 1.0:
        found.append(f"wall time {r.stats.wall_s:.4g} s is longer than its measured window ({w[1] - w[0]:.4g} s)")
    return found


def _span(placed: Sequence[Placed], now: float) -> tuple[str, list[str]]:
    """When the records ran, in a phrase, and whether that fits one lease."""
    times = [t for p in placed for t in (_unix(p.record.started_at), *(p.record.window_unix or ())) if t is not None]
    if not times:
        return "no times", []
    first, last = min(times), max(times)
    hours, minutes = divmod(round((last - first) / 60), 60)
    said = f"{_when(first)} to {_when(last)} ({hours} h {minutes:02d} min)"
    found = []
    if last - first > LEASE.total_seconds():
        found.append(f"the records span {hours} h {minutes:02d} min ({_when(first)} to {_when(last)}): "
                     f"more than one lease of {LEASE.total_seconds() / 3600:g} h")
    if last > now + AFTER_WINDOW_S:
        found.append(f"a record is dated in the future ({_when(last)})")
    return said, found


def _node(gpus: tuple[str, ...], cpus: int | None) -> list[str]:
    """What a machine's GPUs and CPUs say against the node type its GPUs name (no GPU: found per record)."""
    if not gpus:
        return []
    kind = node_type_of(gpus)
    if kind is None:
        return [f"{', '.join(sorted(set(gpus)))} is not the GPU of a node type the lab runs on ({', '.join(NODE_TYPES)})"]
    found = []
    if kind.gpus is not None and len(gpus) != kind.gpus:
        found.append(f"{len(gpus)} GPUs, but a {kind.name} node has {kind.gpus}")
    if cpus is None or cpus < kind.cpus:
        found.append(f"{cpus if cpus is not None else 'no count of'} CPUs, but a {kind.name} node has at least {kind.cpus}")
    return found


def _core_path(placed: Sequence[Placed]) -> list[str]:
    """A finding naming the runs of the core path that no record (but a failed one) holds."""
    have = {(p.record.stage, p.record.load.mode) for p in placed if not p.record.failed}
    missing = []
    for stage, modes in CORE_PATH.items():
        if absent := [mode for mode in modes if (stage, mode) not in have]:
            missing.append(stage if len(absent) == len(modes) else f"{stage} ({', '.join(absent)})")
    return [f"the core path (notebooks 4, 6 and 7) is missing runs of {len(missing)} of its {len(CORE_PATH)} stages: "
            f"{', '.join(missing)}"] if missing else []


def _machines(placed: Sequence[Placed]) -> tuple[str, list[str]]:
    """The machine the records ran on, in a phrase, and a finding where they name more than one or where it is
    not the node type its GPUs name (``Record`` has checked the fields' types)."""
    seen: dict[tuple, list[int]] = defaultdict(list)
    for p in placed:
        m = p.record.machine
        seen[(tuple(m.get("gpus") or ()), (m.get("stack") or {}).get("driver"), m.get("cpu_logical"),
              m.get("instance_id"))].append(p.line)

    def said(key: tuple) -> str:
        gpus, driver, cpus, instance = key
        names = ", ".join(f"{n}x {g}" for g, n in sorted({g: gpus.count(g) for g in gpus}.items())) or "no GPU"
        return f"{names}, driver {driver or '-'}, {cpus} CPUs" + (f", instance {instance}" if instance else "")

    node = [f"{said(key)}: {what}" for key in seen for what in _node(key[0], key[2])]
    if len(seen) <= 1:
        return (said(next(iter(seen))) if seen else "no machine"), node
    parts = [f"{said(key)} (lines {', '.join(map(str, lines[:SHOWN]))}{' ...' if len(lines) > SHOWN else ''})"
             for key, lines in seen.items()]
    return "several machines", ["the records name more than one machine: " + "; ".join(parts), *node]


def report_findings(folder: Path, records: list[Record]) -> list[str]:
    """Whether the report in ``folder`` was written from these records: its count and its table of every run."""
    found = []
    for name in (REPORT, TABLES):
        try:
            text = (folder / name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            found.append(f"no readable {name} beside the records ({type(exc).__name__}); run `servelab report {folder}` "
                         "on the node")
            continue
        m = GENERATED.search(text)
        if m is None:
            found.append(f"{name} does not say how many records it was written from")
        elif int(m[1]) != len(records):
            found.append(f"{name} was written from {m[1]} records; there are {len(records)}")
        if name == TABLES:  # the rows of the first table after ``## Comparison``, less its header and rule
            lines = text.splitlines()
            at = next((i for i, line in enumerate(lines) if line.strip() == "## Comparison"), len(lines))
            table = takewhile(lambda line: line.startswith("|"),
                              dropwhile(lambda line: not line.startswith(("|", "## ")), lines[at + 1:]))
            shown, made = [line.strip() for line in table][2:], markdown_table(records).splitlines()[2:]
            extra = [row for row in shown if row not in made]
            absent = [row for row in made if row not in shown]
            for rows, what in ((extra, "matches no record"), (absent, "is missing from it")):
                if rows:
                    more = f" (and {len(rows) - 1} more)" if len(rows) > 1 else ""
                    found.append(f"{TABLES}: a row of the runs' table {what}{more}: {rows[0][:160]}")
    return found


def check(path: Path, now: float | None = None, leases: Sequence[Lease] = ()) -> Verdict:
    """Check one submission: a ``results`` folder (records.jsonl and the report), or one JSONL file (records only);
    with the student's ``leases``, each record against them too."""
    path = Path(path)
    verdict = Verdict(path)
    records_file, folder = (path / DEFAULT_RECORDS.name, path) if path.is_dir() else (path, None)
    if not records_file.is_file():
        verdict.findings = [f"no {records_file.name} in it" if folder else "no such folder or file"]
        return verdict
    placed, verdict.findings = read(records_file)
    verdict.records = [p.record for p in placed]
    if not placed:
        verdict.findings.append(f"{records_file.name} holds no record")
        return verdict
    per_record: dict[str, list[str]] = defaultdict(list)
    copies = []
    for p in placed:
        for what in record_findings(p) + _leased(p.record, leases):
            per_record[what].append(p.where)
        if len(w := p.record.window_unix or ()) == 2:  # a measured window twice: a copied record
            if (first := verdict.windows.setdefault(tuple(w), where := p.where)) is not where:
                copies.append(f"{where} is a copy of {first} (the same measured window)")
    when, span = _span(placed, dt.datetime.now(dt.timezone.utc).timestamp() if now is None else now)
    machine, machines = _machines(placed)
    # One line per finding, naming the records it holds for (the first few, then how many more).
    verdict.findings += [f"{'; '.join(places[:SHOWN])}{f' and {len(places) - SHOWN} more' * (len(places) > SHOWN)}: "
                         f"{what}" for what, places in per_record.items()] + span + machines + copies + _core_path(placed)
    if folder is not None:
        verdict.findings += report_findings(folder, [p.record for p in placed])
    verdict.about = f"{len(placed)} records of {len({p.record.stage for p in placed})} stages on {machine}, {when}"
    return verdict


def check_all(paths: Sequence[Path], now: float | None = None,
              leases: Mapping[Path, Sequence[Lease]] | None = None) -> list[Verdict]:
    """Each submission (with its student's ``leases``), and any run two share (the same measured window: a copy)."""
    verdicts = [check(p, now, (leases or {}).get(p, ())) for p in paths]
    owner: dict[tuple[float, float], tuple[Verdict, str]] = {}
    for v in verdicts:
        for window, where in v.windows.items():
            if window in owner and owner[window][0] is not v:
                first, place = owner[window]
                v.findings.append(f"{where} is also in {first.path} ({place}): the same run in two submissions")
            else:
                owner.setdefault(window, (v, where))
    return verdicts


def core_stages(records: Sequence[Record]) -> list[str]:
    """The stages of the core path whose every run is in ``records`` (a failed run is none)."""
    have = {(r.stage, r.load.mode) for r in records if not r.failed}
    return [stage for stage, modes in CORE_PATH.items() if all((stage, mode) in have for mode in modes)]


def grade(verdicts: Mapping[str, Verdict]) -> str:
    """One row per student (``servelab class grade``): findings, the core path's stages, each rubric ratio against
    its range (``in`` or ``out``; ``-``: not measured) and their points out of the rubric's automatic ones. A finding
    holds the check's points back for the instructor (``review``): a run the check doubts earns nothing on its own."""
    most = CHECK_POINTS + STAGE_POINTS * len(CORE_PATH) + sum(g.points for g in RUBRIC)
    rows = []
    for student, v in verdicts.items():
        measured = [f for _, fs in findings(v.records) for f in fs if f.ratio is not None]
        stages = core_stages(v.records)
        ratios = [(g, next((f.ratio for f in measured if f.pair.startswith(g.pair)), None)) for g in RUBRIC]
        earned = [g.points_for(x) for g, x in ratios]
        points = STAGE_POINTS * len(stages) + sum(earned)
        shown = ["-" if x is None else f"{x:.2f} {'in' if got == g.points else 'out'}"
                 for (g, x), got in zip(ratios, earned)]
        rows.append((student, str(len(v.findings)), f"{len(stages)}/{len(CORE_PATH)}", *shown,
                     f"review: {points:g} + ?" if v.findings else f"{points + CHECK_POINTS:g}/{most}"))
    return text(("student", "findings", "core stages", *(g.pair.rstrip(",") for g in RUBRIC), "points"), rows)
