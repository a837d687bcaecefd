"""The load generator against a real server with a known service time: the load it offers is the one asked
(counts, rates, windows), errors are errors, and open-loop latency includes the backlog.

No test here holds a measurement to a speed, a rate achieved or a latency: on a shared machine those vary with
the neighbours (how close the figures come to queueing theory is for `servelab benchmark`). What is checked
instead cannot be moved by a busy CPU: counts, the rates and windows as asked, the server's own Server-Timing
fields, and orderings within one record (the client's latency holds the server's service time; a backlog's
latency is at least what the server's one slot could have served by then)."""

import asyncio
import json
import logging
import os
import re
import signal
import socket
import threading
import time
import urllib.request

import numpy as np
import pytest

from servelab.core.paths import DEFAULT_IMAGE
from servelab.measure import loadgen, senders
from servelab.measure.loadgen import ClientOptions, Labels, Trigger, run_bench, run_load
from servelab.measure.records import Load, read_records
from servelab.measure.senders import BOUND_FRACTION
from servelab.measure.targets import FastAPITarget
from tinyserver import running

S_MS = 40.0  # the tiny server's service time: long enough that loopback HTTP overhead is small
PHOTO = DEFAULT_IMAGE.read_bytes()


@pytest.fixture(scope="module")
def server() -> str:
    """One slot, 40 ms per request: capacity 25 req/s."""
    with running(service_ms=S_MS, slots=1) as url:
        yield url


@pytest.fixture(scope="module")
def trivial() -> str:
    """Answers at once: what is measured is the client (and the loopback HTTP stack)."""
    with running(service_ms=0) as url:
        yield url


def _server_count(url: str) -> int:
    with urllib.request.urlopen(url + "/count", timeout=5) as response:
        return json.loads(response.read())["count"]


def test_sequential_matches_the_service_time(server: str) -> None:
    before = _server_count(server)
    r = run_bench(FastAPITarget(server, PHOTO), Load.sequential(40, warmup=5), Labels("tiny"))
    assert r.stats.successes == 40 and r.stats.errors == {}
    assert _server_count(server) - before == 45  # warm-up sent, but not measured
    assert r.breakdown.source == "server-timing" and r.breakdown.server_requests == 40
    assert r.breakdown.service_ms == pytest.approx(S_MS, rel=0.01)  # the server's own Server-Timing field
    # In milliseconds, and the client's time holds the server's: each request is held S by the server.
    assert S_MS <= r.stats.latency.p50_ms <= r.stats.latency.p95_ms <= r.stats.latency.max_ms
    # Successes over measured wall time, not N / sum(latencies).
    assert r.stats.throughput_rps == pytest.approx(40 / r.stats.wall_s)
    # The first warm-up request is kept, and it too was held a service time.
    assert r.first_request_ms >= S_MS
    # The client's own CPU per request: some, and far less than the service time it waited on.
    assert 0 < r.client.cpu_ms_per_request < S_MS


def test_closed_loop_matches_queueing_theory(server: str) -> None:
    c = 4
    r = run_bench(FastAPITarget(server, PHOTO), Load.closed(c, requests=60, warmup=c), Labels("tiny"))
    assert r.stats.successes == 60 and r.load.concurrency == c and r.breakdown.server_requests == 60
    # One slot, four senders: requests waited in the server's queue, and the breakdown says so.
    assert r.breakdown.queue_ms > 0 and 0 < r.breakdown.queue_share < 1
    assert r.breakdown.service_ms == pytest.approx(S_MS, rel=0.01)
    assert r.stats.latency.mean_ms >= r.breakdown.queue_ms + r.breakdown.service_ms


