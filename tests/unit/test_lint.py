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


def test_every_deferred_import_says_why():
    """An import inside a function (deferred: an optional extra, a slow import, a module only some machines
    have) says why on its line or in a comment just above its block of imports; else it belongs at the top."""
    import ast

    silent = []
    for path in sorted((Path(__file__).parents[2] / "servelab").rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in (n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))):
                above = inner.lineno - 2
                while above >= 0 and lines[above].strip().startswith(("import ", "from ")):
                    above -= 1
                if "#" not in lines[inner.lineno - 1] and (above < 0 or "#" not in lines[above]):
                    silent.append(f"{path.relative_to(path.parents[2])}:{inner.lineno}: {lines[inner.lineno - 1].strip()}")
    assert silent == []


def test_no_two_test_files_share_a_name():
    """pytest imports each test file by its name alone (no packages under tests/): two of one name in two tiers
    stop the whole session at collection."""
    from collections import Counter

    names = Counter(p.name for p in (Path(__file__).parents[1]).rglob("test_*.py"))
    assert [name for name, n in names.items() if n > 1] == []


def test_every_function_in_servelab_fits_one_screen():
    """No function in servelab/ runs past 60 lines, its docstring and decorators included: one that does is split
    where the reader needs a name (issue 67). The check itself is held by a planted long function."""
    import ast

    def too_long(source: str, where: str) -> list[str]:
        return [f"{where}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
                for node in ast.walk(ast.parse(source))
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60]

    planted = "def long():\n" + "    x = 1\n" * 60
    assert too_long(planted, "planted") == ["planted:1 long (61 lines)"]
    found = [line for path in sorted((REPO / "servelab").rglob("*.py"))
             for line in too_long(path.read_text(), str(path.relative_to(REPO)))]
    assert found == []
