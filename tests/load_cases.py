"""The overload and rollout cases as one call each, for the tests that run them on a server of their own (the
lab and the notebooks run the same loads, ``overload_load`` and ``rollout_load``, through ``measure_stage``)."""

from collections.abc import Awaitable, Callable
from typing import Any

from servelab.measure.loadgen import ClientOptions, Labels, overload_load, rollout_load, run_bench
from servelab.measure.records import Record
from servelab.measure.targets import Target


def overload(target: Target, capacity_rps: float, *, stage: str, seconds: float = 10.0, bin_s: float = 1.0,
             config: dict[str, Any] | None = None) -> Record:
    """``overload_load``'s run: the record has its ``timeline`` (p50/p99 per ``bin_s``: latency against time,
    not one percentile) and every request (``per_request``)."""
    load, labels = overload_load(capacity_rps, seconds)
    return run_bench(target, load, Labels(stage, {**(config or {}), **labels}),
                     ClientOptions(timeline_bin_s=bin_s, keep_requests=True))


def rollout(target: Target, action: Callable[[], Awaitable[dict[str, Any] | None]], *, stage: str,
            bin_s: float = 0.5, config: dict[str, Any] | None = None, **kwargs: Any) -> Record:
    """``rollout_load``'s run (``kwargs``: its own). The record has every request with the
    version that answered it (``per_request``), its ``timeline`` per ``bin_s`` (the rollout's start and return
    as events) and its ``rollout`` summary: failures (the aim: 0), p99 before, during and after the swap (the
    aim: during within 3x before), and when the new version first answered after the trigger."""
    load, labels, trigger = rollout_load(action, **kwargs)
    return run_bench(target, load, Labels(stage, {**(config or {}), **labels}),
                     ClientOptions(timeline_bin_s=bin_s, keep_requests=True, trigger=trigger))