def test_open_loop_below_capacity_sees_no_queue(server: str) -> None:
    rate = 20.0  # 80% of capacity, evenly spaced
    r = run_bench(FastAPITarget(server, PHOTO), Load.open(rate, "constant", requests=30, warmup=2), Labels("tiny"))
    assert r.stats.successes == 30 and r.stats.errors == {}
    # The load as asked, recorded: the rate offered, its arrivals, and the server's own time.
    assert r.load.rate == rate and r.load.arrivals == "constant" and r.stats.offered_rps == rate
    assert r.breakdown.server_requests == 30 and r.stats.latency.p50_ms >= r.breakdown.service_ms


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_open_loop_at_low_load_achieves_the_offered_rate(server: str, seed: int) -> None:
    """The label is the load really offered: an unconditioned Poisson draw offered 4-18 % less."""
    load = Load.open(8.0, "poisson", requests=40, warmup=0, seed=seed)
    r = run_bench(FastAPITarget(server, PHOTO), load, Labels("tiny"))
    assert r.stats.offered_rps == 8.0 and r.stats.successes == 40 and r.load.seed == seed


def test_open_loop_overload_counts_the_backlog(server: str) -> None:
    """Twice the capacity, at most 4 requests in flight: the client falls behind, and latency still
    counts from the scheduled send time, growing by (S - 1/rate) per request. A client that timed
    from the actual send (coordinated omission) would report at most 4 x S = 160 ms."""
    rate, n, inflight = 50.0, 40, 4

    async def measure():
        client = await FastAPITarget(server, PHOTO).connect(inflight, 30.0)
        try:
            return await run_load(client, Load.open(rate, "constant", requests=n, warmup=0, max_inflight=inflight))
        finally:
            await client.close()

    run = asyncio.run(measure())
    latency_ms = np.asarray(run.latency_s)[np.argsort(run.index, kind="stable")] * 1000  # in the order scheduled
    assert len(latency_ms) == n
    # One slot serves the n-th request no sooner than n x S after the first began, and it was scheduled at
    # (n - 1) / rate: counted from its scheduled send, its latency is at least the difference, whatever the
    # machine's speed (a slower one only adds). A client timing from the real send would see at most ~4 x S.
    growth = S_MS - 1000 / rate  # ms of backlog each request adds at the least
    floor_ms = S_MS + (n - 1) * growth - 5  # less 5 ms for the two processes' timer resolution
    assert latency_ms[-1] >= floor_ms > 5 * inflight * S_MS
    assert any("fell behind its schedule" in w for w in run.warnings)
    # The same requests timed from their actual sends, perf_analyzer's rule, leave the backlog out.
    assert len(run.from_send_s) == n and max(run.from_send_s) * 1000 < floor_ms


def test_behind_schedule_warning_reaches_the_record_and_the_log(server: str, caplog) -> None:
    load = Load.open(50.0, "poisson", requests=20, warmup=0, max_inflight=2)
    with caplog.at_level(logging.WARNING, logger="servelab.measure"):
        r = run_bench(FastAPITarget(server, PHOTO), load, Labels("tiny"))
    assert r.stats.late_sends > 0 and r.stats.max_send_lag_ms > 10
    assert any("fell behind its schedule" in w for w in r.warnings)
    assert "fell behind its schedule" in caplog.text


def test_duration_window(server: str) -> None:
    before = _server_count(server)
    r = run_bench(FastAPITarget(server, PHOTO), Load.closed(2, requests=None, duration_s=0.8, warmup=0), Labels("tiny"))
    # Two senders for a 0.8 s window: the window as asked, every request the server saw measured.
    assert r.load.duration_s == 0.8 and r.load.requests is None and r.stats.wall_s >= 0.8
    assert r.stats.successes > 0 and r.stats.successes == _server_count(server) - before
    assert r.first_request_ms is None  # no warm-up: nothing before the measured window


