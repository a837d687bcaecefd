"""The report's comparison plots as small multiples: a row of panels per stage family, each stage in one colour in
every plot and every run, legends beside the panels, never over them. Open-loop rates are a fraction of each stage's
own capacity, so that stages of very different speed share one axis. servelab's client only, one image per request:
perf_analyzer's runs and batched requests are in the tables."""

from collections import Counter, defaultdict
from pathlib import Path

from servelab.core.catalogue import CATALOGUE, FAMILIES
from servelab.measure.fractions import capacity
from servelab.measure.records import Record

# Twelve colours told apart at a glance; a family has at most eleven stages.
PALETTE = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray",
           "tab:olive", "tab:cyan", "black", "gold")
_FAMILY = {s.name: s.family for s in CATALOGUE}  # a stage outside the catalogue (a benchmark's) has none


def colour(stage: str, others: list[str] = ()) -> str:
    """The stage's colour: its place in its family in the catalogue (a stage outside it: its place among
    ``others``, the records' other such stages, sorted)."""
    place = ([s.name for s in CATALOGUE if s.family == _FAMILY[stage]] if stage in _FAMILY
             else sorted(set(others) | {stage})).index(stage)
    return PALETTE[place % len(PALETTE)]


def _ours(records: list[Record]) -> list[Record]:
    return [r for r in records if r.tool == "servelab" and r.batch == 1 and not r.failed and not r.config.get("run")
            and not r.load.phases]


def _rows(records: list[Record]) -> list[tuple[str, str, list[Record]]]:
    """(family, title, its records) for each family with records, in FAMILIES' order, then the stages of no
    family of the catalogue (a benchmark's)."""
    by: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by[_FAMILY.get(r.stage, "")].append(r)
    rows = [(f.name, f.title) for f in FAMILIES.values()] + [("", "other stages")]
    return [(f, title, by[f]) for f, title in rows if by[f]]


def figure(rows: int, cols: int, width: float = 4.6, height: float = 3.2, legend_room: float = 2.2, **subplots):
    """``rows`` x ``cols`` panels (always a 2-D array), ``legend_room`` inches wider for legends beside them."""
    from matplotlib.figure import Figure  # the Agg canvas is used by savefig; no GUI, no pyplot state

    fig = Figure(figsize=(width * cols + legend_room, height * rows), layout="constrained")
    return fig, fig.subplots(rows, cols, squeeze=False, **subplots)


def _log_ms(axis) -> None:
    """A log scale of milliseconds labelled in plain numbers (10, 100, 1000), no crowded minor labels."""
    # Deferred: matplotlib's import costs a second; only plotting needs it.
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    axis.axes.set_xscale("log") if axis is axis.axes.xaxis else axis.axes.set_yscale("log")
    axis.set_major_formatter(ScalarFormatter())
    axis.set_minor_formatter(NullFormatter())


def _legend(*axes) -> None:
    """The stages' legend beside the last of ``axes`` (a row's panels), outside the data: each label once."""
    handles = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    if handles:
        axes[-1].legend(handles.values(), handles.keys(), fontsize="x-small", loc="upper left",
                        bbox_to_anchor=(1.02, 1.0), borderaxespad=0)


def sweep_concurrency(records: list[Record], out: Path) -> bool:
    """Latency and throughput against closed-loop senders, one row per family."""
    runs = [r for r in _ours(records) if r.load.mode in ("sequential", "closed")]
    if max(Counter(r.stage for r in runs).values(), default=0) < 2:  # no stage has a curve
        return False
    rows = _rows(runs)
    others = [r.stage for r in runs if r.stage not in _FAMILY]
    fig, axes = figure(len(rows), 2)
    for (fam, title, fam_runs), (lat_ax, tput_ax) in zip(rows, axes):
        for stage in dict.fromkeys(r.stage for r in fam_runs):
            points = sorted((r for r in fam_runs if r.stage == stage), key=lambda r: r.load.concurrency)
            xs, c = [r.load.concurrency for r in points], colour(stage, others)
            lat_ax.plot(xs, [r.stats.latency.p50_ms for r in points], "-o", color=c, ms=4)
            lat_ax.plot(xs, [r.stats.latency.p99_ms for r in points], ":", color=c)
            tput_ax.plot(xs, [r.stats.throughput_rps for r in points], "-o", color=c, ms=4, label=stage)
        lat_ax.set_title(f"{title}: latency, p50 (solid) and p99 (dotted)", fontsize=9)
        tput_ax.set_title(f"{title}: throughput", fontsize=9)
        lat_ax.set_ylabel("latency (ms, log)")
        _log_ms(lat_ax.yaxis)
        tput_ax.set(ylabel="successful requests/s", ylim=(0, None))
        for ax in (lat_ax, tput_ax):
            ax.set_xscale("log", base=2)
            ax.grid(alpha=0.3)
        _legend(tput_ax)
    for ax in axes[-1]:
        ax.set_xlabel("closed-loop senders (concurrency)")
    fig.savefig(out, dpi=100)
    return True


def _fraction(r: Record, caps: dict[str, float]) -> float | None:
    cap = caps.get(r.stage)
    return r.load.rate / cap if cap and r.load.rate else None


