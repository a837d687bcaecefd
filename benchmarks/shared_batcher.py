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
from pathlib import Path
from statistics import median

import httpx
from retry_storm import cpu_s

from servelab.core.catalogue import STAGES
from servelab.core.paths import DEFAULT_IMAGE, REPO_ROOT
from servelab.core.settings import get_settings
from servelab.core.simulated_gpu import label
from servelab.measure.loadgen import run_bench
from servelab.measure.records import Load
from servelab.run.families import TritonFamily, serve_fastapi
from servelab.run.lab_run import machine_line
from servelab.run.reference import defaults

SERVICES = {"own models": "0", "shared batcher": "1"}
# (numerator, denominator, aim) of each ratio printed; the first where only SHARED_BATCHER differs.
RATIOS = [("fastapi-onnx, shared batcher", "fastapi-onnx, own models", 0.9)]
SIMULATED_RATIOS = [("fastapi-onnx-dyn, own models", "fastapi-onnx, own models", 2.0),
                    ("fastapi-onnx-dyn, shared batcher", "fastapi-onnx, shared batcher", 2.0),
                    ("fastapi-onnx-dyn, shared batcher", "fastapi-onnx-dyn, own models", 1.0),
                    ("onnx-dyn", "onnx-1", 2.0)]


def counted(url: str, images: str, batches: str, **labels: str) -> tuple[float, float]:
    """(images, inferences) a Prometheus endpoint has counted so far: its ``images`` and ``batches`` series."""
    value = {}
    for line in httpx.get(url).text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in (images, batches) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            value[name] = value.get(name, 0.0) + float(line.split()[-1])
    return value.get(images, 0.0), value.get(batches, 0.0)


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
    stages, ratios, stand_in = ["fastapi-onnx"], RATIOS, None
    if args.simulated_gpu_ms:
        # Triton's stubs read it from the server's environment, inherited from this process.
        os.environ["SIMULATED_GPU_MS"] = env["SIMULATED_GPU_MS"] = f"{args.simulated_gpu_ms:g}"
        stages, ratios = ["fastapi-onnx", "fastapi-onnx-dyn"], RATIOS + SIMULATED_RATIOS
        stand_in = label(args.simulated_gpu_ms, settings.max_batch_size)
    load = Load.closed(args.senders, requests=None, duration_s=args.seconds, warmup_s=2.0)
    image = DEFAULT_IMAGE.read_bytes()
    record = {"command": shlex.join(["benchmarks/shared_batcher.py", *sys.argv[1:]]),
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                       cwd=REPO_ROOT).stdout.strip(),
              "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), "machine": machine_line(),
              "load_average_before": os.getloadavg()[0], "stand_in": stand_in, "senders": args.senders,
              "seconds": args.seconds, "rounds": []}
    with ExitStack() as stack:
        measured = {}  # name -> a function that measures it once: (req/s, mean batch, CPU ms per request, errors)
        for stage in stages:
            for name, shared in SERVICES.items():
                # The stand-in measures the stages as the lab does; without it the service as `servelab serve` starts it.
                as_run = STAGES[stage] if args.simulated_gpu_ms else defaults(STAGES[stage])
                server = serve_fastapi(stack, as_run, args.logs / f"{stage}-{shared}",
                                       {**env, "SHARED_BATCHER": shared})

                def fastapi(server=server, stage=stage):
                    metrics = f"{server.url}/metrics"
                    before, spent = counted(metrics, "servelab_batch_size_sum", "servelab_batch_size_count"), cpu_s(server.pid)
                    run = run_bench(server.target(STAGES[stage], image), load, stage=stage, stand_in=stand_in)
                    return run, counted(metrics, "servelab_batch_size_sum", "servelab_batch_size_count"), before, cpu_s(server.pid) - spent
                measured[f"{stage}, {name}"] = fastapi
        if args.simulated_gpu_ms:
            triton = stack.enter_context(TritonFamily(args.logs / "triton", settings.triton_model_repository, "cpu",
                                                      manifest=settings.model_dir / "food11.json").start(STAGES["onnx-1"]))
            for stage in ("onnx-1", "onnx-dyn"):
                def triton_stage(stage=STAGES[stage]):
                    triton.switch(stage)
                    metrics, model = f"http://127.0.0.1:{triton.server.ports.metrics}/metrics", stage.triton.model
                    before, spent = counted(metrics, "nv_inference_count", "nv_inference_exec_count", model=model), cpu_s(triton.pid)
                    run = run_bench(triton.target(stage, image), load, stage=stage.name, stand_in=stand_in)
                    after = counted(metrics, "nv_inference_count", "nv_inference_exec_count", model=model)
                    return run, after, before, cpu_s(triton.pid) - spent
                measured[stage] = triton_stage
        for round_ in range(1, args.rounds + 1):
            rows = {}
            for name, measure in measured.items():
                run, after, before, spent = measure()
                s = run.stats
                rows[name] = {"rps": round(s.throughput_rps, 1),
                              "mean_batch": round((after[0] - before[0]) / max(1, after[1] - before[1]), 2),
                              "cpu_ms_per_request": round(spent * 1000 / max(1, s.requests), 1), "errors": s.errors}
                print(f"round {round_}, {name}: {rows[name]['rps']} req/s, mean batch {rows[name]['mean_batch']}, "
                      f"{rows[name]['cpu_ms_per_request']} CPU ms per request, errors {s.errors or 'none'}", flush=True)
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
