"""The report's first screen (servelab.report.lessons): every ratio it shows is the ratio of the records'
own figures, and a measurement that goes against the notebooks is flagged.

tests/data/quick_lab_records.jsonl: 21 real records, unchanged, from `servelab lab --quick` on a 2-CPU
machine (2026-11-25), made before the capacity sweep (a stage's capacity there is its run at the most senders):
closed loop at 8 senders for most stages, one at a time and Poisson arrivals at
half the capacity for onnx-1 and onnx-dyn, one pair of clients (pt-1 at 8 senders), and Ray Serve's
step load and node failure. Read here as plain JSON, not through servelab, so the check is independent.
"""

import json
import re
from pathlib import Path

import pytest

from servelab.measure.records import Record
from servelab.report import lessons

RECORDS = Path(__file__).parents[1] / "data" / "quick_lab_records.jsonl"
CLOSED = re.compile(r"^  - (\S+) ÷ (\S+), capacity both at (\d+) senders: ([\d.]+) vs ([\d.]+) req/s = \*\*([\d.]+)×\*\*"
                    r" \([^)]*\); p50 at (\d+) senders ([\d.]+) vs ([\d.]+) ms")
P50 = re.compile(r"^  - (\S+?)(?: ÷ (\S+))?, .*: p50 ([\d.]+) vs ([\d.]+) ms = \*\*([\d.]+)×\*\*")
UNKNOWN = "(no windows recorded: spread unknown)"  # the quick lab's records predate config["windows"]
ANY_RATIO = re.compile(r"\*\*[\d.]+×\*\*")


def _raw() -> list[dict]:
    return [json.loads(line) for line in RECORDS.read_text().splitlines() if line.strip()]


def _ours(raw: list[dict], stage: str, mode: str, concurrency: int = 1) -> dict:
    """servelab's run of the stage at that load (not a node-failure run), from the JSON itself."""
    [run] = [r for r in raw if r["stage"] == stage and r["tool"] == "servelab" and r["load"]["mode"] == mode
             and r["load"]["concurrency"] == concurrency and r["batch"] == 1 and not r["config"].get("run")]
    return run


def _summary(raw: list[dict]) -> list[str]:
    return lessons.summary([Record.model_validate(r) for r in raw])


def test_every_ratio_shown_is_the_records_ratio() -> None:
    raw = _raw()
    assert len(raw) == 21
    lines = _summary(raw)
    shown = [line for line in lines if ANY_RATIO.search(line)]
    checked = 0
    for line in lines:
        if m := CLOSED.match(line):
            top, bottom, senders = m[1], m[2], int(m[3])
            a = _ours(raw, top, "closed", senders)["stats"]["throughput_rps"]
            b = _ours(raw, bottom, "closed", senders)["stats"]["throughput_rps"]
            assert (m[4], m[5], m[6]) == (f"{a:.1f}", f"{b:.1f}", f"{a / b:.2f}"), line
            # Latency beside it, a figure of its own: both stages at one stated concurrency.
            a, b = (_ours(raw, stage, "closed", int(m[7]))["stats"]["latency"]["p50_ms"] for stage in (top, bottom))
            assert (m[8], m[9]) == (f"{a:.1f}", f"{b:.1f}"), line
            checked += 1
        elif m := P50.match(line):
            if m[2]:  # Ray's proxy: one replica against the service alone, one request at a time
                a = _ours(raw, m[1], "sequential")["stats"]["latency"]["p50_ms"]
                b = _ours(raw, m[2], "sequential")["stats"]["latency"]["p50_ms"]
            else:  # queueing: the stage's Poisson run against itself one at a time
                [run] = [r for r in raw if r["stage"] == m[1] and r["tool"] == "servelab" and r["load"]["mode"] == "open"
                         and r["load"]["arrivals"] == "poisson" and not r["load"].get("phases")]
                a, b = run["stats"]["latency"]["p50_ms"], _ours(raw, m[1], "sequential")["stats"]["latency"]["p50_ms"]
            assert (m[3], m[4], m[5]) == (f"{a:.1f}", f"{b:.1f}", f"{a / b:.2f}"), line
            checked += 1
    assert checked == len(shown) == 12  # every ratio on the screen, none unchecked
    text = "\n".join(lines)
    # The figures the issue asks for beside the ratios: the batch the server formed, the proxy's milliseconds.
    assert ("fastapi-onnx-dyn ÷ fastapi-onnx, capacity both at 8 senders: 13.6 vs 14.0 req/s = **0.97×** "
            f"{UNKNOWN}; p50 at 8 senders 567.2 vs 568.0 ms; mean batch 3.4") in text
    assert all(UNKNOWN in line for line in shown)
    assert "+2.2 ms through the proxy" in text and "running replicas min 1, max 1" in text
    assert "recovered in 2.5 s" in text and "Poisson at 0.50 × capacity (16.3 of 32.6 req/s)" in text
    # What was not measured, lessons and pairs, is named in one line after the lessons.
    [missing] = [line for line in lines if line.startswith("- *Not measured in this run*")]
    assert "Model variant u8 instead of fp32" in missing and "pt-2x2 ÷ pt-1" in missing
    assert lines.index(missing) > max(i for i, line in enumerate(lines) if line.startswith("  - "))
    # On a CPU the GPU-only variant is no lesson at all, not even "not measured".
    assert "fp16" not in text