def test_a_warm_up_window_runs_its_seconds_and_is_never_measured(server: str) -> None:
    """``warmup_s`` alone (no request count): the warm-up sends for that window, then the measured run starts; the
    server saw exactly the warm-up's requests and the measured ones."""
    before, started = _server_count(server), time.time()
    r = run_bench(FastAPITarget(server, PHOTO), Load.sequential(5, warmup=0, warmup_s=0.3), Labels("tiny"))
    assert r.load.warmup_s == 0.3 and r.stats.successes == 5
    assert r.window_unix[0] - started >= 0.3  # a busy machine only makes the warm-up longer
    assert r.warmup_requests >= 1 and r.first_request_ms >= S_MS
    assert _server_count(server) - before == r.warmup_requests + 5


def test_a_warm_up_sends_at_least_its_count_and_lasts_at_least_its_window(server: str) -> None:
    before = _server_count(server)
    r = run_bench(FastAPITarget(server, PHOTO), Load.closed(2, requests=4, warmup=6, warmup_s=0.001), Labels("tiny"))
    assert r.warmup_requests >= 6 and _server_count(server) - before == r.warmup_requests + 4


def test_error_statuses_are_never_successes(trivial: str) -> None:
    r = run_bench(FastAPITarget(trivial + "/fail-every/3", PHOTO), Load.closed(4, requests=90, warmup=0),
                  Labels("tiny"))
    assert r.stats.successes == 60 and r.stats.errors == {"http_500": 30}
    assert r.stats.throughput_rps == pytest.approx(60 / r.stats.wall_s)

    r = run_bench(FastAPITarget(trivial + "/status/400", PHOTO), Load.sequential(10, warmup=1), Labels("tiny"))
    assert r.stats.successes == 0 and r.stats.errors == {"http_400": 10}
    assert r.first_request_ms is None and r.warnings == ["1 of 1 warm-up requests failed"]  # a failure has no latency
    assert r.stats.throughput_rps == 0 and r.stats.latency.p50_ms is None


def test_a_200_with_an_error_body_is_an_error(trivial: str) -> None:
    """The original lab's services answered 200 {"error": ...} and its client counted a success."""
    r = run_bench(FastAPITarget(trivial + "/bad-body", PHOTO), Load.sequential(10, warmup=0), Labels("tiny"))
    assert r.stats.successes == 0 and r.stats.errors == {"bad_response": 10}


def test_refused_connections_are_errors() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket is closed
    r = run_bench(FastAPITarget(f"http://127.0.0.1:{port}", PHOTO), Load.sequential(5, warmup=2), Labels("down"))
    assert r.stats.successes == 0 and r.stats.errors == {"connection_refused": 5}
    assert "2 of 2 warm-up requests failed" in r.warnings


def test_batch_requests_send_several_images(server: str) -> None:
    """--batch B posts B images to /predict/batch; one request = B images (img/s = B x req/s)."""
    target = FastAPITarget(server, PHOTO, batch=4)
    assert target.endpoint.endswith("/predict/batch")
    r = run_bench(target, Load.sequential(5, warmup=1), Labels("tiny"))
    assert r.stats.successes == 5 and r.batch == 4
    assert r.stats.items_per_s == pytest.approx(4 * r.stats.throughput_rps)


def test_sixty_four_senders_on_one_process_each_get_their_answers(trivial: str) -> None:
    """64 senders from one process, every request counted once. How many req/s one process drives (the issue's
    >= 2,000 on 2 cores) is a speed: `servelab benchmark` measures it, no test holds a shared machine to it."""
    before = _server_count(trivial)
    r = run_bench(FastAPITarget(trivial, b"x"), Load.closed(64, requests=2000, warmup=64), Labels("trivial"))
    assert r.stats.successes == 2000 and r.stats.errors == {} and r.load.concurrency == 64
    assert _server_count(trivial) - before == 2064


