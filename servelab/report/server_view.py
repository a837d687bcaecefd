"""The report's Prometheus section: the servers' own view of each run beside the load generator's."""

from typing import Any

from servelab.core.tables import markdown as markdown_table
from servelab.core.tables import num
from servelab.measure.monitoring.run_series import MIN_RATE_REQUESTS, RATE_TOLERANCE, agreements
from servelab.measure.records import Record
from servelab.report.plots import figure

COLUMNS = ("stage", "tool", "load", "requests client", "requests server", "counts", "req/s client", "req/s server",
           "server span s", "ratio", "rates")

PANELS = (  # panel title, the series drawn in it (by name, as run_series names them), client figure
    ("request rate (req/s)", ("request rate (req/s)",), "throughput"),
    ("latency (ms)", ("p50 (ms)", "p99 (ms)", "mean latency (ms)"), "p50"),
    ("queue vs compute (ms)", ("queue (ms)", "compute (ms)"), None),
    ("mean batch", ("mean batch",), None),
    ("machine", ("CPU busy (%)", "GPU utilization (%)"), None),
)


def section(records: list[Record]) -> dict[str, Any] | None:
    """The Prometheus section of ``report-tables.md.j2``; None where no run had Prometheus."""
    if not (with_prom := [r for r in records if r.prometheus is not None]):
        return None
    found = agreements(records)
    verdict = {True: "agree", False: "**DIFFER**", None: "-"}
    rows = [[a.stage, a.tool, a.load, num(a.client_requests, 0), num(a.server_requests, 0), verdict[a.counts_agree],
             num(a.client_rps), num(a.server_rps), num(a.server_span_s), num(a.rate_ratio, 3), verdict[a.rates_agree]]
            for a in found]
    # The distinct notes of the runs' queries (each record's note joins several with "; ").
    notes = sorted({part for r in with_prom if r.prometheus.note for part in r.prometheus.note.split("; ")})
    return {"notes": "; ".join(notes), "runs": len(found), "tolerance": RATE_TOLERANCE,
            "min_requests": MIN_RATE_REQUESTS, "table": found and markdown_table(COLUMNS, rows, "lllrrlrrrrl"),
            "disagree": sum(a.counts_agree is False or a.rates_agree is False for a in found)}


def plot(records: list[Record], out) -> bool:
    """Every run's range-query series end to end; dashed: the client's own figure for that run."""
    if not (runs := [r for r in records if r.prometheus is not None and r.prometheus.series and not r.failed]):
        return False
    fig, axes = figure(len(PANELS), 1, width=12, height=2.4, legend_room=0)
    axes = axes[:, 0]
    offset, drawn = 0.0, set()
    for r in runs:
        p = r.prometheus
        length = (p.end_unix - p.start_unix) if p.end_unix and p.start_unix else 0.0
        for ax, (title, names, client) in zip(axes, PANELS):
            for i, name in enumerate(names):
                if points := p.series.get(name):
                    ax.plot([offset + t for t, _ in points], [v for _, v in points], ".-", lw=1, ms=3,
                            color=f"C{i}", label=None if name in drawn else name)
                    drawn.add(name)
            value = {"throughput": r.stats.throughput_rps, "p50": r.stats.latency.p50_ms}.get(client or "")
            if value is not None and length:
                ax.hlines(value, offset, offset + length, colors="black", linestyles="dashed", lw=0.8,
                          label=None if f"client {client}" in drawn else f"client {client} (servelab load)")
                drawn.add(f"client {client}")
            ax.axvline(offset, color="grey", lw=0.4)
        axes[0].text(offset, 1.0, f" {r.stage} {r.tool[:4]}: {r.load.label()}", fontsize=5, rotation=90,
                     va="top", ha="left", transform=axes[0].get_xaxis_transform())
        offset += max(length, p.step_s or 0.5) + 0.5
    for ax, (title, _, _) in zip(axes, PANELS):
        ax.set_ylabel(title, fontsize=8)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="x-small", loc="upper right")
    axes[0].set_title("Prometheus range queries over each run (runs end to end)", fontsize=9)
    axes[-1].set_xlabel("seconds of measured windows, runs placed end to end")
    fig.savefig(out, dpi=110)
    return True