def test_what_contradicts_the_notebooks_is_flagged() -> None:
    raw = _raw()
    flagged = [line for line in _summary(raw) if line.startswith("  - ") and "⚠" in line]
    # This machine's two "nodes" share two CPUs, and the quick step load is too short to scale: both said.
    assert [line.split(":")[0].strip(" -") for line in flagged] == ["ray-2 ÷ ray-1, capacity both at 8 senders", "ray-auto, poisson steps 2.1 > 12.7 > 2.1 req/s"]
    assert "**2 measurements contradict the notebooks.**" in "\n".join(_summary(raw))
    # Swap the names of pt-1's and pt-dyn's runs at 8 senders: batching now "lowers" throughput 1.27 -> 0.78.
    swapped = [dict(r) for r in raw]
    one = next(r for r in swapped if r["stage"] == "pt-1" and r["tool"] == "servelab" and r["load"]["mode"] == "closed")
    dyn = next(r for r in swapped if r["stage"] == "pt-dyn" and r["tool"] == "servelab" and r["load"]["mode"] == "closed")
    one["stage"], dyn["stage"] = "pt-dyn", "pt-1"
    lines = _summary(swapped)
    [line] = [line for line in lines if line.startswith("  - pt-dyn ÷ pt-1")]
    ratio = one["stats"]["throughput_rps"] / dyn["stats"]["throughput_rps"]
    assert f"= **{ratio:.2f}×**" in line and ratio < 0.9
    assert "⚠ **contradicts 6_triton_python, which expects ≥ 1×**" in line
    assert "**3 measurements contradict the notebooks.**" in "\n".join(lines)


def _windowed(raw: list[dict], stage: str, windows: list[float]) -> list[dict]:
    """The quick lab's records with ``stage``'s capacity run (8 senders) measured in ``windows`` (req/s each, as
    the lab's windowed client keeps them in ``config["windows"]``), its throughput their mean."""
    raw = [json.loads(json.dumps(r)) for r in raw]
    run = _ours(raw, stage, "closed", 8)
    run["config"]["windows"] = {"window_s": 1.0, "throughput_rps": windows, "p50_ms": [None] * len(windows)}
    run["stats"]["throughput_rps"] = sum(windows) / len(windows)
    return raw


def _ray_line(raw: list[dict]) -> str:
    [line] = [line for line in _summary(raw) if line.startswith("  - ray-2 ÷ ray-1")]
    return line


