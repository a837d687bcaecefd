"""`servelab benchmark --stage variants`: the variants against fp32 in one run, for real (short windows)."""

import subprocess
import sys

from servelab.paths import REPO_ROOT


def test_variants_are_measured_against_fp32(artifacts):
    run = subprocess.run([sys.executable, "-m", "servelab", "benchmark", "--stage", "variants", "--variants", "u8",
                          "int8", "--duration", "1", "--rounds", "1"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {line.split("|")[1].strip(): line for line in run.stdout.splitlines() if line.startswith("| ")}
    assert {"fp32", "u8", "int8"} <= set(rows)
    assert rows["fp32"].split("|")[4].strip() == "1.00" and rows["fp32"].split("|")[6].strip() == "1.00"
    assert "≥ 1.15" in rows["u8"] and "best INT8" in rows["int8"]


def test_ray_serve_is_measured_against_fastapi_onnx_dyn(artifacts):
    run = subprocess.run([sys.executable, "-m", "servelab", "benchmark", "--stage", "ray", "--duration", "2",
                          "--rounds", "1"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {line.split("|")[1].strip().split(":")[0]: line.split("|") for line in run.stdout.splitlines()
            if line.startswith("| fastapi") or line.startswith("| ray")}
    assert set(rows) == {"fastapi-onnx-dyn", "ray-dyn"}
    assert rows["fastapi-onnx-dyn"][3].strip() == "1.00" and float(rows["ray-dyn"][3]) > 0
    # Time inside the app (Server-Timing) plus outside it is the client's mean latency: both measured.
    assert all(float(row[9]) > 0 and float(row[10]) > 0 for row in rows.values())
