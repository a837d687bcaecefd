"""The layers of docs/architecture.md: one folder each, held by import-linter (the contracts are in
pyproject.toml, with no exemptions), no import circles anywhere, and no two modules with one name."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[2]
# This checkout's servelab, whichever one the environment has installed.
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def test_imports_keep_to_the_layers():
    lint_imports = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run([str(lint_imports), "--no-cache"], cwd=REPO, env=ENV, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "exhaustive_ignores" not in (REPO / "pyproject.toml").read_text()


def circles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(imports):
        if root in index:
            continue
        work = [(root, iter(sorted(imports[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(imports.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_circle_check_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_through_others():
    """Layers order the folders; this holds every pair of modules, inside a folder too (deferred imports count),
    and between the package and the service apps (Ray Serve imports fastapi_onnx's app, which must not import back)."""
    graph = grimp.build_graph("servelab", "fastapi_pt", "fastapi_onnx", "flask_app", cache_dir=None)
    imports = {m: set(graph.find_modules_directly_imported_by(m)) & graph.modules for m in graph.modules}
    assert circles(imports) == []


def test_no_two_modules_share_a_name():
    """Outside cli/, whose modules are named after their commands: a name says where a module is."""
    seen: dict[str, Path] = {}
    for path in sorted((REPO / "servelab").rglob("*")):
        if "__pycache__" in path.parts or "cli" in path.relative_to(REPO / "servelab").parts[:1]:
            continue
        name = path.stem if path.suffix == ".py" else path.name if path.is_dir() else None
        if name is None or name in ("__init__", "__main__", "data", "photos"):
            continue
        assert name not in seen, f"{path.relative_to(REPO)} and {seen[name].relative_to(REPO)}"
        seen[name] = path


def test_the_triton_models_use_the_core_and_the_triton_server_only():
    """models_staging/*/1/model.py run inside Triton's Python-backend stub: not a package import-linter can
    read, so their imports are read here."""
    allowed = ("servelab.core", "servelab.servers.triton")
    models = sorted((REPO / "models_staging").glob("*/1/model.py"))
    assert models
    for path in models:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                if name.startswith("servelab"):
                    assert name.startswith(allowed), f"{path.relative_to(REPO)} imports {name}"


def test_no_module_reaches_into_another_modules_private_names():
    """A leading underscore means "this module's own": another module that needs it gets it made public.
    Read from every module of servelab/ and the service apps: ``from x import _y`` and ``x._y``."""
    ours = {p.relative_to(REPO).with_suffix("").as_posix().replace("/", ".") for p in (REPO / "servelab").rglob("*.py")}
    found = []
    for path in sorted((REPO / "servelab").rglob("*.py")):
        tree = ast.parse(path.read_text())
        aliases = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
                   if a.name.startswith("servelab")}
        aliases |= {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                    and (n.module or "").startswith("servelab") for a in n.names if f"{n.module}.{a.name}" in ours}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("servelab"):
                found += [f"{path.relative_to(REPO)}: from {node.module} import {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                  and node.attr.startswith("_") and not node.attr.startswith("__")):
                found.append(f"{path.relative_to(REPO)}: {node.value.id}.{node.attr}")
    assert not found, "\n".join(found)


def test_gourmetgram_imports_without_the_model_services_stack():
    """Its container installs `.[flask]` only: no FastAPI, no model runtime, no Redis client."""
    blocked = ("fastapi", "starlette", "uvicorn", "onnxruntime", "torch", "redis")
    code = f"import sys\nfor m in {blocked!r}: sys.modules[m] = None\nimport flask_app.app"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]


def test_a_runtime_s_names_load_no_process_machinery():
    """What a server process knows of its siblings is one light module: the model's side (runtimes) reads it
    without uvicorn's supervisor (workers), which only ``servelab serve`` needs."""
    blocked = ("uvicorn", "servelab.servers.fastapi.workers")
    code = f"import sys\nfor m in {blocked!r}: sys.modules[m] = None\nimport servelab.servers.fastapi.runtimes"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]