def test_a_spread_that_straddles_the_band_is_too_noisy_to_tell_and_one_within_it_no_change() -> None:
    """Two tours of the same machine (issue 54: ray-2 ÷ ray-1 at 0.80× and then 1.31×): each ratio with its spread
    over the windows of both runs (any window of one ÷ any window of the other); where the spread reaches past the
    10 % band on one side and into it (issue 65) the line says "this machine was too noisy to tell" and what to do,
    neither a gain, a loss nor a contradiction of 10_ray. A spread wholly beyond the band is a loss, below what
    10_ray expects, flagged as it was without windows; a spread within it, no measurable change."""
    raw = _windowed(_raw(), "ray-1", [13.0, 14.5, 16.0])  # 14.5 req/s, one window 10 % off either way
    lower, higher = _windowed(raw, "ray-2", [9.6, 11.6, 13.6]), _windowed(raw, "ray-2", [17.0, 19.0, 21.0])
    for tour, ratio, low, high in ((lower, "0.80", "0.60", "1.05"), (higher, "1.31", "1.06", "1.62")):
        line = _ray_line(tour)
        assert f"= **{ratio}×** (windows {low}–{high}×: {lessons.TOO_NOISY} — the windows disagree: " \
               f"{lessons.RETRY});" in line, line
        assert "⚠" not in line
    assert "**1 measurement contradicts the notebooks.**" in "\n".join(_summary(lower))  # the step load's alone
    steady = _windowed(_windowed(raw, "ray-1", [14.3, 14.5, 14.7]), "ray-2", [11.4, 11.6, 11.8])
    line = _ray_line(steady)
    assert "= **0.80×** (windows 0.78–0.83×: lower);" in line and line.endswith("⚠ **contradicts 10_ray, which expects ≥ 1×**")
    # Windows within the band (tours at dd579fe: onnx-dyn ÷ onnx-1 1.04×, windows 1.01–1.09×): no measurable change.
    barely = _windowed(_windowed(raw, "ray-1", [14.3, 14.5, 14.7]), "ray-2", [14.9, 15.1, 15.3])
    assert "= **1.04×** (windows 1.01–1.07×: no measurable change);" in _ray_line(barely)
    # Without windows the ratio alone is judged, with NOISE for the spread it did not record: 0.89× contradicts.
    assert UNKNOWN in _ray_line(_raw()) and "⚠" in _ray_line(_raw())


def _rounds(raw: list[dict], top: str, bottom: str, rates: list[tuple[float, float]]) -> list[dict]:
    """``raw`` and the rounds the lab alternates ``top`` and ``bottom`` in: copies of each stage's run at 8 senders,
    ``rates`` their req/s round by round, as ``Lab.rounds`` labels them."""
    runs = {stage: _ours(raw, stage, "closed", 8) for stage in (top, bottom)}
    added = []
    for n, rated in enumerate(rates):
        for stage, rps in zip((top, bottom), rated):
            run = json.loads(json.dumps(runs[stage]))
            run["config"] |= {"run": "rounds", "pair": f"{top} ÷ {bottom}", "round": n,
                              "compares": "capacities: each at its own capacity's senders (8 and 8)"}
            run["stats"]["throughput_rps"] = rps
            added.append(run)
    return raw + added


def test_a_lesson_measured_in_rounds_takes_the_median_round_and_the_rounds_spread_decides() -> None:
    """Issue 65: the two stages alternate in rounds; the line says what it compares and how many rounds, its ratio is
    the median round's, and the rounds' spread, not the sweep's windows, gives the verdict."""
    raw = _rounds(_raw(), "ray-2", "ray-1", [(15.0, 10.0), (16.0, 10.0), (17.0, 10.0)])
    line = _ray_line(raw)
    assert line.startswith("  - ray-2 ÷ ray-1, capacities: each at its own capacity's senders (8 and 8), 3 rounds "
                           "alternating: 16.0 vs 10.0 req/s = **1.60×** (rounds 1.50–1.70×: higher);"), line
    # One round that goes the other way: the rounds disagree, and the line says so and what to do.
    noisy = _ray_line(_rounds(_raw(), "ray-2", "ray-1", [(15.0, 10.0), (9.0, 10.0), (17.0, 10.0)]))
    assert f"(rounds 0.90–1.70×: {lessons.TOO_NOISY} — the rounds disagree: {lessons.RETRY})" in noisy
    assert "⚠" not in noisy


def test_rounds_with_windows_are_judged_by_every_round_s_windows() -> None:
    """Issue 65's four tours: three rounds' ratios (0.93–0.99) did not bound the next tour's (1.18–1.54); each round's
    windows, one stage's over the other's in the same round, did. Rounds that agree within 5 % but whose windows
    reach past the band read too noisy to tell; windows that clear it, higher."""
    def rounds(windows: list[tuple[list[float], list[float]]]) -> str:
        raw = _rounds(_raw(), "ray-2", "ray-1", [(sum(a) / len(a), sum(b) / len(b)) for a, b in windows])
        for run, w in zip([r for r in raw if r["config"].get("run") == "rounds"], [w for pair in windows for w in pair]):
            run["config"]["windows"] = {"window_s": 1.0, "throughput_rps": w, "p50_ms": [None] * len(w)}
        return _ray_line(raw)
    close = rounds([([10.0, 12.0], [10.0, 12.0]), ([11.0, 11.0], [10.5, 11.5]), ([10.5, 11.5], [11.0, 11.0])])
    assert "= **1.00×** (rounds 0.83–1.20×: " + lessons.TOO_NOISY in close, close
    clear = rounds([([15.0, 16.0], [10.0, 10.5]), ([16.0, 16.5], [10.0, 10.2]), ([15.5, 16.0], [10.1, 10.3])])
    assert "(rounds 1.43–1.65×: higher)" in clear, clear


