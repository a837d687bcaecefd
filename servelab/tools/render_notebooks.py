"""Render the lab notebooks from their Jupytext Markdown sources, and the generated parts of the docs.

The numbered ``notebooks/N_name.md`` files are the source of truth; the ``.ipynb`` beside
each one is generated (no outputs, stable cell ids) so that rendering twice gives the same
bytes and ``--check`` can compare files exactly. The parts of a source marked as generated
(code excerpts, stage configs, the original lab's figures: ``servelab.tools.notebook_blocks``) are
rewritten from the project first, in the source too; so are such parts of README.md and docs/ (e.g. how
long `make lab` takes, from the run recorded in docs/records/make-lab.json).

    python -m servelab.tools.render_notebooks          # write every .md part and .ipynb that is out of date
    python -m servelab.tools.render_notebooks --check  # only report; exit 1 if anything is out of sync
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jupytext
import nbformat

from servelab.core.paths import REPO_ROOT
from servelab.tools.notebook_blocks import expand

NOTEBOOK_DIR = REPO_ROOT / "notebooks"


def sources(directory: Path = NOTEBOOK_DIR) -> list[Path]:
    """The numbered Markdown sources, in the order students run them, by number (``10_`` after ``9_``,
    not after ``1_``); README.md is not one."""
    found = [p for p in directory.glob("[0-9]*_*.md") if p.name.split("_", 1)[0].isdigit()]
    return sorted(found, key=lambda p: (int(p.name.split("_", 1)[0]), p.name))


def pages(directory: Path = NOTEBOOK_DIR) -> list[Path]:
    """The Markdown pages beside the notebooks that hold generated parts too (README, docs/); none when
    rendering another folder of notebooks."""
    if directory != NOTEBOOK_DIR:
        return []
    candidates = [REPO_ROOT / "README.md", NOTEBOOK_DIR / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
    return [p for p in candidates if "<!-- generated:" in p.read_text(encoding="utf-8")]


def to_notebook(source: Path) -> nbformat.NotebookNode:
    """Read one Markdown source, its generated parts brought up to date, into the notebook that is
    committed beside it."""
    nb = jupytext.reads(expand(source.read_text(encoding="utf-8")), fmt="md")
    # jupytext's own bookkeeping would pair the .ipynb with the .md in Jupyter; students
    # edit the .ipynb freely, so leave it out.
    nb.metadata.pop("jupytext", None)
    for index, cell in enumerate(nb.cells):
        # jupytext draws random ids; fixed ones keep re-rendering byte-identical.
        cell.id = f"cell-{index}"
        # A generated ```python excerpt outside a `<!-- #region -->` would become a runnable cell.
        if cell.source.count("<!-- generated:") != cell.source.count("<!-- end generated -->"):
            raise ValueError(f"{source.name}, cell {index}: a generated part is split over cells; "
                             "wrap it in <!-- #region --> ... <!-- #endregion -->")
    return nb


def _expand_file(path: Path, name: str, check: bool) -> str:
    """Rewrite the generated parts of one file (with ``check``, only tell); what was (or would be) done."""
    text = path.read_text(encoding="utf-8")
    if (expanded := expand(text)) == text:
        return ""
    if check:
        return f"{name} has generated parts that are out of date"
    path.write_text(expanded, encoding="utf-8")
    return f"updated the generated parts of {name}"


def render(check: bool = False, directory: Path = NOTEBOOK_DIR) -> list[str]:
    """Bring the sources' generated parts up to date and make the .ipynb files mirror the sources;
    with ``check`` change nothing.

    Returns one line per file that was (or, with ``check``, would be) written or removed; an empty
    list means everything is in sync.
    """
    files = [(page, str(page.relative_to(REPO_ROOT))) for page in pages(directory)]
    files += [(source, source.name) for source in sources(directory)]
    messages = [said for path, name in files if (said := _expand_file(path, name, check))]
    if not check:  # a second pass: the lease plan reads what the first pass wrote into the notebooks
        messages += [said for path, name in files if (said := _expand_file(path, name, check)) not in ("", *messages)]
    targets = set()
    for source in sources(directory):
        target = source.with_suffix(".ipynb")
        targets.add(target)
        nbformat.validate(nb := to_notebook(source))
        text = nbformat.writes(nb, version=4) + "\n"
        if target.exists() and target.read_text(encoding="utf-8") == text:
            continue
        if check:
            messages.append(f"{target.name} is out of sync with {source.name}")
        else:
            target.write_text(text, encoding="utf-8")
            messages.append(f"rendered {target.name}")
    for orphan in sorted(set(directory.glob("*.ipynb")) - targets):
        if check:
            messages.append(f"{orphan.name} has no Markdown source")
        else:
            orphan.unlink()
            messages.append(f"removed {orphan.name} (no Markdown source)")
    return messages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servelab.tools.render_notebooks", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report out-of-sync notebooks, write nothing")
    args = parser.parse_args(argv)
    messages = render(check=args.check)
    for line in messages:
        print(line)
    if args.check and messages:
        print("run `make notebooks` to re-render", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