def test_core_reads_the_environment_only_through_its_settings():
    """core/ reads no variable by itself but CUDA's own: a server process's share of the CPUs, once a variable
    that servers/ set and core read (a dependency upward that import-linter cannot see), is now in ``Siblings``."""
    read = []
    for path in (REPO / "servelab" / "core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            environ = node.func.value if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("get", "pop") else node.value if isinstance(node, ast.Subscript) else None
            if isinstance(environ, ast.Attribute) and environ.attr == "environ":
                key = node.args[0] if isinstance(node, ast.Call) else node.slice
                read.append(key.value if isinstance(key, ast.Constant) else ast.unparse(key))
    assert read and set(read) == {"CUDA_VISIBLE_DEVICES"}, read


def local_imports_without_a_reason(root: Path) -> list[str]:
    """Imports inside a function that neither load a third-party package (an optional extra, or one too heavy
    to load for every command) nor say why on their line or in the comment just above: the standard library
    and our own modules belong at the top of the file."""
    found = []
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                name = (node.module or "") if isinstance(node, ast.ImportFrom) else node.names[0].name
                top = name.split(".")[0]
                third_party = top not in sys.stdlib_module_names and top not in ("servelab", "fastapi_pt",
                                                                                  "fastapi_onnx", "flask_app")
                above = lines[max(0, node.lineno - 4):node.lineno]
                if not third_party and not any("#" in line for line in above):
                    found.append(f"{path.relative_to(root)}:{node.lineno} imports {name}")
    return found


def test_every_import_inside_a_function_has_a_reason(tmp_path):
    assert local_imports_without_a_reason(REPO / "servelab") == []
    (tmp_path / "planted.py").write_text("def f():\n    import json\n    return json\n")
    assert local_imports_without_a_reason(tmp_path) == ["planted.py:2 imports json"]


# What starts a server: a web server's module, or a name that starts one (a child server, a thread serving HTTP).
SERVER_MODULES = ("uvicorn", "hypercorn", "gunicorn", "aiohttp.web", "http.server", "socketserver", "wsgiref")
SERVER_NAMES = {"ServerProcess", "ChildServer", "Popen", "start_http_server", "start_wsgi_server", "run_app",
                "serve_forever"}


def server_starts(root: Path) -> dict[str, list[str]]:
    """Each module under ``root`` (dotted, from ``root``'s parent) that imports a web server or uses a name that
    starts one: what it uses, by line."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        module = path.relative_to(root.parent).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            modules = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                       [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            names = ([a.name for a in node.names] if isinstance(node, ast.ImportFrom) else
                     [node.attr] if isinstance(node, ast.Attribute) else [node.id] if isinstance(node, ast.Name) else [])
            used = [m for m in modules if m.startswith(SERVER_MODULES)] + [n for n in names if n in SERVER_NAMES]
            found.setdefault(module, []).extend(f"{path.name}:{node.lineno} {u}" for u in used)
    return {m: uses for m, uses in found.items() if uses}


def test_measure_starts_no_server(tmp_path):
    """measure/ measures what run/ started (its sender processes are the client: multiprocessing, not a server):
    none of its modules starts a server, nor imports a module of ours that does (core.procs, which holds the
    machinery, is checked by the names taken from it)."""
    starters = set(server_starts(REPO / "servelab")) - {"servelab.core.procs"}
    assert {m for m in starters if m.startswith("servelab.measure")} == set()
    graph = grimp.build_graph("servelab", cache_dir=None)
    reached = {(m, i) for m in graph.modules if m.startswith("servelab.measure")
               for i in graph.find_modules_directly_imported_by(m) if i in starters}
    assert reached == set()
    planted = tmp_path / "measure"
    planted.mkdir()
    (planted / "bad.py").write_text("import uvicorn\nfrom servelab.core.procs import ServerProcess, cpu_count\n")
    assert server_starts(planted) == {"measure.bad": ["bad.py:1 uvicorn", "bad.py:2 ServerProcess"]}
