"""Runs over time. The report's Ray Serve section: replica placement by node id, and the runs with a
timeline (step load, node failure) as a table and a plot of throughput, latency, errors and replicas over
time. The overload section (``overload_section``): open loops above a stage's capacity, with and without a
bound on its queue, as a table (accepted p99 against the service time, shed and failed requests) and the
same plot, p50/p99 against time."""

from pathlib import Path

from servelab.core.tables import markdown, num
from servelab.measure.fractions import closed_run
from servelab.measure.records import Record, RunKind
from servelab.report.plots import figure


def _short(node_id: str | None) -> str:
    return (node_id or "?")[:8]


def placement_rows(records: list[Record]) -> list[tuple[str, ...]]:
    seen, rows = set(), []
    for r in records:
        per_node = r.config.get("replicas_per_node")
        if per_node is None or r.stage in seen:
            continue
        seen.add(r.stage)
        proxy = r.config.get("proxy_node_id")
        nodes = ", ".join(f"`{_short(n)}`{' (head)' if n == proxy else ''}: {k}" for n, k in sorted(per_node.items()))
        rows.append((r.stage, str(sum(per_node.values())), str(len(per_node)), nodes))
    return rows


def _ray_timed(records: list[Record]) -> list[Record]:
    return [r for r in records if r.timeline is not None and r.config.get("run") != RunKind.OVERLOAD]


def timeline_rows(records: list[Record]) -> list[tuple[str, ...]]:
    rows = []
    for r in _ray_timed(records):
        t = r.timeline
        errors = ", ".join(f"{kind} {n}" for kind, n in r.stats.errors.items()) or "0"
        replicas = f"{min(t.replicas)}–{max(t.replicas)}" if t.replicas else "-"
        rows.append((r.stage, r.config.get("run", ""), r.load.label(), str(r.stats.successes), errors,
                     num(t.recovery_s), f"{r.stats.latency.max_ms or 0:.0f}", replicas))
    return rows


def plot_timelines(records: list[Record], out: Path) -> bool:
    runs = [r for r in records if r.timeline is not None]
    if not runs:
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
            bottom.set_ylabel("running replicas")
            bottom.set_ylim(0, max(t.replicas or [1]) + 1)
        bottom.set_xlabel("seconds from the start of the run")
        for ax in dict.fromkeys((top, middle, bottom)):
            for name, at in t.events.items():
                ax.axvline(at, color="tab:red", ls="--", lw=1)
                if ax is top:
                    ax.text(at, ax.get_ylim()[1], f" {name}", fontsize=7, va="top", color="tab:red")
    fig.savefig(out, dpi=110)
    return True


def overload_rows(records: list[Record]) -> list[list[str]]:
    """One row per overload run, its accepted requests' p99 also as a multiple of the stage's service time
    (its sequential median)."""
    rows = []
    for r in records:
        if r.config.get("run") != RunKind.OVERLOAD or r.timeline is None:
            continue
        alone = closed_run(records, r.stage, 1)
        p99, service = r.stats.latency.p99_ms, alone.stats.latency.p50_ms if alone else None
        first = next((v for v in r.timeline.p99_ms if v is not None), None)
        last = next((v for v in reversed(r.timeline.p99_ms) if v is not None), None)
        rows.append([r.stage, r.config.get("bound", ""),
                     f"{r.load.label()} ({r.config.get('multiple', '')}× {r.config.get('capacity_rps', 0):.1f})",
                     str(r.stats.successes), ", ".join(f"{kind} {n}" for kind, n in r.stats.shed.items()) or "0",
                     ", ".join(f"{kind} {n}" for kind, n in r.stats.errors.items()) or "0",
                     f"{num(first, 0)} → {num(last, 0)}", num(p99, 0),
                     f"{p99 / service:.1f}×" if p99 is not None and service else "-"])
    return rows


def overload_section(records: list[Record], out_dir: Path) -> list[str]:
    """The overload case: its table and its plot over time (``overload_timelines.png``); [] without overload runs."""
    rows = overload_rows(records)
    if not rows:
        return []
    md = ["## Overload and load shedding", "",
          "Open-loop load above each stage's measured capacity. Without a bound the queue grows and so does "
          "latency, second after second; with one (MAX_QUEUE_REQUESTS / MAX_QUEUE_DELAY_MS, Triton's "
          "`default_queue_policy` with REJECT) the excess is shed (503 + Retry-After) and the accepted requests "
          "stay near the service time. Shed requests are counted apart from failures.", "",
          markdown(["stage", "bound", "load", "ok", "shed", "failed", "p99 first → last second ms", "accepted p99 ms",
                    "p99 ÷ service time"], rows, "lllrllrrr"), ""]
    runs = [r for r in records if r.config.get("run") == RunKind.OVERLOAD and r.timeline is not None]
    if plot_timelines(runs, out_dir / "overload_timelines.png"):
        md += ["![Overload runs over time: throughput, shed, p50/p99](overload_timelines.png)", ""]
    return md


def section(records: list[Record], out_dir: Path) -> list[str]:
    placement, timed = placement_rows(records), timeline_rows(records)
    if not placement and not timed:
        return []
    md = ["## Ray Serve: placement, step load, node failure", ""]
    if placement:
        md += ["Running replicas per Ray node id after each stage's deploy (the head runs the one HTTP proxy).", "",
               markdown(("stage", "replicas", "nodes", "replicas per node id"), placement, "lrrl"), ""]
    if timed:
        md += ["Runs followed over time. Recovery = from the node's kill to the last failed request after it "
               "(0: none failed). Every failed request is counted by its kind (`http_500`: the proxy's answer for "
               "a request its replica died with; `timeout`: past the per-request timeout).", "",
               markdown(("stage", "run", "load", "ok", "errors", "recovery s", "max latency ms", "running replicas"),
                        timed, "lllrlrrl"), ""]
        if plot_timelines(_ray_timed(records), out_dir / "ray_timelines.png"):
            md += ["![Ray Serve runs over time: throughput, latency, errors, replicas](ray_timelines.png)", ""]
    return md
