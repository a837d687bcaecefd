"""The capacity sweep's rule (servelab.measure.measure_stage.Sweep): which levels it tries, what it measures again
and why it stops, on curves written by hand or recorded. tests/integration/test_measure_stage.py runs it against a
real server."""

from servelab.measure.measure_stage import CAP_PER_CORE, Sweep


def point(c: int, rps: float, **extra) -> dict:
    return {"concurrency": c, "throughput_rps": rps, "p50_ms": 1e3 * c / rps if rps else None, "p99_ms": None, **extra}


def swept(sweep: Sweep, rates: dict[int, list[float]], **last) -> tuple[list[int], str]:
    """Drive ``sweep`` as ``sweep_capacity`` does over a server whose runs at each level read ``rates[level]`` in
    turn: the levels it measured, in order, and why it stopped."""
    curve, level = [], 1
    while isinstance(level, int):
        curve.append(point(level, rates[level].pop(0)))
        if last and not any(rates.values()):
            curve[-1] |= last
        level = sweep.next(curve)
    return [p["concurrency"] for p in curve], level


def test_the_levels_double_from_one_at_a_time_to_the_cap():
    assert Sweep(cap=16).levels() == [1, 2, 4, 8, 16]
    assert Sweep(start=4, cap=64).levels() == [1, 4, 8, 16, 32, 64]
    assert Sweep(cap=64, max_levels=2).levels() == [1, 2]
    assert Sweep(fixed=(16, 4)).levels() == [1, 4, 16]
    assert Sweep().most() >= CAP_PER_CORE  # 8 × this machine's cores


def test_issue_65s_int8_curve_does_not_end_at_4_senders_on_one_low_point():
    """Tour A's fastapi-onnx-int8 read 82.8, 122.6, then 98.8 req/s at 1, 2 and 4 senders and stopped there; fp32
    went on to 131.9 at 8. One non-gain now measures the best level (2) and the next (4) again, and goes on."""
    levels, why = swept(Sweep(cap=16), {1: [82.8], 2: [122.6, 120.1], 4: [98.8, 126.0], 8: [131.9], 16: [133.0]})
    assert levels == [1, 2, 4, 2, 4, 8, 16] and why == "the cap: 16 senders"


def test_it_stops_only_on_two_non_gains_in_a_row_each_measured_twice_where_it_matters():
    levels, why = swept(Sweep(cap=64), {1: [10.0], 2: [19.0], 4: [30.0, 30.5], 8: [31.4, 31.0], 16: [30.0], 32: [40]})
    assert levels == [1, 2, 4, 8, 4, 8, 16]  # 32 never: 8 and 16 both added < 5 % over 4 senders
    assert why == "the knee: 2 levels in a row after 4 senders (30.2 req/s) added less than 5 % (each level there " \
                  "measured twice)"
    # The second measurement can undo a non-gain: the sweep then goes on as after a gain.
    levels, _ = swept(Sweep(cap=8), {1: [10.0, 10.0], 2: [9.0, 14.0], 4: [20.0], 8: [30.0]})
    assert levels == [1, 2, 1, 2, 4, 8]


def test_the_cap_the_plan_s_levels_and_the_levels_asked_end_it_with_nothing_measured_again():
    assert swept(Sweep(cap=4), {1: [10.0], 2: [20.0], 4: [40.0]}) == ([1, 2, 4], "the cap: 4 senders")
    # No level left to try: a non-gain at the last is not a knee, and costs no second run.
    assert swept(Sweep(cap=64, max_levels=2), {1: [10.0], 2: [9.0]}) == ([1, 2], "the plan's 2 levels")
    assert swept(Sweep(fixed=(4, 16)), {1: [10.0], 4: [9.0], 16: [8.0]}) == ([1, 4, 16], "the levels asked: 1, 4, 16")


def test_nothing_served_or_a_client_bound_step_ends_it_at_once():
    assert swept(Sweep(cap=64), {1: [0.0]})[1] == "nothing served at concurrency 1"
    said = swept(Sweep(cap=64), {1: [10.0], 2: [20.0]}, client_bound=True)
    assert said == ([1, 2], "client-bound at 2 senders: the client's limit, not the server's")