# The flags a record keeps of its CPU (machine.cpu_flags, servelab.core.hardware.recorded_flags).
AVX2_ONLY = ["sse2", "avx2", "f16c"]  # the 2-CPU AMD EPYC the committed tour ran on (its machine line: avx2 f16c)
VNNI = ["sse2", "avx2", "avx512f", "f16c", "avx512_vnni"]


def _int8_line(raw: list[dict], flags: list[str] | None, int8_rps: float | None = None) -> str:
    """The INT8 lesson's line of the quick lab's records, their machine given these CPU flags."""
    raw = [json.loads(json.dumps(r)) for r in raw]
    for r in raw:
        if flags is not None:
            r["machine"]["cpu_flags"] = flags
        if int8_rps is not None and r["stage"] == "fastapi-onnx-int8":
            r["stats"]["throughput_rps"] = int8_rps
    [line] = [line for line in _summary(raw) if line.startswith("  - fastapi-onnx-int8 ÷ fastapi-onnx")]
    return line


@pytest.mark.parametrize("flags, says", [
    (AVX2_ONLY, "the CPU that ran it has no fast 8-bit instructions (AVX2 without VNNI): INT8 is expected slower "
                "than fp32 there"),
    (VNNI, "the CPU that ran it has fast 8-bit instructions (AVX512-VNNI): INT8 is expected faster than fp32 there"),
    (["asimd", "asimddp"], "the CPU that ran it has fast 8-bit instructions (ARM dot product)"),
    (None, "whether the CPU that ran it has fast 8-bit instructions is not known (its flags were not read)"),
])
def test_the_int8_ratio_on_a_cpu_says_what_the_cpu_that_ran_it_can_do(flags: list[str] | None, says: str) -> None:
    """The INT8 stage's ratio is a lesson only with the CPU's 8-bit instructions said on the same line, from
    the flags the record kept (not this machine's: a report is read anywhere); the quick lab's records
    predate the flags (None)."""
    line = _int8_line(_raw(), flags)
    assert line.startswith("  - fastapi-onnx-int8 ÷ fastapi-onnx, capacity both at 8 senders: 4.8 vs 14.0 req/s = **0.35×**")
    assert line.endswith(says) or line.endswith(f"{says} — ⚠ **contradicts 4_fastapi, which expects ≥ 1×**"), line


def test_the_int8_bound_follows_the_cpu() -> None:
    """With VNNI INT8 should be faster (0.35× contradicts it); with AVX2 alone slower (then 1.3× does);
    elsewhere nothing is promised either way."""
    raw = _raw()
    assert "⚠ **contradicts 4_fastapi, which expects ≥ 1×**" in _int8_line(raw, VNNI)
    assert "⚠" not in _int8_line(raw, AVX2_ONLY) and "⚠" not in _int8_line(raw, None)
    faster = _int8_line(raw, AVX2_ONLY, int8_rps=18.2)  # 1.3× fastapi-onnx's 14.0 req/s
    assert "= **1.30×**" in faster and faster.endswith("⚠ **contradicts 4_fastapi, which expects ≤ 1×**")
    assert "⚠" not in _int8_line(raw, VNNI, int8_rps=18.2)
    assert "⚠" not in _int8_line(raw, ["asimd", "asimddp"], int8_rps=18.2) and "⚠" not in _int8_line(raw, None, 18.2)
    # A GPU run's INT8 ran on the GPU: no CPU line, the P100's bound.
    gpu = [json.loads(json.dumps(r)) for r in raw]
    for r in gpu:
        r["machine"]["cpu_flags"] = AVX2_ONLY
        r["config"]["device"] = "gpu" if r["tool"] == "servelab" else r["config"].get("device")
    [line] = [line for line in _summary(gpu) if line.startswith("  - fastapi-onnx-int8 ÷ fastapi-onnx")]
    assert "8-bit" not in line


def test_the_hardware_section_says_it_of_the_cpu_that_ran() -> None:
    from servelab.report.render import hardware_section

    records = [Record.model_validate(r) for r in _raw()]
    assert not hardware_section(records)["int8"]  # the flags were not kept then
    kept = [r.model_copy(update={"machine": {**r.machine, "cpu_flags": VNNI}}) for r in records]
    assert ("the CPU that ran these runs has fast 8-bit instructions (AVX512-VNNI): INT8 is expected faster "
            "than fp32 there") in hardware_section(kept)["int8"]


