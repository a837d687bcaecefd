"""The lab notebooks: rendered from their sources, and clean. Executed in a real kernel:
tests/e2e/test_notebooks.py."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from notebook_harness import parameter_names, parameters_cells
from servelab.tools.render_notebooks import NOTEBOOK_DIR, render, sources, to_notebook

SOURCES = sources()
STEMS = [source.stem for source in SOURCES]
PROVISIONING = ["1_create_lease", "2_create_server_nvidia", "9_ray_setup", "11_delete_resources"]

FORBIDDEN = {
    "a Jupyter token": r"[?&]token=\w",
    "an OpenStack password": r"OS_PASSWORD\s*[=:]\s*\S",
    "an application credential secret": r"OS_APPLICATION_CREDENTIAL_SECRET\s*[=:]\s*\S",
    "a private key": r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
    "a GitHub token": r"\bgh[pousr]_[A-Za-z0-9]{20,}",
    "an absolute path on the node": r"/home/cc/",
    "an unpinned image": r":latest\b",
}


def _cells(nb: nbformat.NotebookNode) -> list[tuple[str, str, list[str]]]:
    return [(cell.cell_type, cell.source, cell.metadata.get("tags", [])) for cell in nb.cells]


def _code(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [cell for cell in nb.cells if cell.cell_type == "code"]


# --- rendering -------------------------------------------------------------------------------


def test_provisioning_notebooks_exist() -> None:
    assert {"0_intro", *PROVISIONING} <= set(STEMS)


def test_sources_are_in_the_order_of_their_numbers(tmp_path: Path) -> None:
    """By number, not by name: `10_` and `11_` come after `9_`, not after `1_`."""
    for name in ("11_last.md", "10_ray.md", "9_ray_setup.md", "2_b.md", "1_a.md", "0_intro.md", "README.md", "x_1.md"):
        (tmp_path / name).write_text("# x\n")
    assert [p.name for p in sources(tmp_path)] == ["0_intro.md", "1_a.md", "2_b.md", "9_ray_setup.md", "10_ray.md",
                                                  "11_last.md"]
    assert [int(stem.split("_")[0]) for stem in STEMS] == list(range(len(STEMS)))  # the lab's: 0, 1, 2, ..., no gap


@pytest.mark.parametrize("source", SOURCES, ids=STEMS)
def test_committed_ipynb_matches_its_source(source: Path) -> None:
    committed = nbformat.read(source.with_suffix(".ipynb"), as_version=4)
    rendered = to_notebook(source)
    assert _cells(committed) == _cells(rendered)
    assert committed.metadata == rendered.metadata


def test_render_check_finds_everything_in_sync() -> None:
    assert render(check=True) == []


def test_render_writes_checks_and_removes(tmp_path: Path) -> None:
    shutil.copy(NOTEBOOK_DIR / "11_delete_resources.md", tmp_path)
    (tmp_path / "README.md").write_text("# not a notebook\n")
    (tmp_path / "9_gone.ipynb").write_text("{}")

    assert render(check=True, directory=tmp_path) == [
        "11_delete_resources.ipynb is out of sync with 11_delete_resources.md",
        "9_gone.ipynb has no Markdown source",
    ]
    assert render(directory=tmp_path) == ["rendered 11_delete_resources.ipynb", "removed 9_gone.ipynb (no Markdown source)"]
    assert render(check=True, directory=tmp_path) == []
    assert sorted(path.name for path in tmp_path.iterdir()) == ["11_delete_resources.ipynb", "11_delete_resources.md", "README.md"]

    first = (tmp_path / "11_delete_resources.ipynb").read_text()
    assert render(directory=tmp_path) == []  # rendering is stable: same bytes, nothing rewritten
    assert (tmp_path / "11_delete_resources.ipynb").read_text() == first

    source = tmp_path / "11_delete_resources.md"
    source.write_text(source.read_text() + "\nOne more line.\n")
    assert render(check=True, directory=tmp_path) == ["11_delete_resources.ipynb is out of sync with 11_delete_resources.md"]


# --- what is committed -----------------------------------------------------------------------


@pytest.mark.parametrize("source", SOURCES, ids=STEMS)
def test_ipynb_is_valid_and_has_no_outputs(source: Path) -> None:
    nb = nbformat.read(source.with_suffix(".ipynb"), as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    for cell in _code(nb):
        assert cell.outputs == [] and cell.execution_count is None, cell.source


@pytest.mark.parametrize("path", [*SOURCES, *(source.with_suffix(".ipynb") for source in SOURCES)], ids=lambda path: path.name)
def test_no_secrets_or_machine_specifics(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    found = [what for what, pattern in FORBIDDEN.items() if re.search(pattern, text)]
    assert found == [], f"{path.name} contains {', '.join(found)}"


@pytest.mark.parametrize("source", SOURCES, ids=STEMS)
def test_first_cell_says_where_it_runs_and_which_kernel(source: Path) -> None:
    first = to_notebook(source).cells[0]
    assert first.cell_type == "markdown"
    assert re.search(r"\*\*Runs in:\*\* \S", first.source)
    assert re.search(r"\*\*Kernel:\*\* \S", first.source)


@pytest.mark.parametrize("source", SOURCES, ids=STEMS)
def test_parameters_cells_only_assign_literals(source: Path) -> None:
    """So values can be injected (as here, or by papermill) and students see plain settings."""
    for cell in parameters_cells(to_notebook(source)):
        assert cell.cell_type == "code"
        for statement in ast.parse(cell.source).body:
            assert isinstance(statement, (ast.Assign, ast.AnnAssign)), cell.source
            ast.literal_eval(statement.value)


@pytest.mark.parametrize("stem", PROVISIONING)
def test_net_id_is_set_once_at_the_top(stem: str) -> None:
    nb = to_notebook(NOTEBOOK_DIR / f"{stem}.md")
    code = _code(nb)
    assert code[0] in parameters_cells(nb)
    assert parameter_names(code[0])[0] == "NET_ID"
    assert 'NET_ID = ""' in code[0].source
    assigning = [cell.source for cell in code if re.search(r"^NET_ID\s*[:=]", cell.source, re.MULTILINE)]
    assert assigning == [code[0].source]
