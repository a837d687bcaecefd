"""The scripts in benchmarks/ run: each answers ``--help`` (its imports resolve against today's package, which a
renamed or moved function would break without any other test noticing)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from servelab.core.paths import REPO_ROOT

SCRIPTS = sorted(p for p in (REPO_ROOT / "benchmarks").glob("*.py") if "argparse" in p.read_text(encoding="utf-8"))


def test_the_benchmark_scripts_are_found() -> None:
    assert {p.name for p in SCRIPTS} >= {"retry_storm.py", "shared_batcher.py", "triton_queue_policy.py"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_benchmark_script_answers_help(script) -> None:
    done = subprocess.run([sys.executable, script.name, "--help"], cwd=script.parent, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
