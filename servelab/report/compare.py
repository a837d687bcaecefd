"""The two clients side by side: perf_analyzer against servelab's load generator, same stage and load.

Both measure the same server with the same photo at the same load, back to back, so where their throughput or
median differ by more than ``TOLERANCE`` it is the clients (or the machine's noise), not the server: the row is
flagged (the tail is shown, not flagged: a few hundred requests make it noisy). An open loop is compared like with
like: servelab's p50 from the actual send, as perf_analyzer counts it (``Stats.p50_from_send_ms``; the lessons
count from the scheduled send), each client's throughput as a share of the rate it sent (perf_analyzer draws its
own Poisson arrivals), and a rate as a fraction of the capacity the same client measured (``own_capacity``)."""

from dataclasses import dataclass

from servelab.core import tables
from servelab.core.tables import num
from servelab.measure.fractions import capacity
from servelab.measure.records import Record

TOLERANCE = 0.10  # flag a ratio outside 0.9-1.1


@dataclass(frozen=True)
class Pair:
    stage: str
    load: str
    batch: int
    servelab: Record
    perf_analyzer: Record
    # open loop: the rate ÷ the capacity each client measured (servelab's, perf_analyzer's); None: not known
    fractions: tuple[float | None, float | None] = (None, None)

    @staticmethod
    def _ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    @property
    def throughput_ratio(self) -> float | None:
        """perf_analyzer ÷ servelab requests/s; in an open loop, each as a share of the rate its client sent."""
        a, s = self.perf_analyzer.stats, self.servelab.stats
        if a.offered_rps and s.offered_rps:
            return self._ratio(a.throughput_rps / a.offered_rps, s.throughput_rps / s.offered_rps)
        return self._ratio(a.throughput_rps, s.throughput_rps)

    @property
    def servelab_p50_ms(self) -> float | None:
        """servelab's p50 counted as perf_analyzer counts it: in an open loop, from the actual send."""
        s = self.servelab.stats
        return s.latency.p50_ms if s.p50_from_send_ms is None else s.p50_from_send_ms

    @property
    def p50_ratio(self) -> float | None:
        return self._ratio(self.perf_analyzer.stats.latency.p50_ms, self.servelab_p50_ms)

    @property
    def verdict(self) -> str:
        if self.perf_analyzer.failed:
            return "perf_analyzer failed"
        if self.servelab.failed or not self.servelab.stats.successes:
            return "servelab measured nothing"
        off = [r for r in (self.throughput_ratio, self.p50_ratio) if r is not None and abs(r - 1) > TOLERANCE]
        said = f"DISAGREE (> {TOLERANCE:.0%})" if off else "agree"
        # servelab's client could not keep up: where they disagree, that is why (servelab.measure.senders)
        return f"{said}; servelab's run was client-bound" if self.servelab.client_bound else said


def own_capacity(records: list[Record], tool: str, stage: str) -> float | None:
    """The capacity of ``stage`` that the client ``tool`` measured: servelab's, the top of its sweep; perf_analyzer's,
    the most requests/s of its closed-loop runs (it runs at the sweep's levels right after servelab's client)."""
    if tool == "servelab":
        return run.stats.throughput_rps if (run := capacity(records, stage)) else None
    return max((r.stats.throughput_rps for r in records if r.tool == tool and r.stage == stage and r.batch == 1
                and r.load.mode in ("sequential", "closed") and not r.failed and not r.config.get("run")), default=None)


def _fraction(records: list[Record], run: Record) -> float | None:
    cap = own_capacity(records, run.tool, run.stage) if run.load.rate else None
    return run.load.rate / cap if cap else None


def pairs(records: list[Record]) -> list[Pair]:
    """Each perf_analyzer record with the latest servelab record of the same stage, load and batch."""
    ours = {(r.stage, r.load.label(), r.batch): r for r in records if r.tool == "servelab"}
    return [Pair(*key, servelab=ours[key], perf_analyzer=r,
                 fractions=(_fraction(records, ours[key]), _fraction(records, r)))
            for r in records if r.tool == "perf_analyzer" and (key := (r.stage, r.load.label(), r.batch)) in ours]


COLUMNS = ("stage", "load", "batch", "req/s servelab", "req/s perf_analyzer", "req/s ratio", "sent req/s servelab",
           "sent req/s perf_analyzer", "p50 ms servelab from schedule", "p50 ms servelab", "p50 ms perf_analyzer",
           "p50 ratio", "p99 ms servelab", "p99 ms perf_analyzer",
           "rate ÷ own capacity (servelab, perf_analyzer)", "verdict")


def rows(found: list[Pair]) -> list[tuple[str, ...]]:
    out = []
    for p in found:
        s = p.servelab.stats
        a = None if p.perf_analyzer.failed else p.perf_analyzer.stats
        out.append((p.stage, p.load, str(p.batch),
                    num(s.throughput_rps), num(a and a.throughput_rps), num(a and p.throughput_ratio, 2),
                    num(s.offered_rps), num(a and a.offered_rps),
                    num(s.latency.p50_ms if s.p50_from_send_ms is not None else None), num(p.servelab_p50_ms),
                    num(a and a.latency.p50_ms), num(a and p.p50_ratio, 2),
                    num(s.latency.p99_ms), num(a and a.latency.p99_ms),
                    " / ".join(num(f, 2) for f in p.fractions) if any(p.fractions) else "-", p.verdict))
    return out


def markdown(found: list[Pair]) -> str:
    lines = [tables.markdown(COLUMNS, rows(found), align="llr" + "r" * 12 + "l")]
    failures = [f"- {p.stage} [{p.load}, batch {p.batch}]: {p.perf_analyzer.failed}" for p in found
                if p.perf_analyzer.failed]
    return "\n".join(lines + ([""] + failures if failures else []))


def text(found: list[Pair]) -> str:
    return tables.text(COLUMNS, rows(found))
