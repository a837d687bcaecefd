"""What one batcher process behind every server process (``SHARED_BATCHER``) does to ``fastapi-onnx``, and with
``--simulated-gpu-ms`` what batching does where a batch costs what one image does, as on a GPU.

The service as ``servelab serve`` starts it, side by side, with the same ``WORKERS`` server processes (default:
one per CPU) and the stage's batching: each process with its own model (the CPU's default), and all in front of
one batcher process that holds the model (the GPU's default). ``--rounds`` rounds, each a closed loop of
``--senders`` for ``--seconds`` on one service then on the next. Printed per round: req/s, the mean batch the model
ran, the service's CPU ms per request (every process of it), and the ratios of req/s. On the CPU batching does
not pay, so the aim there is no loss (shared ÷ own ≥ 0.9); the record: docs/records/shared-batcher-2cpu.log.

``--simulated-gpu-ms MS`` runs every model behind the GPU-shaped stand-in (``SIMULATED_GPU_MS``,
``servelab.core.simulated_gpu``) and adds ``fastapi-onnx-dyn`` beside ``fastapi-onnx`` (both with and without
the shared batcher) and Triton's ``onnx-1`` and ``onnx-dyn`` (its local ONNX stand-in behind the same wait): a
design that cannot fill its batches here will not fill them on a GPU either. The aims are those of a GPU:
``fastapi-onnx-dyn ÷ fastapi-onnx`` and ``onnx-dyn ÷ onnx-1`` ≥ 2, the shared batcher ≥ one model per process.
``--record`` writes the rounds as JSON (docs/records/simulated-gpu-2cpu.json, from which docs/benchmarks.md is
generated).

    .venv/bin/python benchmarks/shared_batcher.py [--simulated-gpu-ms 9 --record docs/records/simulated-gpu-2cpu.json]
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from statistics import median

import httpx
import psutil

from servelab.core.catalogue import FASTAPI, STAGES, TRITON, Lesson, Stage, compared
from servelab.core.paths import DEFAULT_IMAGE, REPO_ROOT
from servelab.core.settings import get_settings
from servelab.core.simulated_gpu import label
from servelab.measure.loadgen import run_bench
from servelab.measure.records import Load
from servelab.run.families import TritonAdapter, serve_fastapi
from servelab.run.lab_run import machine_line
from servelab.run.reference import defaults

SERVICES = {"own models": "0", "shared batcher": "1"}
# The batching lesson's ONNX pair of each family, from the catalogue: (batching, one at a time).
DYN, ONE, TRITON_DYN, TRITON_ONE = (name for family in (FASTAPI, TRITON) for name in next(
    pair for pair in compared(Lesson.BATCHING) if STAGES[pair[0]].family == family.name and STAGES[pair[0]].runtime == "onnx"))
# (numerator, denominator, aim) of each ratio printed; the first where only SHARED_BATCHER differs.
RATIOS = [(f"{ONE}, shared batcher", f"{ONE}, own models", 0.9)]
SIMULATED_RATIOS = [(f"{DYN}, own models", f"{ONE}, own models", 2.0),
                    (f"{DYN}, shared batcher", f"{ONE}, shared batcher", 2.0),
                    (f"{DYN}, shared batcher", f"{DYN}, own models", 1.0),
                    (TRITON_DYN, TRITON_ONE, 2.0)]


def cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds of a server process and of each process under it, by PID (a model's reload replaces some)."""
    root = psutil.Process(pid)
    return {p.pid: sum(p.cpu_times()[:2]) for p in [root, *root.children(recursive=True)]}


def spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds between two ``cpu_s``: of the processes alive at the end, from their start where they are new."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


def counted(url: str, images: str, batches: str, **labels: str) -> tuple[float, float]:
    """(images, inferences) a Prometheus endpoint has counted so far: its ``images`` and ``batches`` series."""
    value = {}
    for line in httpx.get(url).text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in (images, batches) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            value[name] = value.get(name, 0.0) + float(line.split()[-1])
    return value.get(images, 0.0), value.get(batches, 0.0)


FASTAPI_BATCHES = ("servelab_batch_size_sum", "servelab_batch_size_count")  # the service's (images, inferences)
TRITON_BATCHES = ("nv_inference_count", "nv_inference_exec_count")


