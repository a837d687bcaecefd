"""Runs over time: the report's Ray Serve section (placement, step load, node failure) and its overload section."""

from pathlib import Path
from typing import Any

from servelab.core.tables import markdown, num
from servelab.measure.fractions import closed_run
from servelab.measure.records import Record, RunKind
from servelab.report.plots import figure


def plot_timelines(records: list[Record], out: Path) -> bool:
    if not (runs := [r for r in records if r.timeline is not None]):
        return False
    # A third row of running replicas only where a run sampled them (Ray's step load and node failure).
    rows = 3 if any(r.timeline.replicas for r in runs) else 2
    fig, axes = figure(rows, len(runs), width=6.0, height=2.5, legend_room=0, sharex="col")
    for col, r in enumerate(runs):
        t = r.timeline
        mid = [x + t.bin_s / 2 for x in t.t_s]
        top, middle = axes[0][col], axes[1][col]
        bottom = axes[2][col] if rows == 3 else middle
        top.plot(mid, t.throughput_rps, ".-", label="completed req/s")
        if any(t.offered_rps):
            top.step(t.t_s, t.offered_rps, where="post", color="grey", lw=1, label="offered req/s")
        top.bar(mid, t.errors, width=t.bin_s * 0.8, color="tab:red", alpha=0.6, label="failed requests")
        if any(t.shed):
            top.bar(mid, [s / t.bin_s for s in t.shed], bottom=t.errors, width=t.bin_s * 0.8, color="tab:orange",
                    alpha=0.6, label="shed req/s (503, queue policy)")
        top.set_title(f"{r.stage}: {r.config.get('run', '')} ({r.load.label()})", fontsize=9)
        top.legend(fontsize=7)
        middle.plot(mid, t.p50_ms, ".-", label="p50 ms")
        middle.plot(mid, t.p99_ms, ".-", label="p99 ms")
        middle.set_ylabel("latency ms (completed in the second)")
        middle.legend(fontsize=7)
        if rows == 3:
            bottom.step(t.replicas_t_s, t.replicas, where="post", color="tab:green")
            bottom.set(ylabel="running replicas", ylim=(0, max(t.replicas or [1]) + 1))
        bottom.set_xlabel("seconds from the start of the run")
        for ax in dict.fromkeys((top, middle, bottom)):
            for name, at in t.events.items():
                ax.axvline(at, color="tab:red", ls="--", lw=1)
                if ax is top:
                    ax.text(at, ax.get_ylim()[1], f" {name}", fontsize=7, va="top", color="tab:red")
    fig.savefig(out, dpi=110)
    return True


def _counts(by_kind: dict[str, int]) -> str:
    return ", ".join(f"{kind} {n}" for kind, n in by_kind.items()) or "0"


def _overload_row(records: list[Record], r: Record) -> list[str]:
    """Its accepted requests' p99 also as a multiple of the stage's service time (its sequential median)."""
    alone = closed_run(records, r.stage, 1)
    p99, service = r.stats.latency.p99_ms, alone.stats.latency.p50_ms if alone else None
    first = next((v for v in r.timeline.p99_ms if v is not None), None)
    last = next((v for v in reversed(r.timeline.p99_ms) if v is not None), None)
    return [r.stage, r.config.get("bound", ""),
            f"{r.load.label()} ({r.config.get('multiple', '')}× {r.config.get('capacity_rps', 0):.1f})",
            str(r.stats.successes), _counts(r.stats.shed), _counts(r.stats.errors), f"{num(first, 0)} → {num(last, 0)}",
            num(p99, 0), f"{p99 / service:.1f}×" if p99 is not None and service else "-"]


def _placement_row(r: Record) -> tuple[str, ...]:
    per_node, proxy = r.config["replicas_per_node"], r.config.get("proxy_node_id")
    nodes = ", ".join(f"`{(n or '?')[:8]}`{' (head)' if n == proxy else ''}: {k}" for n, k in sorted(per_node.items()))
    return r.stage, str(sum(per_node.values())), str(len(per_node)), nodes


def _timed_row(r: Record) -> tuple[str, ...]:
    t = r.timeline
    return (r.stage, r.config.get("run", ""), r.load.label(), str(r.stats.successes), _counts(r.stats.errors),
            num(t.recovery_s), f"{r.stats.latency.max_ms or 0:.0f}",
            f"{min(t.replicas)}–{max(t.replicas)}" if t.replicas else "-")


def sections(records: list[Record], out_dir: Path) -> dict[str, Any]:
    """The tables of the report's Ray Serve and overload sections, and whether each plot over time was drawn."""
    overloaded = [r for r in records if r.config.get("run") == RunKind.OVERLOAD and r.timeline is not None]
    timed = [r for r in records if r.timeline is not None and r.config.get("run") != RunKind.OVERLOAD]
    placed: dict[str, Record] = {}  # each stage's first record of where its replicas ran
    for r in records:
        if r.config.get("replicas_per_node") is not None:
            placed.setdefault(r.stage, r)
    return {"overload": overloaded and markdown(["stage", "bound", "load", "ok", "shed", "failed",
                                                 "p99 first → last second ms", "accepted p99 ms", "p99 ÷ service time"],
                                                [_overload_row(records, r) for r in overloaded], "lllrllrrr"),
            "overload_plot": bool(overloaded) and plot_timelines(overloaded, out_dir / "overload_timelines.png"),
            "placement": placed and markdown(("stage", "replicas", "nodes", "replicas per node id"),
                                             [_placement_row(r) for r in placed.values()], "lrrl"),
            "timed": timed and markdown(("stage", "run", "load", "ok", "errors", "recovery s", "max latency ms",
                                         "running replicas"), [_timed_row(r) for r in timed], "lllrlrrl"),
            "ray_plot": bool(timed) and plot_timelines(timed, out_dir / "ray_timelines.png")}
