"""Helpers both measurement notebooks use."""

import math
import re
import shlex
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import requests

from servelab.measure.records import Load, Record
from servelab.run.walkthrough import runbook

# GourmetGram's page title names the predicted class: "<label> · GourmetGram".
NUDGE_S = 120  # issue #66: a wait past 2 min says what it waits for and what to type
_TITLE = re.compile(r"<title>(.+?) · GourmetGram</title>")


def wait_until(what: str, probe: Callable[[], Any], want: Any, *, wait_s: float, interval_s: float = 2.0,
               to_type: str = "", nudge_s: float = NUDGE_S) -> None:
    """Call ``probe()`` until it returns ``want``, printing each new thing it sees (a student knows what the step
    waits for); TimeoutError after ``wait_s``, with the runbook's advice. Past ``nudge_s`` it says once what it
    waits for and, where the wait is for a line the student types (``to_type``), that line: a switch not typed
    yet otherwise looks like a slow one for the whole of ``wait_s``."""
    start, shown, nudge_at = time.monotonic(), None, nudge_s
    hint = f"; if you have not typed it yet, in your SSH session (in ~/servelab): {to_type}" if to_type else ""
    while (now := probe()) != want:
        waited = time.monotonic() - start
        if waited > wait_s:
            print(runbook.UNHEALTHY.advice())
            raise TimeoutError(f"waited {wait_s:g} s for {what}; still: {now}{hint}")
        if now != shown:
            print(f"waiting for {what}; now: {now}")
            shown = now
        if waited > nudge_at:
            nudge_at = math.inf  # once
            print(f"still waiting after {nudge_s / 60:g} min (at most {wait_s / 60:g}) for {what}{hint}")
        time.sleep(interval_s)


def utilization(record: Record) -> str:
    """How busy the CPU and each GPU were, on average, during the measured run."""
    if (m := record.monitors) is None:
        return "no utilization recorded"
    gpus = [f"GPU {g.index} {sum(g.util_pct) / len(g.util_pct):.0f}% busy" for g in m.gpus if g.util_pct]
    # Without GPU samples, gpu_note says why (e.g. no NVML on this machine).
    return f"CPU {m.cpu_mean_pct or 0:.0f}% busy, " + (", ".join(gpus) or m.gpu_note or "no GPU samples")


def gourmetgram_label(page: str) -> str | None:
    """The class a GourmetGram result page shows, or None when it shows none."""
    return found.group(1) if (found := _TITLE.search(page)) else None


def check_gourmetgram(page: requests.Response) -> str:
    """A student's upload to GourmetGram: right where it answered 200 with a page that names a predicted class."""
    label = gourmetgram_label(page.text)
    if page.status_code != 200 or label is None:
        return (f"wrong: HTTP {page.status_code}, {label or 'no prediction on the page'}: post the photo as the form's "
                "file field `photo`, files={'photo': (name, bytes)}")
    return f"right: GourmetGram shows {label}"


def try_gourmetgram(url: str, photo: Path, *, backend: str | None = None, wait_s: float = 0) -> None:
    """Classify ``photo`` through GourmetGram at ``url`` (empty: use the browser) and print its answer; with
    ``backend``, first wait until it uses that one (switching it restarts the container)."""
    if not url:
        print("no GourmetGram URL (FLASK_URL is empty): try GourmetGram in your browser instead")
        return
    if backend is not None:
        def serving() -> str:
            try:
                return requests.get(f"{url}/health", timeout=5).json()["backend"]
            except (requests.RequestException, ValueError, KeyError) as exc:
                return f"no answer ({type(exc).__name__})"

        wait_until(f"GourmetGram with BACKEND={backend}", serving, backend, wait_s=wait_s,
                   to_type=f"BACKEND={backend} docker compose -f docker/docker-compose-triton.yaml up -d flask")
    page = requests.post(f"{url}/classify", files={"photo": (photo.name, photo.read_bytes())}, timeout=60)
    name = f"GourmetGram ({backend})" if backend else "GourmetGram"
    print(f"{name}: HTTP {page.status_code}, {gourmetgram_label(page.text) or 'no prediction'}")


def latest(records: Iterable[Record]) -> list[Record]:
    """The newest record of each measurement, in first-run order: a step run twice counts once."""
    return list({(r.stage, r.tool, r.load.label(), r.batch): r for r in records}.values())


def check_best(best: dict[str, float], records: Iterable[Record]) -> str:
    """A student's highest req/s per stage, against the records' own."""
    want: dict[str, float] = {}
    for r in records:
        want[r.stage] = max(want.get(r.stage, 0.0), r.stats.throughput_rps)
    wrong = sorted(s for s in set(want) | set(best) if not math.isclose(best.get(s, -1), want.get(s, -2), rel_tol=0.01))
    if wrong:
        raise ValueError(f"not the records' best for {', '.join(wrong)}: yours "
                         f"{ {s: best.get(s) for s in wrong} }, the records' { {s: want.get(s) for s in wrong} }; "
                         "one entry per stage, its highest stats.throughput_rps")
    top = max(want, key=want.__getitem__, default=None)
    return f"correct: {len(want)} stages; {top} served the most, {want[top]:.1f} req/s" if top else "correct: no runs yet"


def drawn(folder: Path, plots: Iterable[str]) -> list[Path]:
    """The plots among ``plots`` that the report drew (only where the records hold data of their kind)."""
    return [folder / name for name in plots if (folder / name).exists()]


def load_command(kind: str, where: list[str], load: Load, stage: str, batch: int = 1) -> str:
    """The `servelab load` command a helper's run of ``load`` stands for (``where``: its target's options),
    printed so that a student can type it."""
    argv = ["servelab", "load", kind, *where, "--stage", stage]
    if batch > 1:
        argv += ["--batch", str(batch)]
    if load.requests:
        argv += ["--requests", str(load.requests)]
    if load.duration_s:
        argv += ["--duration", f"{load.duration_s:g}"]
    argv += ["--warmup", str(load.warmup)]
    if load.mode == "closed":
        argv += ["--concurrency", str(load.concurrency)]
    elif load.mode == "open":
        argv += ["--rate", f"{load.rate:g}", "--arrivals", str(load.arrivals)]
    return "$ " + shlex.join(argv)
