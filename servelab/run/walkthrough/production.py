"""``4_fastapi``'s "Serving in production" section, in words: overload, queue bounds, a cache, a rollout."""

from collections import Counter
from typing import Any

from servelab.core.catalogue import queue_limits
from servelab.core.tables import num, text
from servelab.measure.loadgen import OK, SHED
from servelab.measure.records import Record


def queue_words(ready: dict[str, Any]) -> str:
    """The service's queue bound as its /ready says, in the words of ``catalogue.queue_bound``."""
    b = ready["batching"]
    return queue_limits(b.get("max_queue_requests") or 0, b.get("max_queue_delay_ms") or 0)


def over_time(record: Record) -> str:
    """The run second by second: offered and completed per second, shed and failed apart, p50 and p99."""
    t = record.timeline
    rows = [[f"{start:g}", num(offered, 0) if t.offered_rps else "-", num(done, 0), str(shed), str(failed),
             num(p50, 0), num(p99, 0)]
            for start, offered, done, shed, failed, p50, p99 in zip(
                t.t_s, t.offered_rps or [None] * len(t.t_s), t.throughput_rps, t.shed or [0] * len(t.t_s), t.errors,
                t.p50_ms, t.p99_ms)]
    return text(["t s", "offered/s", "ok/s", "shed", "failed", "p50 ms", "p99 ms"], rows)


def shedding(alone: Record, *runs: Record) -> str:
    """Overload runs side by side: shed and failed apart, accepted p99 against ``alone``'s median (the service time)."""
    service = alone.stats.latency.p50_ms
    rows = []
    for r in runs:
        s, p99s = r.stats, [p for p in r.timeline.p99_ms if p is not None] or [None]
        p99 = s.latency.p99_ms
        rows.append([r.stage, str(r.config.get("bound", "none")), str(s.successes),
                     ", ".join(f"{why} {n}" for why, n in s.shed.items()) or "0", str(s.error_count),
                     f"{num(p99s[0], 0)} -> {num(p99s[-1], 0)}", num(p99, 0),
                     num(p99 / service if p99 and service else None)])
    return text(["stage", "bound", "ok", "shed", "failed", "p99 first -> last second ms", "accepted p99 ms",
                 "x the service time"], rows)


def caching(uncached: Record, cached: Record) -> str:
    """The same photo mix without a cache and with one: its hits and misses, throughput and median."""
    c, a, b = cached.cache, cached.stats, uncached.stats
    hits = "no cache counters" if c is None else (
        f"hits {c.hits}, misses {c.misses}, errors {c.errors}: hit ratio {num(c.hit_ratio and 100 * c.hit_ratio, 0)} %")
    mix = cached.target.get("mix", {})
    return "\n".join([
        f"photo mix: {mix.get('photos', '?')} photos, Zipf s={mix.get('s', '?')}, {mix.get('distinct_photos', '?')} "
        "of them in its order",
        f"without a cache: {num(b.throughput_rps)} req/s, p50 {num(b.latency.p50_ms)} ms",
        f"with the cache:  {num(a.throughput_rps)} req/s = {a.throughput_rps / b.throughput_rps:.2f} x, "
        f"p50 {num(a.latency.p50_ms)} ms; {hits}"])


def by_version(record: Record) -> str:
    """A rollout run's answers per bin by the model version that gave them, then what ``rollout`` says of it."""
    per, bin_s = record.per_request, record.timeline.bin_s
    versions = list(dict.fromkeys(v for v in per.version if v))
    counts: Counter[tuple[int, str]] = Counter()
    for sent, latency, outcome, version in zip(per.sent_s, per.latency_ms, per.outcome, per.version):
        kind = version if outcome == OK else "shed" if outcome.startswith(SHED) else "failed"
        counts[int((sent + latency / 1000) // bin_s), kind or "?"] += 1
    last = max((i for i, _ in counts), default=-1)
    rows = [[f"{i * bin_s:g}", *(str(counts[i, k]) for k in [*versions, "failed"])] for i in range(last + 1)]
    o = record.rollout
    return "\n".join([text(["t s", *(f"answered by {v}" for v in versions), "failed"], rows), "",
                      f"reload asked at {o.trigger_s:g} s, returned at {num(o.done_s)} s"
                      + (f"; it failed: {o.error}" if o.error else f": {o.result}"),
                      f"{', '.join(o.old_versions) or '?'} -> {o.new_version or '?'}, first answer of the new version "
                      f"{num(o.first_new_s)} s after the reload was asked",
                      f"failed requests: {o.failed} (the aim: none); p99 before {num(o.p99_before_ms)} ms, during the "
                      f"swap {num(o.p99_during_ms)} ms, after {num(o.p99_after_ms)} ms"])