def window(target, load: Load, stage: str, stand_in: str | None, metrics: str, batches: tuple[str, str], pid: int,
           **labels: str) -> dict:
    """One closed-loop window through the project's measuring routine: req/s, the mean batch the model ran (from
    the server's ``metrics``), the service's CPU ms per request, the errors."""
    before, cpu = counted(metrics, *batches, **labels), cpu_s(pid)
    stats = run_bench(target, load, stage=stage, stand_in=stand_in).stats
    after = counted(metrics, *batches, **labels)
    return {"rps": round(stats.throughput_rps, 1),
            "mean_batch": round((after[0] - before[0]) / max(1, after[1] - before[1]), 2),
            "cpu_ms_per_request": round(spent(cpu, cpu_s(pid)) * 1000 / max(1, stats.requests), 1),
            "errors": stats.errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--senders", type=int, default=8, help="closed-loop senders")
    parser.add_argument("--seconds", type=float, default=15.0, help="each measured window")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--simulated-gpu-ms", type=float, default=0.0,
                        help="every model behind the GPU-shaped stand-in, this many ms per batch; adds the batching stages")
    parser.add_argument("--record", type=Path, help="also write the rounds here (JSON)")
    parser.add_argument("--logs", type=Path, default=Path(tempfile.gettempdir()) / "servelab-shared-batcher",
                        help="the servers' logs")
    args = parser.parse_args()
    settings = get_settings()
    env = {"MODEL_DIR": str(settings.model_dir), "ORT_PROVIDERS": "cpu", "WORKERS": str(os.cpu_count())}
    stages, ratios, stand_in = [ONE], RATIOS, None
    if args.simulated_gpu_ms:
        # Triton's stubs read it from the server's environment, inherited from this process.
        os.environ["SIMULATED_GPU_MS"] = env["SIMULATED_GPU_MS"] = f"{args.simulated_gpu_ms:g}"
        stages, ratios = [ONE, DYN], RATIOS + SIMULATED_RATIOS
        stand_in = label(args.simulated_gpu_ms, settings.max_batch_size)
    load = Load.closed(args.senders, requests=None, duration_s=args.seconds, warmup_s=2.0)
    image = DEFAULT_IMAGE.read_bytes()
    record = {"command": shlex.join(["benchmarks/shared_batcher.py", *sys.argv[1:]]),
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                       cwd=REPO_ROOT).stdout.strip(),
              "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), "machine": machine_line(),
              "load_average_before": os.getloadavg()[0], "simulated_gpu_ms": args.simulated_gpu_ms,
              "stand_in": stand_in, "senders": args.senders,
              "seconds": args.seconds, "rounds": []}
    with ExitStack() as stack:
        measure = {}  # name -> what measures one window of it
        for stage in stages:
            for name, shared in SERVICES.items():
                # The stand-in measures the stages as the lab does; without it the service as `servelab serve` starts it.
                as_run = STAGES[stage] if args.simulated_gpu_ms else defaults(STAGES[stage])
                server = serve_fastapi(stack, as_run, args.logs / f"{stage}-{shared}", {**env, "SHARED_BATCHER": shared})
                measure[f"{stage}, {name}"] = partial(window, server.target(as_run, image), load, stage, stand_in,
                                                      f"{server.url}/metrics", FASTAPI_BATCHES, server.pid)
        if args.simulated_gpu_ms:
            triton = stack.enter_context(TritonAdapter(args.logs / "triton", settings.triton_model_repository, "cpu",
                                                      manifest=settings.model_dir / "food11.json").start(STAGES[TRITON_ONE]))

            def triton_window(stage: Stage) -> dict:
                triton.switch(stage)
                return window(triton.target(stage, image), load, stage.name, stand_in,
                              f"http://127.0.0.1:{triton.server.ports.metrics}/metrics", TRITON_BATCHES, triton.pid,
                              model=stage.triton.model)
            measure |= {name: partial(triton_window, STAGES[name]) for name in (TRITON_ONE, TRITON_DYN)}
        for round_ in range(1, args.rounds + 1):
            rows = {name: measured() for name, measured in measure.items()}
            for name, row in rows.items():
                print(f"round {round_}, {name}: {row['rps']} req/s, mean batch {row['mean_batch']}, "
                      f"{row['cpu_ms_per_request']} CPU ms per request, errors {row['errors'] or 'none'}", flush=True)
            for top, bottom, aim in ratios:
                print(f"round {round_}: {top} / {bottom} = {rows[top]['rps'] / rows[bottom]['rps']:.2f} "
                      f"(aim >= {aim:.2f})", flush=True)
            record["rounds"].append(rows)
    record["load_average_after"] = os.getloadavg()[0]
    record["ratios"] = [{"top": top, "bottom": bottom, "aim": aim,
                         "each_round": [round(r[top]["rps"] / r[bottom]["rps"], 2) for r in record["rounds"]]}
                        for top, bottom, aim in ratios]
    for ratio in record["ratios"]:
        ratio["median"] = round(median(ratio["each_round"]), 2)
    if args.record:
        args.record.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
