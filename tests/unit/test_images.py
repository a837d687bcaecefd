"""docker-bake.hcl as the one definition of the images, the tag, and the images' self-check, without a
Docker engine (tests/e2e/test_rehearsal.py builds, pushes and pulls them for real)."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from dockerspec import DOCKERFILES, REPO, compose_variants
from servelab.tools.containers import images
from servelab.tools.doctor.image_checks import IMAGES, PROBE

BAKE = (REPO / "docker-bake.hcl").read_text()
TARGETS = dict(re.findall(r'^target "([\w-]+)" \{\n(.*?)^\}', BAKE, re.MULTILINE | re.DOTALL))
# The images' matrix: name -> (Dockerfile, the shared stage it starts from).
ITEMS = {name: (dockerfile, base) for name, dockerfile, base in
         re.findall(r'\{ name = "(\w+)", dockerfile = "(\S+)", base = "([\w-]+)" \}', BAKE)}


def setting(target: str, key: str) -> str:
    found = re.search(rf"^\s*{key}\s*=\s*(.+)$", TARGETS[target], re.MULTILINE)
    return found[1].strip() if found else ""


def dockerfile(name: str) -> str:
    return ITEMS[name][0] if name in ITEMS else setting(name, "dockerfile").strip('"')


def test_every_image_the_compose_files_run_is_defined_once_in_the_bake_file():
    for path, shell, document in compose_variants():
        for service, config in document["services"].items():
            if "build" not in config:
                continue  # monitoring: third-party images, pulled as they are
            registry, name, tag = re.fullmatch(r"(.+)/([\w-]+):(.+)", config["image"]).groups()
            assert (registry, tag) == ("servelab", "local"), f"{path.name} {service}: docker/.env's names"
            assert name in ITEMS or setting(name, "tags") == f'[image("{name}")]', f"{path.name} {service}: no target {name}"
            assert dockerfile(name) == config["build"]["dockerfile"], f"{path.name} {service}"
    assert setting("image", "tags") == "[image(item.name)]"


def test_every_dockerfile_is_built_by_a_bake_target():
    used = {dockerfile(name) for name in [*TARGETS, *ITEMS] if name != "image"}
    assert {str(p.relative_to(REPO)) for p in DOCKERFILES} <= used


def test_the_lab_images_start_from_the_shared_stage_and_share_one_torch_layer():
    bases = {name: base for name, (_, base) in ITEMS.items()}
    assert bases == {"fastapi_pt": "python-torch", "triton_server": "python-torch", "fastapi_onnx": "python-triton",
                     "ray": "python-triton", "flask": "python-ubuntu", "jupyter": "python-sdk"}
    assert all(f'target "{base}"' in BAKE for base in bases.values())
    groups = {name: set(re.findall(r'"([\w-]+)"', targets))
              for name, targets in re.findall(r'group "(\w+)" \{\s*targets = \[(.*?)\]', BAKE, re.DOTALL)}
    assert groups["default"] == {"core", "ray", "redis"} and set(IMAGES) == groups["core"] | {"ray"}, groups


def test_targets_build_after_the_ones_their_contexts_name():
    targets = {"app": {"contexts": {"r/base:t": "target:base"}}, "base": {"contexts": {"r/os:t": "target:os"}},
               "os": {}, "other": {}}
    assert images.order(targets, ("app",)) == ["os", "base", "app"]
    assert images.order(targets) == ["os", "base", "app", "other"]


def _repo(tmp_path: Path) -> Path:
    for name in ("pyproject.toml", ".dockerignore", "docker-bake.hcl"):
        shutil.copy(REPO / name, tmp_path / name)
    for path in ("servelab/x.py", "servelab/tools/containers/runner.py", "notebooks/n.md", "docker/.env",
                 "fastapi_pt/Dockerfile"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("1\n")
    _git(tmp_path, "init", "-q")
    _commit(tmp_path)
    return tmp_path


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True)


def _commit(root: Path) -> None:
    _git(root, "add", ".")
    _git(root, "commit", "-qm", "c", "--allow-empty")


def test_the_tag_changes_with_what_the_images_are_made_of_and_only_with_that(tmp_path):
    root = _repo(tmp_path)
    first = images.tag(root)
    assert re.fullmatch(r"0\.1\.0-[0-9a-f]{12}", first), first
    for path in ("notebooks/n.md", "servelab/tools/containers/runner.py", "docs/new.md"):
        (root / path).parent.mkdir(exist_ok=True)
        (root / path).write_text("edited\n")
        _commit(root)
        assert images.tag(root) == first, f"{path} is in no image: the images pushed before it still serve"
    seen = {first}
    for path in ("fastapi_pt/Dockerfile", "docker-bake.hcl", "servelab/x.py", "docker/.env", "servelab/new.py"):
        (root / path).write_text("edited\n")
        _commit(root)
        assert images.tag(root) not in seen, f"{path} is built into the images"
        seen.add(images.tag(root))


def test_each_edit_of_an_input_gets_a_dirty_tag_of_its_own_and_local_without_git(tmp_path):
    root = _repo(tmp_path)
    clean = images.tag(root)
    (root / "notebooks/n.md").write_text("a student's saved notebook\n")
    assert images.tag(root) == clean, "notebooks are mounted, not built in"
    (root / "servelab/x.py").write_text("2\n")
    first = images.tag(root)
    assert re.fullmatch(rf"{clean}-dirty-[0-9a-f]{{8}}", first), first
    assert images.tag(root) == first, "the same edit, the same tag: compose finds the image it built"
    (root / "servelab/x.py").write_text("3\n")
    assert images.tag(root) not in (clean, first), "a second edit: a tag of its own, so compose builds it"
    (root / "servelab/new.py").write_text("untracked\n")
    assert images.tag(root) not in (clean, first), "a new file an image copies"
    (root / "servelab/new.py").unlink()
    (root / "servelab/x.py").write_text("1\n")
    assert images.tag(root) == clean, "edits undone: the commit's tag again"
    shutil.rmtree(root / ".git")
    assert images.tag(root) == "0.1.0-local"


def test_a_named_registry_pulls_and_none_builds_only_what_is_missing():
    assert images.compose_env({"SERVELAB_REGISTRY": "servelab"})["SERVELAB_PULL_POLICY"] == "never"
    assert images.compose_env({"SERVELAB_REGISTRY": "registry.example.edu/servelab"})["SERVELAB_PULL_POLICY"] == "missing"


def _probe(modules: tuple[str, ...], extra: tuple[str, ...]) -> dict:
    """The images' self-check, run in this environment (its CPU torch and CPU onnxruntime)."""
    done = subprocess.run([sys.executable, "-c", PROBE.format(modules=modules, extra=extra, stub="/nonexistent")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_self_check_reads_the_builds_kernels_and_reports_what_fails():
    said = _probe(("servelab",), ("torch",))
    assert said["problems"] == [] and any("CPU build" in s for s in said["seen"]), said
    said = _probe(("servelab", "no_such_module"), ("onnxruntime",))
    assert any(p.startswith("import no_such_module") for p in said["problems"])
    assert "onnxruntime has no CUDA provider" in said["problems"]



def test_the_doctor_names_the_fix_when_an_image_cannot_be_had(monkeypatch):
    """Run for real here: no image of this commit in any engine, then a registry that does not answer."""
    from servelab.tools.doctor.image_checks import CHECKS
    from servelab.tools.doctor.runner import Context

    monkeypatch.delenv("SERVELAB_REGISTRY", raising=False)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    (local,) = [c.run(Context()) for c in CHECKS if c.name == "image flask"]
    assert local.status == "fail" and "make images" in local.fix and f":{images.tag()}" in local.detail
    monkeypatch.setenv("SERVELAB_REGISTRY", "127.0.0.1:9/servelab")
    (pulled,) = [c.run(Context()) for c in CHECKS if c.name == "image flask"]
    assert pulled.status == "fail" and "cannot pull 127.0.0.1:9/servelab/flask" in pulled.detail
    assert "make images-push" in pulled.fix
