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


SUFFIXES = (".py", ".md", ".toml", ".pbtxt", ".json", ".txt", ".yml", ".yaml", ".log", ".ipynb", ".jpg", ".cfg", ".j2")
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


@cache
def top_level() -> dict[str, set[str]]:
    """Each name servelab's modules define at their top level -> the modules (by file stem) that define it."""
    homes: dict[str, set[str]] = {}
    for path in (REPO / "servelab").rglob("*.py"):
        for name in defined_in(path):
            homes.setdefault(name, set()).add(path.stem if path.stem != "__init__" else path.parent.name)
    return homes


@cache
def classes() -> frozenset[str]:
    return frozenset(n.name for path in (REPO / "servelab").rglob("*.py") for n in ast.walk(ast.parse(path.read_text()))
                     if isinstance(n, ast.ClassDef))


def dotted_module(token: str, base: Path) -> tuple[Path, str] | None:
    """``servelab.a.b.name``, ``a.b.name`` (a module of the package ``base``) or ``module.name`` -> (its file,
    the name after the longest module prefix: "" where the whole token is a module); None if it names none of
    ours (a third-party or a Python name such as ``record.config``)."""
    parts = token.split(".")
    roots = [REPO] if parts[0] in ("servelab", "fastapi_pt", "fastapi_onnx", "flask_app") else [base]
    for root in roots:
        for n in range(len(parts), 0, -1):
            stem = root.joinpath(*parts[:n])
            path = stem.with_suffix(".py") if stem.with_suffix(".py").exists() else stem / "__init__.py"
            if path.exists():
                rest = parts[n:]
                return (path, rest[0] if rest else "") if len(rest) <= 1 else (path, rest[0])
    if roots == [REPO]:
        return (REPO / "servelab" / "__init__.py", parts[1])  # servelab.<missing>: fails as no such name
    return None


def problems(text: str, base: Path) -> list[str]:
    """What ``text`` puts in backticks and this checkout lacks: ``a/b.py`` (or a folder, or a glob) that is not
    there, ``a/b.name`` whose module defines no ``name``, a name that no file of our code holds."""
    found = []
    for double, single in re.findall(r"``([^`\n]+)``|`([^`\n]+)`", text):  # reST's ``x`` and Markdown's `x`
        token = (double or single).split(": ")[0].strip()
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
        elif re.fullmatch(r"[A-Za-z_][\w.]*\.\w+", token) and not token.endswith(SUFFIXES):
            if module := dotted_module(token, base):
                path, name = module
                if name and name not in defined_in(path):
                    found.append(f"{token}: {path.relative_to(REPO)} defines no {name}")
            elif missing := [part for part in token.split(".") if part not in words()]:
                found.append(f"{token}: {', '.join(missing)} not a word of our code")
            elif (homes := top_level().get(token.split(".")[-1])) and token.split(".")[-2] not in homes | classes():
                found.append(f"{token}: {token.split('.')[-1]} is in {', '.join(sorted(homes))}")
        elif WORD.fullmatch(token) and token not in words():
            found.append(f"{token}: not a word of our code")
    return found


@cache
def defined_in(module: Path) -> frozenset[str]:
    tree = ast.parse(module.read_text())
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    names |= {t.id for n in tree.body if isinstance(n, ast.Assign) for target in n.targets
              for t in (target.elts if isinstance(target, ast.Tuple) else [target]) if isinstance(t, ast.Name)}
    names |= {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    return frozenset(names)


def test_the_architecture_doc_names_real_things():
    assert problems((REPO / "docs/architecture.md").read_text(), REPO / "servelab") == []


@pytest.mark.parametrize("init", sorted(p.relative_to(REPO).as_posix() for p in (REPO / "servelab").rglob("__init__.py")))
def test_each_package_docstring_names_real_things(init):
    path = REPO / init
    assert problems(ast.get_docstring(ast.parse(path.read_text())) or "", path.parent) == []


def test_the_check_finds_a_stale_name():
    text = "`core/inference.NoSuchClass`, `servers/nowhere.py`, ``services.no_such``, `servelab.core.gone.f`"
    assert problems(text, REPO / "servelab" / "servers" / "gourmetgram") == [
        "core/inference.NoSuchClass: servelab/core/inference.py defines no NoSuchClass",
        "servers/nowhere.py: no such file or folder",
        "services.no_such: servelab/servers/gourmetgram/services.py defines no no_such",
        "servelab.core.gone.f: servelab/core/__init__.py defines no gone"]
