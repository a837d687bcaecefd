"""Render the lab notebooks from their Jupytext Markdown sources, and the generated parts of the docs.

Each ``notebooks/N_name.md`` is the source of truth; its ``.ipynb`` is generated with no outputs and stable cell
ids, so rendering twice gives the same bytes and ``--check`` compares files exactly. The generated parts of the
sources, README.md and docs/ (``servelab.tools.notebook_blocks``) are rewritten from the project first.
"""

import argparse
import sys
from pathlib import Path

import jupytext
import nbformat

from servelab.core.paths import REPO_ROOT
from servelab.tools.notebook_blocks import expand

NOTEBOOK_DIR = REPO_ROOT / "notebooks"


def sources(directory: Path = NOTEBOOK_DIR) -> list[Path]:
    """The numbered Markdown sources, in the order students run them (``10_`` after ``9_``, not after ``1_``)."""
    found = [p for p in directory.glob("[0-9]*_*.md") if p.name.split("_", 1)[0].isdigit()]
    return sorted(found, key=lambda p: (int(p.name.split("_", 1)[0]), p.name))


def pages(directory: Path = NOTEBOOK_DIR) -> list[Path]:
    """README and docs/ pages with generated parts; none when rendering another folder of notebooks."""
    if directory != NOTEBOOK_DIR:
        return []
    candidates = [REPO_ROOT / "README.md", NOTEBOOK_DIR / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
    return [p for p in candidates if "<!-- generated:" in p.read_text(encoding="utf-8")]


def to_notebook(source: Path) -> nbformat.NotebookNode:
    """One Markdown source, its generated parts brought up to date, as the notebook committed beside it."""
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
    """One line per file written or removed (with ``check``: that would be, and nothing changes); none: in sync."""
    files = [(page, str(page.relative_to(REPO_ROOT))) for page in pages(directory)]
    files += [(source, source.name) for source in sources(directory)]
    messages = [said for path, name in files if (said := _expand_file(path, name, check))]
    if not check:  # a second pass: the lease plan reads what the first pass wrote into the notebooks
        messages += [said for path, name in files if (said := _expand_file(path, name, check)) not in ("", *messages)]
    for source in sources(directory):
        target = source.with_suffix(".ipynb")
        nbformat.validate(nb := to_notebook(source))
        text = nbformat.writes(nb, version=4) + "\n"
        if target.exists() and target.read_text(encoding="utf-8") == text:
            continue
        if not check:
            target.write_text(text, encoding="utf-8")
        messages.append(f"{target.name} is out of sync with {source.name}" if check else f"rendered {target.name}")
    for orphan in sorted(set(directory.glob("*.ipynb")) - {s.with_suffix(".ipynb") for s in sources(directory)}):
        if not check:
            orphan.unlink()
        messages.append(f"{orphan.name} has no Markdown source" if check
                        else f"removed {orphan.name} (no Markdown source)")
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
