"""The report (``servelab report``): records (JSON lines from ``servelab load`` / ``servelab lab``) ->
``results/report.md``, which opens with the lessons (``servelab.report.lessons``), each stage's capacity and the
curve its sweep measured, then the plots and the short sections; and ``results/report-tables.md``, the long
tables (a row per run, the two clients, the servers' own counts, the warnings). Their prose and the order of
their sections are Jinja2 templates (``servelab/data/report.md.j2``, ``report-tables.md.j2``); the sections'
tables, lines and plots (matplotlib, Agg; each only where the records hold its data) come from here."""

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from servelab.core import tables
from servelab.core.hardware import describe, int8_compute
from servelab.core.settings import get_settings
from servelab.core.tables import num
from servelab.measure.fractions import CAPACITY, CLIENT_BOUND, capacity, client_bound_note, swept
from servelab.measure.limit import Limit, against_limit, limit_markdown, simple_app_line
from servelab.measure.records import DEFAULT_RECORDS, Record
from servelab.report import TEMPLATES, compare, lessons, plots, precision, server_view, timelines
from servelab.servers.triton.configs import served_line

COLUMNS = ("stage", "tool", "load", "offered req/s", "batch", "ok", "errors", "p50 ms", "p95 ms", "p99 ms", "req/s",
           "img/s", "queue ms", "service ms", "queue share", "mean batch", "stand-in", "runs on", "client CPU ms/req")
MAX_BATCH_RUNS = 8
TABLES = "report-tables.md"  # the long tables, beside report.md


def _errors(record: Record) -> str:
    if record.failed:
        return "FAILED"
    if not record.stats.errors:
        return "0" if record.stats.requests is not None else "-"
    return f"{record.stats.error_count} ({', '.join(f'{kind} {n}' for kind, n in record.stats.errors.items())})"


def summary_rows(records: list[Record]) -> list[dict[str, str]]:
    rows = []
    for r in records:
        b, lat = r.breakdown, r.stats.latency
        share = b.queue_share if b else None
        rows.append({
            "stage": r.stage, "tool": "perf_analyzer" if r.tool == "perf_analyzer" else "servelab",
            "load": r.load.label(), "offered req/s": num(r.stats.offered_rps), "batch": str(r.batch),
            "ok": "-" if r.stats.successes is None else str(r.stats.successes), "errors": _errors(r),
            "p50 ms": num(lat.p50_ms), "p95 ms": num(lat.p95_ms), "p99 ms": num(lat.p99_ms),
            "req/s": num(r.stats.throughput_rps) + (f" ({CLIENT_BOUND})" if r.client_bound else ""),
            "img/s": num(r.stats.items_per_s),
            "queue ms": num(b.queue_ms if b else None), "service ms": num(b.service_ms if b else None),
            "queue share": "-" if share is None else f"{100 * share:.0f}%",
            "mean batch": num(b.mean_batch_size if b else None, 2), "stand-in": "yes" if r.stand_in else "no",
            "runs on": r.config.get("runs_on", "-"),
            "client CPU ms/req": num(r.client.cpu_ms_per_request if r.client else None, 2),
        })
    return rows


def summary_table(records: list[Record]) -> str:
    """Fixed-width text table (what ``servelab load`` prints after its runs)."""
    return tables.text(COLUMNS, [[row[c] for c in COLUMNS] for row in summary_rows(records)])


def markdown_table(records: list[Record]) -> str:
    return tables.markdown(COLUMNS, [[row[c] for c in COLUMNS] for row in summary_rows(records)])


def _plot_batches(records: list[Record], out: Path) -> bool:
    runs = [r for r in records if r.breakdown and r.breakdown.batch_sizes]
    # Runs where the server actually combined requests tell the story; all-ones runs only pad it.
    if not (runs := sorted(runs, key=lambda r: set(r.breakdown.batch_sizes) == {1})[:MAX_BATCH_RUNS]):
        return False
    sizes = sorted({b for r in runs for b in r.breakdown.batch_sizes})
    fig, [[ax]] = plots.figure(1, 1, width=8.0, height=3.6, legend_room=0)
    width = 0.8 / len(runs)
    for i, r in enumerate(runs):
        hist, tool = r.breakdown.batch_sizes, " (perf_analyzer)" * (r.tool == "perf_analyzer")
        total = sum(hist.values())
        ax.bar([s + (i - (len(runs) - 1) / 2) * width for s in sizes], [hist.get(s, 0) / total for s in sizes],
               width, label=f"{r.stage}{tool}{f' b={r.batch}' * (r.batch > 1)}, {r.load.label()} "
                            f"(mean {num(r.breakdown.mean_batch_size, 2)})")
    ax.set(xticks=sizes, xlabel="batch size formed on the server", ylabel="fraction of executions",
           title="Server-side batch sizes")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize="x-small")
    fig.savefig(out, dpi=110)
    return True


