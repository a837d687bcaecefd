"""Triton's statistics extension (``GET /v2/models/<model>/stats``), diffed across a run: its counters are
cumulative since the model loaded, so a run's server-side view is ``after - before``. Reads the HTTP JSON and the
gRPC ``as_json`` form (64-bit integers as strings).
"""

from collections import Counter
from typing import Any

from servelab.measure.records import Breakdown

PHASES = ("queue", "compute_input", "compute_infer", "compute_output")


def _model_entry(stats: dict[str, Any], model: str) -> dict[str, Any]:
    entries = [m for m in stats.get("model_stats", []) if m.get("name") == model]
    if len(entries) != 1:
        versions = [m.get("version") for m in entries]
        raise ValueError(f"expected statistics for exactly one version of {model!r}, got {versions}")
    return entries[0]


def _counter(entry: dict[str, Any], *keys: str) -> tuple[int, int]:
    """(count, ns) of a nested duration counter; absent counters are zero."""
    node: Any = entry
    for key in keys:
        node = node.get(key, {}) if isinstance(node, dict) else {}
    return int(node.get("count", 0)), int(node.get("ns", 0))


def _batch_counts(entry: dict[str, Any]) -> dict[int, int]:
    return {int(b["batch_size"]): _counter(b, "compute_infer")[0] for b in entry.get("batch_stats", [])}


def stats_delta(before: dict[str, Any], after: dict[str, Any], model: str) -> Breakdown:
    """The breakdown of what happened on the server for ``model`` between two snapshots."""
    old, new = _model_entry(before, model), _model_entry(after, model)
    if old.get("version") != new.get("version"):
        raise ValueError("the two snapshots are of different model versions")
    succeeded = _counter(new, "inference_stats", "success")[0] - _counter(old, "inference_stats", "success")[0]
    parts: dict[str, float] = {}
    for phase in PHASES:
        (c1, ns1), (c0, ns0) = _counter(new, "inference_stats", phase), _counter(old, "inference_stats", phase)
        if c1 - c0 > 0:
            parts[phase] = (ns1 - ns0) / (c1 - c0) / 1e6
    if succeeded < 0:
        raise ValueError("statistics went backwards: was the model reloaded during the run?")
    batches = dict(sorted((Counter(_batch_counts(new)) - Counter(_batch_counts(old))).items()))  # those that grew
    inferences = int(new.get("inference_count", 0)) - int(old.get("inference_count", 0))
    executions = int(new.get("execution_count", 0)) - int(old.get("execution_count", 0))
    failed = _counter(new, "inference_stats", "fail")[0] - _counter(old, "inference_stats", "fail")[0]
    if (steps := after.get("ensemble_steps", {}).get(model)) and succeeded > 0:
        # Triton counts an ensemble's queueing in its steps' statistics, not its own.
        waited_ns = sum(_counter(_model_entry(after, m), "inference_stats", "queue")[1]
                        - _counter(_model_entry(before, m), "inference_stats", "queue")[1] for m in steps)
        parts["queue"] = waited_ns / succeeded / 1e6
    compute = [parts[p] for p in PHASES[1:] if p in parts]
    return Breakdown(source="triton-stats", queue_ms=parts.get("queue"), service_ms=sum(compute) if compute else None,
                     parts_ms=parts, batch_sizes=batches, server_requests=succeeded, server_failures=failed,
                     mean_batch_size=inferences / executions if executions > 0 else None)


def cache_counts(stats: dict[str, Any], model: str) -> dict[str, int] | None:
    """Triton's response-cache counters of ``model``: ``hits``, and ``misses`` as the successes the cache did
    not answer (Triton leaves a lookup out of ``cache_miss`` when a concurrent request of the same input
    has just inserted it, so cache_miss can be short of the requests the model ran). None where the model
    has never used the cache (its config does not enable it)."""
    entry = _model_entry(stats, model)
    hits = _counter(entry, "inference_stats", "cache_hit")[0]
    if hits + _counter(entry, "inference_stats", "cache_miss")[0] == 0:
        return None
    return {"hits": hits, "misses": _counter(entry, "inference_stats", "success")[0] - hits}
