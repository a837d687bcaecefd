"""The capacity sweep's rule (servelab.measure.measure_stage.Sweep): which levels it tries and why it stops,
on curves written by hand. tests/integration/test_measure_stage.py runs it against a real server."""

from servelab.measure.measure_stage import CAP_PER_CORE, Sweep


def point(c: int, rps: float, **extra) -> dict:
    return {"concurrency": c, "throughput_rps": rps, "p50_ms": 1e3 * c / rps if rps else None, "p99_ms": None, **extra}


def stops(sweep: Sweep, rates: list[float], **last) -> list[str | None]:
    """What the sweep says after each point of the curve of these rates at its levels."""
    curve = [point(c, rps) for c, rps in zip(sweep.levels(), rates)]
    if last:
        curve[-1] |= last
    return [sweep.stop(curve[:i + 1]) for i in range(len(curve))]


def test_the_levels_double_from_one_at_a_time_to_the_cap():
    assert Sweep(cap=16).levels() == [1, 2, 4, 8, 16]
    assert Sweep(start=4, cap=64).levels() == [1, 4, 8, 16, 32, 64]
    assert Sweep(cap=64, max_levels=2).levels() == [1, 2]
    assert Sweep(fixed=(16, 4)).levels() == [1, 4, 16]
    assert Sweep().most() >= CAP_PER_CORE  # 8 × this machine's cores


def test_it_goes_on_while_a_doubling_adds_5_percent_and_stops_at_the_first_that_adds_less():
    said = stops(Sweep(cap=64), [10.0, 19.0, 30.0, 31.4, 40.0])
    assert said[:3] == [None, None, None] and said[3] == "the knee: 4 -> 8 senders added +4.7 % (< 5 %)"
    assert stops(Sweep(cap=64), [10.0, 9.0])[1].startswith("the knee: 1 -> 2 senders added -10.0 %")  # a fall too


def test_the_cap_the_plan_s_levels_and_the_levels_asked_end_it_too():
    assert stops(Sweep(cap=4), [10.0, 20.0, 40.0]) == [None, None, "the cap: 4 senders"]
    assert stops(Sweep(cap=64, max_levels=2), [10.0, 20.0]) == [None, "the plan's 2 levels"]
    assert stops(Sweep(fixed=(4, 16)), [10.0, 9.0, 8.0]) == [None, None, "the levels asked: 1, 4, 16"]  # no knee


def test_nothing_served_or_a_client_bound_step_ends_it_at_once():
    assert stops(Sweep(cap=64), [0.0]) == ["nothing served at concurrency 1"]
    said = stops(Sweep(cap=64), [10.0, 20.0], client_bound=True)
    assert said == [None, "client-bound at 2 senders: the client's limit, not the server's"]