def _plot_utilization(records: list[Record], out: Path) -> bool:
    """All runs end to end on one time axis, like watching nvtop/htop through the whole session."""
    if not (runs := [r for r in records if r.monitors and r.monitors.t_s]):
        return False
    have_gpu = any(r.monitors.gpus for r in runs)
    panels = {"cpu": "CPU %", **({"gpu": "GPU util %", "gpu_mem": "GPU memory (MiB)"} if have_gpu else {}),
              **({"rss": "server RSS (MiB)"} if any(r.monitors.rss_mib for r in runs) else {})}  # name -> y label
    fig, axes = plots.figure(len(panels), 1, width=11.0, height=2.6, legend_room=0)
    ax_of = {name: axes[i][0] for i, name in enumerate(panels)}
    for name, label in panels.items():
        ax_of[name].set_ylabel(label)
        if name in ("cpu", "gpu"):  # percentages
            ax_of[name].set_ylim(0, 105)
    offset = 0.0
    for r in runs:
        m = r.monitors
        t = [offset + x for x in m.t_s]
        ax_of["cpu"].plot(t, [sum(s) / len(s) for s in m.cpu_pct], ".-", color="tab:blue", lw=1, ms=3)  # mean
        ax_of["cpu"].plot(t, [max(s) for s in m.cpu_pct], ".-", color="tab:blue", lw=0.6, ms=2, alpha=0.4)  # busiest
        for g in m.gpus:
            ax_of["gpu"].plot(t[:len(g.util_pct)], g.util_pct, ".-", color=f"C{g.index % 10}", lw=1, ms=3)
            ax_of["gpu_mem"].plot(t[:len(g.mem_used_mib)], g.mem_used_mib, ".-", color=f"C{g.index % 10}", lw=1, ms=3)
        if m.rss_mib:
            ax_of["rss"].plot(t[:len(m.rss_mib)], m.rss_mib, ".-", color="tab:green", lw=1, ms=3)
        for ax in ax_of.values():
            ax.axvline(offset, color="grey", lw=0.5)
        ax_of["cpu"].text(offset, 102, f" {r.stage}: {r.load.label()}", fontsize=6, va="top", ha="left", rotation=90)
        offset = t[-1] + m.interval_s
    note = "" if have_gpu else f"; no GPU samples: {runs[0].monitors.gpu_note or 'no GPU'}"
    ax_of["cpu"].set_title(f"CPU utilization, mean of cores (dark) and busiest core (light){note}", fontsize=9)
    axes[-1][0].set_xlabel("time across runs (s; runs placed end to end)")
    fig.savefig(out, dpi=110)
    return True


PLOTS = (
    ("latency_throughput_vs_concurrency.png", "Latency and throughput vs concurrency, per family",
     plots.sweep_concurrency),
    ("latency_throughput_vs_rate.png", "Open loop: latency and throughput vs offered load as a fraction of each "
     "stage's capacity", plots.sweep_rate),
    ("latency_cdf.png", "Latency CDFs per family at comparable loads", plots.cdf),
    ("batch_sizes.png", "Server-side batch-size histogram", _plot_batches),
    ("utilization.png", "CPU / GPU / memory utilization timeline", _plot_utilization),
    ("prometheus_series.png", "The servers' own metrics (Prometheus range queries) beside the client's",
     server_view.plot),
)


