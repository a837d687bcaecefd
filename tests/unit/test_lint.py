"""Static checks on our own code: pyflakes' rules (unused imports and names, undefined names) and isort's
import order, as pyproject's [tool.ruff] selects them (`ruff check --fix` sorts them)."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_no_unused_or_undefined_names_and_imports_in_order():
    ruff = Path(sys.executable).parent / "ruff"
    result = subprocess.run(
        [str(ruff), "check", "--no-cache", "servelab", "tests", "fastapi_pt", "fastapi_onnx",
         "flask_app", "models_staging", "benchmarks"],
        cwd=REPO, capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