def sweep_rate(records: list[Record], out: Path) -> bool:
    """Open loop: latency and throughput against the offered rate as a fraction of each stage's capacity."""
    ours = _ours(records)
    if not (runs := [r for r in ours if r.load.mode == "open" and r.load.rate]):
        return False
    caps = {s: run.stats.throughput_rps for s in {r.stage for r in ours} if (run := capacity(ours, s))}
    # A stage measured only in open loop (a notebook's rate step) has no capacity to divide by: then
    # every stage is drawn against the offered rate itself, in req/s.
    if not (relative := all(r.stage in caps for r in runs)):
        caps = {r.stage: 1.0 for r in runs}
    rows = _rows(runs)
    others = [r.stage for r in runs if r.stage not in _FAMILY]
    fig, axes = figure(len(rows), 2)
    for (fam, title, fam_runs), (lat_ax, tput_ax) in zip(rows, axes):
        for (stage, arrivals) in dict.fromkeys((r.stage, r.load.arrivals) for r in fam_runs):
            points = sorted((r for r in fam_runs if r.stage == stage and r.load.arrivals == arrivals),
                            key=lambda r: r.load.rate)
            xs, c = [_fraction(r, caps) for r in points], colour(stage, others)
            style = "--s" if arrivals == "constant" else "-o"
            label = stage + (" (constant arrivals)" if arrivals == "constant" else "")
            lat_ax.plot(xs, [r.stats.latency.p50_ms for r in points], style, color=c, ms=4)
            lat_ax.plot(xs, [r.stats.latency.p99_ms for r in points], ":x", color=c, ms=4)
            tput_ax.plot(xs, [r.stats.throughput_rps / caps[stage] for r in points], style, color=c, ms=4, label=label)
        top = 1.0 if relative else max(r.load.rate for r in fam_runs)
        tput_ax.plot([0, top], [0, top], color="grey", lw=0.8, label="throughput = offered")
        lat_ax.set_title(f"{title}: latency, p50 (o) and p99 (x)", fontsize=9)
        tput_ax.set_title(f"{title}: throughput" + (" ÷ capacity" if relative else ""), fontsize=9)
        lat_ax.set_ylabel("latency (ms, log)")
        _log_ms(lat_ax.yaxis)
        tput_ax.set_ylabel("completed req/s" + (" ÷ capacity" if relative else ""))
        for ax in (lat_ax, tput_ax):
            ax.set_xlim(0, 1.05 * top)
            ax.grid(alpha=0.3)
        tput_ax.set_ylim(0, 1.1 * top)
        _legend(tput_ax)
    for ax in axes[-1]:
        ax.set_xlabel("offered rate ÷ the stage's capacity" if relative else "offered rate (req/s)")
    fig.savefig(out, dpi=100)
    return True


def _cdf_columns(runs: list[Record], caps: dict[str, float]) -> list[tuple[str, dict[str, Record]]]:
    """(title, stage -> its run) for: one at a time; each stage at its capacity; Poisson at the highest fraction
    of capacity offered (each stage's own run nearest it)."""
    columns = [("one request at a time", {r.stage: r for r in runs if r.load.mode == "sequential"})]
    at_capacity = {s: run for s in dict.fromkeys(r.stage for r in runs)
                   if (run := capacity(runs, s)) and run.load.mode == "closed" and run.stats.latency.cdf_ms}
    if at_capacity:  # each stage at the top of its own sweep: the load where it serves the most
        columns.append(("at capacity (closed loop, each stage's own senders)", at_capacity))
    open_runs = [r for r in runs if r.load.mode == "open" and r.load.arrivals == "poisson"
                 and _fraction(r, caps) is not None]
    if open_runs:
        top_fraction = max(_fraction(r, caps) for r in open_runs)
        nearest = {s: min((r for r in open_runs if r.stage == s), key=lambda r: abs(_fraction(r, caps) - top_fraction))
                   for s in dict.fromkeys(r.stage for r in open_runs)}
        columns.append((f"Poisson at ≈{top_fraction:.2f} × capacity", nearest))
    return [(title, chosen) for title, chosen in columns if chosen]


def cdf(records: list[Record], out: Path) -> bool:
    """Latency CDFs: a row per family, a column per comparable load, a line per stage."""
    if not (runs := [r for r in _ours(records) if r.stats.latency.cdf_ms]):
        return False
    caps = {s: run.stats.throughput_rps for s in {r.stage for r in runs} if (run := capacity(_ours(records), s))}
    rows = _rows(runs)
    columns = _cdf_columns(runs, caps)
    others = [r.stage for r in runs if r.stage not in _FAMILY]
    fig, axes = figure(len(rows), len(columns), width=4.0)
    fractions = [p / 100 for p in range(101)]
    for (fam, title, fam_runs), row in zip(rows, axes):
        stages = set(r.stage for r in fam_runs)
        for ax, (load, chosen) in zip(row, columns):
            for stage, r in chosen.items():
                if stage in stages:
                    ax.plot(r.stats.latency.cdf_ms, fractions, color=colour(stage, others), label=stage)
            ax.set_title(f"{title}: {load}", fontsize=9)
            _log_ms(ax.xaxis)
            ax.grid(alpha=0.3)
        row[0].set_ylabel("fraction of requests")
        _legend(*row)  # every stage of the family, once, beside the row (a stage may be missing from a panel)
    for ax in axes[-1]:
        ax.set_xlabel("latency (ms, log)")
    fig.savefig(out, dpi=100)
    return True