def render_report(records: list[Record], out_dir: Path = DEFAULT_RECORDS.parent, sources: Sequence[Path] = (),
                  skipped: Mapping[str, str] | None = None, limit: Limit | None = None) -> Path:
    """Write ``out_dir/report.md``, ``report-tables.md`` and the plots; returns the report's path. ``skipped``: parts
    of the lab this environment could not run (``servelab.run.lab.preflight``); ``limit``: this machine's."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    now, where = dt.datetime.now(dt.timezone.utc), ", ".join(f"`{p}`" for p in sources) or "the given records"
    generated = f"Generated {now.isoformat(timespec='seconds')} from {len(records)} run records ({where})."
    warnings = [f"- {r.stage} [{r.load.label()}]: {w}" for r in records for w in r.warnings]
    found, model_dir = precision.rows(records), get_settings().model_dir
    machines: dict[str, dict] = {}  # each host's first record's machine (report.md.j2 writes it)
    for m in (r.machine for r in records if r.machine):
        machines.setdefault(m.get("hostname", "?"), m)
    path = out_dir / "report.md"
    path.write_text(TEMPLATES.get_template("report.md.j2").render(
        generated=generated, lessons=lessons.summary(records, TABLES), capacity=capacity_section(records), limit=limit,
        limit_parts=limit and [limit_markdown(limit), against_limit(records, limit), simple_app_line(limit)],
        plots=[(name, title) for name, title, plot in PLOTS if plot(records, out_dir / name)], tables=TABLES,
        precision=found and precision.markdown(found, model_dir), model_dir=model_dir,
        **timelines.sections(records, out_dir),
        skipped=skipped, failed=[r for r in records if r.failed], warnings=warnings,
        stand_ins=sorted({f"**{r.stage}**: {r.stand_in}" for r in records if r.stand_in}),
        hardware=hardware_section(records), machines=machines.values()), encoding="utf-8")
    pairs = compare.pairs(records)
    (out_dir / TABLES).write_text(TEMPLATES.get_template("report-tables.md.j2").render(
        generated=generated, runs=markdown_table(records), client_bound=CLIENT_BOUND, tolerance=compare.TOLERANCE,
        pairs=pairs and compare.markdown(pairs), prometheus=server_view.section(records), warnings=warnings),
        encoding="utf-8")
    return path


def capacity_section(records: list[Record]) -> list[str]:
    """The table of each stage's capacity and the curve its sweep measured, where the records hold one ([]: none)."""
    rows = []
    for stage in dict.fromkeys(r.stage for r in records if r.tool == "servelab"):
        if not (found := swept(records, stage)):
            continue
        said = found.config[CAPACITY]
        points = " · ".join(f"{p['concurrency']}: {num(p['throughput_rps'])} / {num(p['p50_ms'])} / {num(p['p99_ms'])}"
                            for p in said["curve"])
        at = "one at a time" if said["concurrency"] == 1 else f"{said['concurrency']} senders"
        rows.append((stage, num(said["throughput_rps"]) + client_bound_note(capacity(records, stage)), at, points,
                     said["stopped"]))
    return rows and [tables.markdown(("stage", "capacity req/s", "at", "curve (senders: req/s / p50 / p99)",
                                      "sweep ended"), rows, "lrlll")]


def hardware_section(records: list[Record]) -> dict[str, Any]:
    """The hardware and library versions the runs had, and where each stage really ran: every report's header
    (``report.md.j2`` writes it)."""
    stacks = {json.dumps(r.machine["stack"], sort_keys=True) for r in records if r.machine.get("stack")}
    # Where INT8 ran on the CPU: what that CPU can do, from the flags the records kept (none kept: not said).
    flags = {tuple(r.machine["cpu_flags"]) for r in records
             if r.machine.get("cpu_flags") is not None and r.config.get("device") != "gpu"}
    runs_on = {r.stage: r.config["runs_on"] for r in records if r.config.get("runs_on")}
    return {"stacks": [line for stack in sorted(stacks) for line in describe(json.loads(stack))],
            "int8": [int8_compute(f).sentence("the CPU that ran these runs", "there") for f in sorted(flags)],
            "devices": sorted({str(r.config.get("device")) for r in records if r.config.get("device")}),
            "runs_on": runs_on and tables.markdown(("stage", "runs on (read back from the server)"),
                                                   list(runs_on.items())),
            "triton": triton_config_table(records)}


def triton_config_table(records: list[Record]) -> str:
    """What Triton ran for each Triton stage, as it reported after the load (the records' ``triton_config``): a
    stage whose config was not its own was refused, never measured; "" where no record says."""
    ran = {(r.stage, model): served_line(view) for r in records
           for model, view in (r.config.get("triton_config") or {}).items() if isinstance(view, dict)}
    return ran and tables.markdown(("stage", "model", "config Triton ran (GET /v2/models/<model>/config)"),
                                   [(stage, model, line) for (stage, model), line in ran.items()])
