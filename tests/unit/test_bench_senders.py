"""The client across processes, without a server: how many sender processes a run plans for, how a load splits
across them and merges back, and when a run counts as client-bound."""

from collections import Counter

import numpy as np
import pytest

from servelab.measure.loadgen import OK, RawRun, _mix_share, merge_runs, share
from servelab.measure.records import Load
from servelab.measure.senders import BOUND_FRACTION, HEADROOM, bound_reason, little_rate, plan_processes, planned_rate
from servelab.measure.server_timing import TimingSums, parse_server_timing
from servelab.measure.targets import FastAPITarget, PhotoMix


def test_one_process_while_what_it_sends_is_twice_the_rate_expected() -> None:
    load = Load.open(500.0, "constant", requests=1000)
    assert plan_processes(load, 1000.0, 500.0, max_processes=8)[0] == 1
    n, how = plan_processes(load, 1000.0, 501.0, max_processes=8)
    assert n == 2 and "2 processes" in how
    assert plan_processes(load, 1000.0, 1600.0, max_processes=8)[0] == 4  # 2 x 1600 / 1000, rounded up


def test_processes_are_capped_and_never_more_than_the_load_splits_into() -> None:
    n, how = plan_processes(Load.open(5000.0, "constant", requests=1000), 1000.0, 5000.0, max_processes=4)
    assert n == 4 and "capped" in how
    # A closed loop needs a sender per process, a window a request per process.
    assert plan_processes(Load.closed(3, requests=100), 10.0, 100.0, max_processes=16)[0] == 3
    assert plan_processes(Load.closed(16, requests=2), 10.0, 100.0, max_processes=16)[0] == 2
    assert plan_processes(Load.closed(16, requests=2), 10.0, 100.0, max_processes=16, asked=8)[0] == 2


def test_a_warm_up_near_what_one_process_sends_takes_every_process_allowed() -> None:
    """One process's warm-up at 0.8 x what it sends per CPU-second may have been held there by the client: the rate to come is
    unknown above it, so the run takes all it may (6 here), not the 2 that 2 x 0.8 would give."""
    assert plan_processes(Load.closed(16, requests=100), 1000.0, 800.0, max_processes=6)[0] == 6
    assert plan_processes(Load.closed(16, requests=100), 1000.0, 700.0, max_processes=6)[0] == 2


def test_one_process_where_asked_held_or_with_nothing_to_plan_from() -> None:
    closed = Load.closed(8, requests=100)
    assert plan_processes(closed, 10.0, 1000.0, max_processes=4, held="a trigger runs here") == (
        1, "one process: a trigger runs here")
    assert plan_processes(Load.sequential(10), 10.0, 1000.0, max_processes=4)[0] == 1
    assert plan_processes(closed, None, 1000.0, max_processes=4)[0] == 1
    assert plan_processes(closed, 10.0, None, max_processes=4)[0] == 1
    assert plan_processes(closed, 1e9, 1.0, max_processes=4, asked=3)[0] == 3
    assert plan_processes(closed, 10.0, 1000.0, max_processes=1) == (
        1, "one process: the most allowed (max_processes; by default half the CPUs)")


def test_the_rate_expected() -> None:
    assert planned_rate(Load.open(40.0, "poisson", requests=10)) == 40.0
    assert planned_rate(Load.steps([(5, 1.0), (30, 1.0), (5, 1.0)])) == 30.0  # the top step, not the mean
    assert planned_rate(Load.closed(4)) is None
    # Little's law: 4 senders, a median of 10 ms -> 400 req/s; the first warm-up request is not among them.
    assert little_rate(Load.closed(4, warmup=10), [0.010, 0.009, 0.011, 0.050]) == pytest.approx(400 / 1.1, rel=0.2)
    assert little_rate(Load.closed(4, warmup=10), [0.010, 0.010, 0.010]) == pytest.approx(400)
    assert little_rate(Load.closed(16, warmup=2), [0.010] * 3) == pytest.approx(200)  # 2 warm-up senders only
    assert little_rate(Load.closed(4), [0.010]) is None
    assert little_rate(Load.sequential(), [0.010] * 5) is None