class _Marks:
    """What run_bench reads from a sampler (servelab.servers.rayserve.serve_state.ReplicaSampler): samples and events
    on the perf_counter clock; here a fixed replica count and one event, marked while the load runs."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int]] = []
        self.events: list[tuple[float, str]] = []


def test_step_load_offers_each_phase_rate_and_the_timeline_follows_it(server: str) -> None:
    load = Load.steps([(5, 2.0), (15, 2.0), (5, 2.0)], warmup=0)
    assert load.requests == 10 + 30 + 10 and load.rate == pytest.approx(50 / 6) and "steps 5 > 15 > 5" in load.label()
    r = run_bench(FastAPITarget(server, PHOTO), load, Labels("tiny"), ClientOptions(sampler=_Marks()))
    t = r.timeline
    assert r.stats.successes == 50 and t.bin_s == 1.0 and len(t.t_s) >= 6
    # The schedule's own per-second rate: the low, the high and the low phase.
    assert sum(t.offered_rps[0:2]) == 10 and sum(t.offered_rps[2:4]) == 30 and sum(t.offered_rps[4:6]) == 10
    assert sum(t.throughput_rps) * t.bin_s == 50 and sum(t.errors) == 0 and t.recovery_s is None


def test_timeline_counts_failures_after_an_event_as_recovery(trivial: str) -> None:
    marks = _Marks()
    marks.events.append((time.perf_counter(), "before the run"))  # every failure comes after it
    r = run_bench(FastAPITarget(trivial + "/fail-every/2", PHOTO), Load.closed(2, requests=40, warmup=0),
                  Labels("tiny"), ClientOptions(sampler=marks))
    t = r.timeline
    assert r.stats.errors == {"http_500": 20} and sum(t.errors) == 20
    assert t.events["before the run"] <= 0 < t.first_error_s <= t.last_error_s
    assert t.recovery_s == pytest.approx(t.last_error_s - t.events["before the run"], abs=0.002)


# The client: what it cost in every record, sender processes that count every request once, client-bound runs marked.


def test_every_record_says_what_its_client_cost_and_whether_it_bound_the_run(trivial: str, tmp_path) -> None:
    out = tmp_path / "records.jsonl"
    target = FastAPITarget(trivial, PHOTO)
    first = run_bench(target, Load.sequential(3, warmup=1), Labels("tiny"), ClientOptions(out=out))
    again = run_bench(target, Load.closed(2, requests=6, warmup=2), Labels("tiny"), ClientOptions(out=out))
    small = run_bench(FastAPITarget(trivial, b"x"), Load.sequential(3, warmup=1), Labels("tiny"),
                      ClientOptions(out=out))
    for r in (first, again, small):
        c = r.client
        assert c.processes == 1 and c.cpu_ms_per_request > 0
        assert 0 <= c.busy <= 1.05  # one thread's CPU seconds per second of the window
        # The busy-share rule, on the run's own figure: over half the window on the CPU is client-bound.
        assert c.bound == r.client_bound == (c.busy > BOUND_FRACTION) == (c.why is not None)
    assert [r.client for r in read_records(out)] == [first.client, again.client, small.client]
    assert first.stats.successes == 3 and "one request at a time" in first.client.chosen
    assert [p.name for p in tmp_path.iterdir()] == ["records.jsonl"]  # the client measures nothing beside the run


@pytest.mark.parametrize("processes", [2, 3])
def test_a_closed_loop_on_several_processes_counts_every_request_once(trivial: str, processes: int) -> None:
    before = _server_count(trivial)
    r = run_bench(FastAPITarget(trivial, PHOTO), Load.closed(5, requests=301, warmup=5), Labels("tiny"),
                  ClientOptions(processes=processes, keep_requests=True))
    assert r.client.processes == processes and "asked for" in r.client.chosen
    assert r.stats.successes == 301 and r.stats.errors == {} and len(r.per_request.outcome) == 301
    assert _server_count(trivial) - before == r.warmup_requests + 301  # every warm-up and measured request once
    # One clock: every request of every process inside the one measured window, in completion order (to the 1 µs
    # each of sent_s and latency_ms is rounded to, so a rebuilt completion time may be off by 2 µs).
    done = [s + ms / 1000 for s, ms in zip(r.per_request.sent_s, r.per_request.latency_ms)]
    assert all(b > a - 2e-6 for a, b in zip(done, done[1:]))
    assert min(r.per_request.sent_s) >= -0.001 and max(done) <= r.stats.wall_s + 0.001
    # Every process's event loop counted once: their CPU, no more than they had in the window.
    assert 0 < r.client.cpu_ms_per_request * 301 / 1000 <= processes * r.stats.wall_s * 1.1


def test_a_timed_window_on_two_processes_counts_what_the_server_saw(trivial: str) -> None:
    before = _server_count(trivial)
    r = run_bench(FastAPITarget(trivial + "/fail-every/4", PHOTO), Load.closed(4, requests=None, duration_s=0.5,
                  warmup=0), Labels("tiny"), ClientOptions(processes=2))
    sent = r.stats.successes + r.stats.error_count
    assert r.client.processes == 2 and r.stats.wall_s >= 0.5 and sent == r.stats.requests
    assert r.warmup_requests == 0 and _server_count(trivial) - before == sent
    # The server fails every 4th request it sees, whichever process sent it: a quarter of all, within one.
    assert abs(r.stats.errors["http_500"] - sent / 4) <= 1


def test_an_open_loop_on_three_processes_offers_its_schedule_once(server: str) -> None:
    load = Load.steps([(6, 1.0), (18, 1.0)], arrivals="constant", warmup=0)
    r = run_bench(FastAPITarget(server, PHOTO), load, Labels("tiny"), ClientOptions(processes=3, timeline_bin_s=1.0))
    t = r.timeline
    assert r.client.processes == 3 and r.stats.successes == 24 and r.stats.offered_rps == load.rate
    assert t.offered_rps[:2] == [6, 18]  # the whole schedule, not one process's third of it
    assert r.breakdown.server_requests == 24 and r.stats.latency.p50_ms >= S_MS
    assert 0 < r.client.cpu_ms_per_request < S_MS  # an open loop's client too


def test_the_busy_share_alone_marks_a_run_client_bound(server: str, trivial: str, caplog) -> None:
    """A trigger keeps the one event loop on the CPU for a second of a short window (as a client with heavy work of
    its own per request would), against a run the server holds: the loop is busier, and a run is marked, with its
    reason and a warning, exactly where its busiest sender was on the CPU over half the window. (How much of a core
    the spin gets is the machine's to give: on a crowded one it may stay under half, and then nothing is marked.)"""

    async def spin() -> None:
        until = time.thread_time() + 1.0
        while time.thread_time() < until:
            pass

    with caplog.at_level(logging.WARNING, logger="servelab.measure"):
        busy = run_bench(FastAPITarget(trivial, b"x"), Load.closed(2, requests=None, duration_s=0.2, warmup=2),
                         Labels("tiny"), ClientOptions(trigger=Trigger("spin", 0.05, spin)))
    idle = run_bench(FastAPITarget(server, b"x"), Load.closed(4, requests=20, warmup=4), Labels("tiny"))
    assert busy.client.busy > idle.client.busy and "a trigger (spin)" in busy.client.chosen
    for r in (busy, idle):
        bound = r.client.busy > BOUND_FRACTION
        assert r.client_bound == r.client.bound == bound
        assert r.client.why == (f"the busiest sender process's event loop was on the CPU {r.client.busy:.0%} of the "
                                f"window, above {BOUND_FRACTION:.0%}" if bound else None)
        assert any(w.startswith("client-bound:") for w in r.warnings) == bound
    assert ("client-bound" in caplog.text) == busy.client.bound


def test_a_run_the_server_holds_is_not_client_bound(server: str) -> None:
    """One slot of 40 ms: 25 req/s at most, whatever the machine; the client waits nearly all the window."""
    r = run_bench(FastAPITarget(server, b"x"), Load.closed(4, requests=20, warmup=4), Labels("tiny"))
    assert not r.client_bound and r.client.why is None and r.client.processes == 1
    assert 0 <= r.client.busy < BOUND_FRACTION and r.client.loop_late == 0


def test_a_run_without_a_warm_up_plans_from_the_last_run_of_its_load(trivial: str) -> None:
    """A window measured again right after the one before (no warm-up to estimate from) plans for the rate that
    one reached, with what one process sent per second of its CPU there; with no run before, nothing to plan from."""
    target = FastAPITarget(trivial + "/fail-every/1000000", b"x")  # a target of its own: no earlier run of it
    first = run_bench(target, Load.closed(4, requests=60, warmup=8), Labels("tiny"), ClientOptions(max_processes=2))
    again = run_bench(target, Load.closed(4, requests=60, warmup=0), Labels("tiny"), ClientOptions(max_processes=2))
    assert first.client.expected_rps is not None
    assert again.client.expected_rps == round(first.stats.throughput_rps, 1)
    planned = re.search(r"(\d+) req/s per process", again.client.chosen)
    assert planned and int(planned[1]) == pytest.approx(1000 / first.client.cpu_ms_per_request, rel=0.01, abs=1)
    fresh = FastAPITarget(trivial + "/fail-every/999999", b"x")
    alone = run_bench(fresh, Load.closed(4, requests=60, warmup=0), Labels("tiny"), ClientOptions(max_processes=2))
    assert alone.client.expected_rps is None and alone.client.processes == 1
    assert "nothing to plan from" in alone.client.chosen


def test_a_sender_process_that_dies_fails_the_run_and_the_next_run_starts_afresh(trivial: str) -> None:
    """A sender process killed mid-run: the run fails, saying so, rather than report the requests of the others as
    all; the pool is ended, and the next run on several processes starts new ones and counts every request."""
    failed: list[BaseException] = []

    def measure() -> None:
        try:
            run_bench(FastAPITarget(trivial, b"x"), Load.closed(2, requests=None, duration_s=30.0, warmup=0),
                      Labels("tiny"), ClientOptions(processes=2))
        except RuntimeError as exc:
            failed.append(exc)

    before = _server_count(trivial)
    running_run = threading.Thread(target=measure)
    running_run.start()
    deadline = time.monotonic() + 60
    while _server_count(trivial) - before < 50 and time.monotonic() < deadline:  # both processes are sending
        time.sleep(0.05)
    [(victim, _), *_] = [s for s in senders.pool(loadgen._sender_main).senders if s[0].is_alive()]
    os.kill(victim.pid, signal.SIGKILL)
    running_run.join(120)
    assert not running_run.is_alive() and len(failed) == 1
    assert "sender process ended during the run" in str(failed[0])
    assert not victim.is_alive() and senders.pool(loadgen._sender_main).senders == []
    before = _server_count(trivial)
    r = run_bench(FastAPITarget(trivial, b"x"), Load.closed(2, requests=40, warmup=2), Labels("tiny"),
                  ClientOptions(processes=2))
    assert r.client.processes == 2 and r.stats.successes == 40
    assert _server_count(trivial) - before == r.warmup_requests + 40


def test_the_clients_own_cost_in_its_warm_up_plans_its_processes(trivial: str) -> None:
    """The plan takes what this client itself sent per CPU-second in its warm-up (tritonclient's cost too, for a
    Triton target)."""
    r = run_bench(FastAPITarget(trivial, b"x"), Load.closed(4, requests=40, warmup=40), Labels("tiny"),
                  ClientOptions(max_processes=2))
    own = r.client.warmup_rps_per_cpu
    assert own is not None and 0 < own < 1e9 and r.warmup_requests >= 40
    planned = re.search(r"(\d+) req/s per process", r.client.chosen)
    assert planned and abs(int(planned[1]) - own) <= 1
    short = run_bench(FastAPITarget(trivial, b"x"), Load.closed(4, requests=40, warmup=8), Labels("tiny"),
                      ClientOptions(max_processes=2))
    assert short.client.warmup_rps_per_cpu is None  # two per sender: mostly opening connections, not a cost to plan by