def test_the_expectations_are_in_one_table() -> None:
    """Every lesson reads what the notebooks say from EXPECT, on a CPU and on a GPU."""
    for lesson in lessons.LESSONS:
        assert lesson.key in lessons.EXPECT, lesson.key
        for device in ("cpu", "gpu"):
            assert lessons._expect(lesson.key, device).says


def test_open_loop_runs_without_a_capacity_are_drawn_against_the_offered_rate(tmp_path: Path) -> None:
    """A notebook's rate step measures a stage in open loop only: its plot is still drawn (in req/s)."""
    from servelab.report.plots import sweep_rate

    records = [Record.model_validate_json(line) for line in RECORDS.read_text().splitlines()]
    open_only = [r for r in records if r.load.mode == "open"]
    assert open_only and sweep_rate(open_only, tmp_path / "rate.png") and (tmp_path / "rate.png").stat().st_size


# tests/data/rollout_record.json: the rollout run of a `servelab lab --quick --stages fastapi-onnx,onnx-1` on a
# 2-CPU machine (2026-11-27), fp32 -> int8 under 16 senders, without its per-request list, timeline and series.
ROLLOUT = json.loads((Path(__file__).parents[1] / "data" / "rollout_record.json").read_text())


def _rollout_line(**changes) -> str:
    raw = json.loads(json.dumps(ROLLOUT))
    raw["rollout"].update(changes)
    [line] = [line for line in lessons.summary([Record.model_validate(raw)]) if line.startswith("  - fastapi-onnx, ")]
    return line


def test_a_rollout_is_flagged_when_a_request_failed_or_the_new_version_showed_late() -> None:
    o = ROLLOUT["rollout"]
    line = _rollout_line()
    assert f"= **{o['p99_during_ms'] / o['p99_before_ms']:.2f}×**" in line and "⚠" not in line
    assert f"{o['switch_after_ready_s']:.2f} s after it was ready" in line
    # Before the rollout's own check saw it ready (Ray's: a child process polls the replicas): said as such.
    early = _rollout_line(switch_after_ready_s=-0.4)
    assert "as soon as it was ready" in early and "⚠" not in early
    late = _rollout_line(switch_after_ready_s=lessons.ROLLOUT_SWITCH_AIM_S + 0.5)
    assert "⚠ **contradicts 4_fastapi, which expects the new version in the answers within 1 s of being ready" in late
    assert "⚠ **contradicts 4_fastapi, which expects no failed request" in _rollout_line(failed=2)
    slow = _rollout_line(p99_during_ms=o["p99_before_ms"] * (lessons.ROLLOUT_P99_AIM + 1))
    assert "⚠" in slow and "expects ≤ 3×" in slow


def _swept(stage: str, points: list[tuple[int, float]]) -> list[Record]:
    """A stage's concurrency sweep as the lab records it (p50 = senders / throughput, Little's law): one run per
    level, the last holding the curve and the capacity."""
    from servelab.measure.fractions import CAPACITY, curve_point
    from servelab.measure.records import Latency, Load, Stats

    runs = [Record(stage=stage, load=Load.sequential(None, duration_s=3.0) if c == 1 else
                   Load.closed(c, None, duration_s=3.0), config={"device": "cpu"},
                   stats=Stats(throughput_rps=rps, items_per_s=rps, latency=Latency(p50_ms=1e3 * c / rps,
                                                                                   p99_ms=2e3 * c / rps)))
            for c, rps in points]
    best = max(runs, key=lambda r: r.stats.throughput_rps)
    runs[-1].config = {**runs[-1].config, CAPACITY: {
        "throughput_rps": best.stats.throughput_rps, "concurrency": best.load.concurrency,
        "stopped": "the knee: ...", "curve": [curve_point(r) for r in runs]}}
    return runs