def test_client_bound_where_the_busiest_sender_was_on_the_cpu_over_half_the_window() -> None:
    assert BOUND_FRACTION == 1 / HEADROOM == 0.5
    assert "51%" in bound_reason(10.0, busy=0.51) and bound_reason(10.0, busy=0.5) is None
    assert bound_reason(1e9, busy=None) is None  # not measured: nothing to judge by
    assert bound_reason(0.0, busy=0.9) is None  # served nothing: no capacity to mark


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_shares_add_up_to_the_load(n: int) -> None:
    closed = Load.closed(16, requests=101, warmup=40, warmup_s=2.0)
    parts = [share(closed, k, n) for k in range(n)]
    assert sum(p.concurrency for p in parts) == 16 and sum(p.requests for p in parts) == 101
    assert n == 1 or all(p.warmup == p.concurrency and p.warmup_s is None for p in parts)
    assert all(share(Load.closed(4, warmup=0), k, n).warmup == 0 for k in range(n))
    timed = Load.closed(7, requests=None, duration_s=3.0)
    assert all(share(timed, k, n).duration_s == 3.0 and share(timed, k, n).requests is None for k in range(n))
    open_loop = Load.open(100.0, "poisson", requests=500, max_inflight=128)
    assert all(share(open_loop, k, n).rate == 100.0 and share(open_loop, k, n).requests == 500 for k in range(n))
    assert sum(share(open_loop, k, n).max_inflight for k in range(n)) >= 128


def _part(started: float, index: list[int], done: list[float], errors: int = 0) -> RawRun:
    run = RawRun(timing=TimingSums(1), started=started)
    for i, t in zip(index, done):
        run.index.append(i)
        run.latency_s.append(0.01)
        run.timing.add(parse_server_timing("queue;dur=1, total;dur=3"))
        run.outcomes.append((t - started, 0.01, OK, None))
        run.last_done = max(run.last_done, t)
    run.errors = Counter({"http_500": errors}) if errors else Counter()
    run.send_lag_s = [0.0] * len(index)
    run.scheduled_s = np.asarray([t - started for t in done])
    run.loop_cpu_s = [0.01 * len(index)]
    return run


def test_merged_parts_hold_every_request_once_on_one_clock() -> None:
    a = _part(100.0, [0, 2, 4], [100.1, 100.3, 100.5])
    b = _part(100.0, [1, 3], [100.2, 100.4], errors=2)
    merged = merge_runs([a, b], Load.closed(4, requests=7))
    assert sorted(merged.index) == [0, 1, 2, 3, 4] and len(merged.latency_s) == 5
    assert merged.errors == {"http_500": 2} and merged.last_done == 100.5
    assert [round(t, 3) for t, *_ in merged.outcomes] == [0.1, 0.2, 0.3, 0.4, 0.5]  # in completion order
    assert merged.timing.breakdown().server_requests == 5 and merged.timing.breakdown().queue_ms == 1.0
    assert list(np.round(merged.scheduled_s, 3)) == [0.1, 0.2, 0.3, 0.4, 0.5]
    assert merged.loop_cpu_s == [0.03, 0.02]  # each process's own, for the busiest


def test_a_photo_mix_is_dealt_out_across_the_processes_in_its_one_order() -> None:
    mix = PhotoMix.zipf(draws=1000)
    target = FastAPITarget("http://127.0.0.1:1", b"", mix=mix)
    parts = [_mix_share(target, k, 3).mix.order for k in range(3)]
    dealt = [parts[i % 3][i // 3] for i in range(1000)]  # request i of the whole run: process i % 3's (i // 3)-th
    assert dealt == list(mix.order) and all(_mix_share(target, k, 3).mix.images == mix.images for k in range(3))
    assert _mix_share(target, 0, 1) is target and _mix_share(FastAPITarget("u", b"x"), 1, 3).mix is None
