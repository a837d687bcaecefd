"""The layers of docs/architecture.md, held by import-linter: the contract is in pyproject.toml."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_imports_keep_to_the_layers():
    lint_imports = Path(sys.executable).parent / "lint-imports"
    # This checkout's servelab, whichever one the environment has installed.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([str(lint_imports), "--no-cache"], cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