def test_a_lesson_compares_capacities_and_states_latency_at_one_concurrency(tmp_path: Path) -> None:
    """onnx-1 saturates at 4 senders, onnx-dyn at 16: the batching lesson is 600 ÷ 200 req/s, each at its own knee,
    never onnx-dyn held to onnx-1's senders; the p50 beside it is both at 8 senders (the most both have), and the
    report's capacity section shows both curves."""
    from servelab.report.render import capacity_section, render_report

    records = _swept("onnx-1", [(1, 100.0), (2, 180.0), (4, 200.0), (8, 198.0)]) + \
        _swept("onnx-dyn", [(1, 90.0), (2, 170.0), (4, 300.0), (8, 500.0), (16, 600.0), (32, 590.0)])
    [line] = [line for line in lessons.summary(records) if line.startswith("  - onnx-dyn ÷ onnx-1")]
    assert line.startswith("  - onnx-dyn ÷ onnx-1, capacity at 16 senders and 4 senders: 600.0 vs 200.0 req/s = **3.00×** "
                           f"{UNKNOWN}; p50 at 8 senders 16.0 vs 40.4 ms"), line
    section = "\n".join(capacity_section(records))
    assert "| onnx-1 | 200.0 | 4 senders | 1: 100.0 / 10.0 / 20.0 · 2: 180.0 / 11.1 / 22.2 · 4: 200.0 / 20.0 / 40.0 · " \
           "8: 198.0 / 40.4 / 80.8 | the knee: ... |" in section
    assert "| onnx-dyn | 600.0 | 16 senders | 1: 90.0 " in section
    assert "## Capacity: each stage's concurrency sweep" in render_report(records, tmp_path).read_text()
    assert capacity_section([Record.model_validate(r) for r in _raw()]) == []  # records made before the sweep


def test_an_open_loop_rate_is_a_fraction_of_the_capacity_its_own_client_measured() -> None:
    """onnx-dyn's Poisson 17.2 req/s was half of the capacity servelab's client measured (34.4 req/s at 8 senders);
    where perf_analyzer measured 43.0 req/s at 8 senders, the same rate is 0.40 of its own capacity, and the two
    clients' row says both (issue 54: 0.9 × servelab's capacity was 0.72 × perf_analyzer's)."""
    from servelab.report import compare

    raw = _raw()
    closed, poisson = _ours(raw, "onnx-dyn", "closed", 8), _ours(raw, "onnx-dyn", "open")
    theirs_closed = json.loads(json.dumps(closed)) | {"tool": "perf_analyzer"}
    theirs_closed["stats"]["throughput_rps"] = 43.0
    theirs_open = json.loads(json.dumps(poisson)) | {"tool": "perf_analyzer"}
    records = [Record.model_validate(r) for r in (*raw, theirs_closed, theirs_open)]
    [closed_pair, pair] = [p for p in compare.pairs(records) if p.stage == "onnx-dyn"]
    assert pair.fractions == pytest.approx((17.2 / closed["stats"]["throughput_rps"], 17.2 / 43.0))
    assert "| 0.50 / 0.40 |" in compare.markdown(compare.pairs(records))
    assert closed_pair.load == "concurrency 8" and closed_pair.fractions == (None, None)  # a closed loop offers no rate


def test_an_open_loop_is_compared_with_perf_analyzer_by_its_rules() -> None:
    """perf_analyzer times from its actual send and draws its own Poisson arrivals, so it sent 41.2 of 45.9 req/s
    (lab1 at ae03b57): servelab's p50 from the actual send and each client's throughput as a share of what it
    sent are compared; servelab's p50 from the scheduled send (the lessons') is shown beside them."""
    from servelab.report import compare

    ours = Record.model_validate(_ours(_raw(), "onnx-dyn", "open"))
    stats = {"offered_rps": 45.9, "throughput_rps": 45.8, "p50_from_send_ms": 13.6}
    ours = ours.model_copy(update={"stats": ours.stats.model_copy(update=stats | {
        "latency": ours.stats.latency.model_copy(update={"p50_ms": 15.37})})})
    theirs = ours.model_copy(update={"tool": "perf_analyzer", "stats": ours.stats.model_copy(update={
        "offered_rps": 41.25, "throughput_rps": 40.72, "p50_from_send_ms": None,
        "latency": ours.stats.latency.model_copy(update={"p50_ms": 12.78})})})
    [pair] = compare.pairs([ours, theirs])
    assert pair.verdict == "agree" and pair.p50_ratio == pytest.approx(12.78 / 13.6)
    assert pair.throughput_ratio == pytest.approx((40.72 / 41.25) / (45.8 / 45.9))
    assert "| 45.9 | 41.2 | 15.4 | 13.6 | 12.8 |" in compare.markdown([pair])
    slow = ours.model_copy(update={"stats": ours.stats.model_copy(update={"p50_from_send_ms": 15.0})})
    assert compare.pairs([slow, theirs])[0].verdict.startswith("DISAGREE")  # 12.78 ÷ 15.0 = 0.85
