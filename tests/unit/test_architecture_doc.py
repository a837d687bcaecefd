"""docs/architecture.md and the package docstrings name real things: every path, module and name they put in
backticks resolves in this checkout (a file or folder, a module's top-level name, a word of our code). A
rename that forgets the docs fails here."""

import ast
import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CODE = ("servelab", "fastapi_pt", "fastapi_onnx", "flask_app", "benchmarks", "tests", "models_staging")
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@cache
def words() -> frozenset[str]:
    """Every word of our code and its configuration (Python, Triton configs, compose files, pyproject): a
    name the docs give in backticks must be one of them, or it was renamed or removed."""
    text = []
    for folder in (*CODE, "docker"):
        for path in (REPO / folder).rglob("*"):
            if path.suffix in (".py", ".pbtxt", ".yml", ".yaml", ".toml") and "__pycache__" not in path.parts:
                text.append(path.read_text(errors="replace"))
    text.append((REPO / "pyproject.toml").read_text())
    return frozenset(WORD.findall("\n".join(text)))


SUFFIXES = (".py", ".md", ".toml", ".pbtxt", ".json", ".txt", ".yml", ".yaml", ".log", ".ipynb", ".jpg", ".cfg")
GENERATED = ("results/", ".venv/", "models/")  # what a run writes: not in a checkout


def exists(path: str, base: Path) -> bool:
    roots = (base, REPO, REPO / "servelab")
    if "*" in path:
        return any(any(root.glob(path)) for root in roots)
    return any((root / path).exists() or (root / f"{path}.py").exists() for root in roots)


def module_file(path: str, base: Path) -> Path | None:
    for root in (base, REPO / "servelab", REPO):
        if (root / f"{path}.py").exists():
            return root / f"{path}.py"
    return None


def problems(text: str, base: Path) -> list[str]:
    """What ``text`` puts in backticks and this checkout lacks: ``a/b.py`` (or a folder, or a glob) that is not
    there, ``a/b.name`` whose module defines no ``name``, a name that no file of our code holds."""
    found = []
    for token in re.findall(r"`([^`\n]+)`", text):
        token = token.split(": ")[0].strip()
        if "/" in token and " " not in token and not token.startswith(("http", "/", "~", "$", "-", "<")):
            if token.startswith(GENERATED) or "<" in token:
                continue
            last = token.rstrip("/").rsplit("/", 1)[-1]
            stem, dot, name = last.rpartition(".")
            if dot and not last.endswith(SUFFIXES) and (module := module_file(token.rsplit(".", 1)[0], base)):
                if name not in defined_in(module):
                    found.append(f"{token}: {module.relative_to(REPO)} defines no {name}")
            elif not exists(token.rstrip("/"), base):
                found.append(f"{token}: no such file or folder")
        elif WORD.fullmatch(token) and token not in words():
            found.append(f"{token}: not a word of our code")
    return found


@cache
def defined_in(module: Path) -> frozenset[str]:
    tree = ast.parse(module.read_text())
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    names |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    names |= {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    return frozenset(names)


def test_the_architecture_doc_names_real_things():
    assert problems((REPO / "docs/architecture.md").read_text(), REPO / "servelab") == []


@pytest.mark.parametrize("init", sorted(p.relative_to(REPO).as_posix() for p in (REPO / "servelab").rglob("__init__.py")))
def test_each_package_docstring_names_real_things(init):
    path = REPO / init
    assert problems(ast.get_docstring(ast.parse(path.read_text())) or "", path.parent) == []


def test_the_check_finds_a_stale_name():
    assert problems("`core/inference.NoSuchClass` and `servers/nowhere.py`", REPO / "servelab") == [
        "core/inference.NoSuchClass: servelab/core/inference.py defines no NoSuchClass",
        "servers/nowhere.py: no such file or folder"]
