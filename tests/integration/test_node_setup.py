"""bin/node-setup, the node's setup (3_fastapi_setup), on a copy of this checkout, where the rehearsal
(tests/e2e/test_rehearsal.py) cannot go: a snapshot's clean-up in a HOME of its own, a build that fails, an unknown
option. The rehearsal plays the rest for real (no registry, a prepared node, a class registry, a registry that fails
and the way on).

servelab's own environment and model steps run for real (this machine's .venv, the packaged stand-in model);
Docker is a recording double on PATH: it records each call with the registry and tag its environment gives (bake
reads only that; compose reads docker/.env too)."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from servelab.core.paths import REPO_ROOT
from servelab.run.walkthrough import runbook
from servelab.tools.containers import images

# A stand-in for Docker: `compose ... config --images` lists the images, `image inspect` finds those in
# $DOCKER_HAS, `save -o FILE REF...` writes the refs into FILE and `load -i FILE` adds them to $DOCKER_HAS; every call
# but the first two is recorded in $DOCKER_CALLS with the images its environment names (it fails where $DOCKER_FAILS
# is set).
DOCKER = textwrap.dedent("""\
    #!/usr/bin/env bash
    case "$*" in
      *"config --images") registry=${SERVELAB_REGISTRY:-servelab}  # else docker/.env's, as Compose reads it
                          echo "$registry/${FASTAPI_STAGE:-fastapi_pt}:$SERVELAB_TAG"
                          echo "$registry/triton_server:$SERVELAB_TAG" ;;
      "image inspect "*) grep -qxF "$3" "$DOCKER_HAS" ;;
      "save -o "*) printf '%s\n' "${@:4}" > "$3"; echo "save  # ${*:4}" >> "$DOCKER_CALLS" ;;
      "load -i "*) cat "$3" >> "$DOCKER_HAS"; echo "load -i $3" >> "$DOCKER_CALLS" ;;
      *) echo "$*  # ${SERVELAB_REGISTRY:-}/*:${SERVELAB_TAG:-}" >> "$DOCKER_CALLS"; [ -z "$DOCKER_FAILS" ] ;;
    esac
    """)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """What the node's checkout holds after its first setup: this repository's files, committed (the tag is that
    commit's), .venv (this machine's environment) and models/ (the packaged stand-in, built once here)."""
    root = tmp_path_factory.mktemp("node") / "servelab"
    for name in ("bin", "docker", "servelab"):
        shutil.copytree(REPO_ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", ".dockerignore", "docker-bake.hcl"):
        shutil.copy(REPO_ROOT / name, root / name)
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "the node's commit"]):
        subprocess.run([*git, *args], check=True)
    if (REPO_ROOT / "models" / "food11.json").is_file():  # built already: the first setup finds it up to date
        shutil.copytree(REPO_ROOT / "models", root / "models")
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / ".venv" / "bin" / "python").symlink_to(sys.executable)
    (root / ".venv" / "bin" / "servelab").write_text(f'#!/bin/sh\nexec {sys.executable} -m servelab "$@"\n')
    (root / ".venv" / "bin" / "servelab").chmod(0o755)
    (root / "bin" / "docker").write_text(DOCKER)
    (root / "bin" / "docker").chmod(0o755)
    return root


def setup(root: Path, home: Path, *args: str, has: list[str] = (), registry: str = "", fails: bool = False,
          env: dict[str, str] | None = None):
    home.mkdir(exist_ok=True)
    (home / "has").write_text("".join(f"{ref}\n" for ref in has))
    env = {**os.environ, "HOME": str(home), "PATH": f"{root / 'bin'}:{os.environ['PATH']}",
           "PYTHONPATH": str(root),  # the copy's servelab: its REPO_ROOT is the copy
           "MODEL_SOURCE": "offline", "DOCKER_HAS": str(home / "has"),
           "DOCKER_CALLS": str(home / "calls"), "DOCKER_FAILS": "1" if fails else "", **(env or {})}
    env.pop("SERVELAB_TAG", None)
    env.pop("SERVELAB_REGISTRY", None)
    env.update({"SERVELAB_REGISTRY": registry} if registry else {})
    done = subprocess.run([str(root / "bin" / "node-setup"), *args], capture_output=True, text=True, env=env,
                          timeout=600)
    calls = (home / "calls").read_text().splitlines() if (home / "calls").exists() else []
    return done, calls


def refs(tag: str, registry: str = "servelab") -> list[str]:
    return [f"{registry}/{name}:{tag}" for name in ("fastapi_pt", "fastapi_onnx", "triton_server")]


def test_a_snapshot_saves_the_images_and_removes_what_no_two_nodes_may_share(checkout: Path, tmp_path: Path):
    """`bin/node-setup --snapshot` on a node with every image: the archive holds them, the instructor's logins, keys,
    history and secrets are gone, and it prints the cc-snapshot command; a node booted from it loads the archive."""
    tag, home = images.tag(checkout), tmp_path / "instructor"
    secrets = {".docker/config.json": '{"auths": {"registry.example.edu": {"auth": "c2VjcmV0"}}}',
               ".git-credentials": "https://me:token@github.com", ".bash_history": "docker login\n",
               ".ssh/id_rsa": "PRIVATE", ".gitconfig": "[credential]\n\thelper = store\n"}
    for path, text in {**secrets, ".ssh/authorized_keys": "ssh-rsa AAAA instructor"}.items():
        (home / path).parent.mkdir(parents=True, exist_ok=True)
        (home / path).write_text(text)
    (checkout / "results").mkdir(exist_ok=True)
    (checkout / "results" / "mine.jsonl").write_text("{}\n")
    done, calls = setup(checkout, home, "--snapshot", has=refs(tag), env={"SNAPSHOT_ROOT": str(checkout / "docker")})
    assert done.returncode == 0, done.stderr
    assert calls == [f"save  # {' '.join(sorted(refs(tag)))}"]
    assert sorted((home / "servelab-images.tar").read_text().split()) == sorted(refs(tag))
    left = [path for path in secrets if (home / path).exists() and path != ".gitconfig"]
    assert left == [] and "helper" not in (home / ".gitconfig").read_text(), left
    assert (home / ".ssh/authorized_keys").read_text() == "" and not (checkout / ".secrets").exists()
    assert list((checkout / "results").iterdir()) == []
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    assert f"  sudo cc-snapshot -e /var/lib/docker servelab-{commit}\n" in done.stdout, done.stdout
    assert "no systemd here: each node's bin/node-setup loads" in done.stdout  # SNAPSHOT_ROOT has no systemd

    booted = tmp_path / "booted"  # Docker's folder stayed out of the snapshot: no image, the archive in HOME
    booted.mkdir()
    shutil.copy(home / "servelab-images.tar", booted)
    done, calls = setup(checkout, booted, "--wait")
    assert done.returncode == 0 and "loading this commit's images from" in done.stdout, done.stdout + done.stderr
    assert calls == [f"load -i {booted / 'servelab-images.tar'}"]
    assert (booted / "images.log").read_text().endswith("images: done\n")


def test_an_archive_of_an_earlier_commit_takes_the_rest_from_the_class_registry_or_names_the_way_on(
        checkout: Path, tmp_path: Path):
    """A prepared node whose archive was saved before a commit that changed an image: the class registry, where
    docker/.env names one, has this commit's images; without one the setup fails and says to build."""
    tag, registry = images.tag(checkout), "registry.example.edu"
    for home, named in ((tmp_path / "with-registry", registry), (tmp_path / "no-registry", "")):
        home.mkdir()
        (home / "servelab-images.tar").write_text("".join(f"{ref}\n" for ref in refs("0.1.0-older", named or "servelab")))
        done, calls = setup(checkout, home, "--wait", registry=named)
        log = (home / "images.log").read_text()
        assert f"load -i {home / 'servelab-images.tar'}" in calls and "(saved at another commit)" in log, log
        if named:
            assert done.returncode == 0 and log.endswith("images: done\n"), log
            assert [c for c in calls if " pull" in c] == [f"compose -f docker/docker-compose-{f}.yaml pull{s}  # {registry}/*:{tag}"
                                                        for f, s in (("fastapi", ""), ("fastapi", " fastapi_server"),
                                                                     ("triton", ""))], calls
        else:
            assert done.returncode != 0 and "images: FAILED" in log and runbook.ARCHIVE.advice() in log, log
            assert not [c for c in calls if " pull" in c], calls


def test_a_failed_build_says_so_and_fails(checkout: Path, tmp_path: Path):
    done, _ = setup(checkout, tmp_path, "--wait", fails=True)
    assert done.returncode != 0
    log = (tmp_path / "images.log").read_text()
    assert "images: FAILED" in log and "images: done" not in log.splitlines() and runbook.REGISTRY.name not in log


def test_an_unknown_option_is_refused(checkout: Path, tmp_path: Path):
    done, calls = setup(checkout, tmp_path, "--fast")
    assert done.returncode == 2 and "usage: bin/node-setup" in done.stderr and calls == []
