"""Every name a notebook's cell uses is set by a cell before it that always runs (issue #66): a core cell that
is not one the student writes. A name from a cell the student writes, or from an optional section, is taken
with ``given(..., by=...)``, which names the cell to run where it was skipped, in place of a NameError."""

from __future__ import annotations

import ast
import builtins
import re

import pytest
from IPython.core.inputtransformer2 import TransformerManager

from servelab.run.walkthrough.cells import CellNotRun, given
from servelab.tools.lease_plan import code_cells
from servelab.tools.render_notebooks import sources

WRITTEN = re.compile(r"^# YOUR CODE: (.+)$", re.MULTILINE)
NOTEBOOKS = {path.stem: path for path in sources()}


def _tree(source: str) -> ast.Module:
    python = TransformerManager().transform_cell(source)  # `pa = !perf_analyzer ...`, %magics: as IPython runs them
    return compile(python, "<cell>", "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def _set(tree: ast.AST) -> set[str]:
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    names |= {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
              for a in n.names}
    names |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                                                ast.ExceptHandler)) and n.name}
    return names | {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in [*n.args, *n.kwonlyargs]}


def _used(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _given(tree: ast.AST) -> set[str]:
    """The names a cell takes with given(...)."""
    return {a.value for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "given"
            for a in n.args if isinstance(a, ast.Constant)}


def unguarded(text: str) -> list[str]:
    """``name (cell's first line)`` for each name a cell uses that no cell before it sets for sure."""
    sure: set[str] = set(dir(builtins)) | {"In", "Out", "get_ipython", "display"}
    by_section: dict[str, set[str]] = {}  # what an optional section's own cells set, for its later cells
    found = []
    for optional, source, section in code_cells(text):
        tree = _tree(source)
        here = _set(tree)
        for name in sorted(_used(tree) - here - sure - _given(tree) - by_section.get(section, set())):
            found.append(f"{name} ({source.partition(chr(10))[0]})")
        if WRITTEN.search(source):
            continue  # stops at its raise until the student writes it: sets nothing for sure
        if optional:
            by_section.setdefault(section, set()).update(here)
        else:
            sure |= here
    return found


@pytest.mark.parametrize("stem", sorted(NOTEBOOKS))
def test_every_name_a_cell_uses_is_set_before_or_given(stem: str) -> None:
    assert unguarded(NOTEBOOKS[stem].read_text(encoding="utf-8")) == []


def test_a_skipped_cell_s_check_names_the_cell_to_run() -> None:
    space: dict = {}
    run = lambda code: exec(code, space)  # noqa: E731 - a notebook's namespace, cell by cell
    run("from servelab.run.walkthrough.cells import given")
    with pytest.raises(CellNotRun, match=r"`pa` is not set: run the cell that starts `# YOUR CODE: at pt-1`"):
        run("given('pa', by='at pt-1')")
    run("pa = ['pt-1 run']")
    run("assert given('pa', by='at pt-1') == ['pt-1 run']")
    with pytest.raises(CellNotRun, match=r"`pa` is still the one `at pt-1` set: run the cell .*at pt-2x2"):
        run("given('pa', by='at pt-2x2')")
    run("pa = ['pt-2x2 run']; assert given('pa', by='at pt-2x2') == ['pt-2x2 run']")
    assert CellNotRun("x")._render_traceback_() == ["CellNotRun: x"]  # one line in Jupyter, not a traceback


def test_the_walk_finds_a_name_only_a_written_cell_sets() -> None:
    text = "```python\nfrom servelab.run.walkthrough.cells import given\n```\n\n```python\n# YOUR CODE: timing\nraise NotImplementedError\n```\n\n```python\nprint(wall_s)\n```\n"
    assert unguarded(text) == ["wall_s (print(wall_s))"]
    assert unguarded(text.replace("print(wall_s)", "print(given('wall_s', by='timing'))")) == []
    assert given  # the helper the notebooks import
