"""Every test session works in folders of its own: MODEL_DIR and TRITON_MODEL_REPOSITORY point into a
session temporary folder (the servers the tests start inherit them), so `make test` never replaces
the model the user built in models/ and models_staging/. The session fails if it changed the
checkout's models/, models_staging/ or results/ anyway, or left a Triton stub's segment in /dev/shm."""

import secrets
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import tier_durations
from checkout_guard import changes, fingerprint, in_dev_shm, named_shm
from lab_process import READERS, QuickLab, quick_lab_folder
from servelab.core.artifacts import ArtifactPaths, ModelSource, build_artifacts, load_manifest
from servelab.core.hardware import NO_GPU, gpu_count
from servelab.core.settings import get_settings
from servelab.core.variants.build import build_variants
from servelab.servers.triton.server import SHM_PREFIX
from triton_repo import copy_sources

ADMIN_TOKEN = secrets.token_urlsafe(24)  # the session's servers' ADMIN_TOKEN


def pytest_configure(config: pytest.Config) -> None:
    """A run of the whole suite writes each tier's counts and seconds into docs/testing.md (tests/tier_durations.py);
    the process that runs the session starts its quick lab, where a test reads it (tests/lab_process.py)."""
    config.pluginmanager.register(tier_durations.Recorder(), "servelab-durations")
    if not hasattr(config, "workerinput"):  # pytest-xdist's workers read the controller's
        config.pluginmanager.register(QuickLab(), "servelab-quick-lab")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In one process the tiers run in order, unit first (quick answers first; the quick lab, started once the
    tests are collected, runs beside the two lower tiers: tests/e2e/conftest.py). Under pytest-xdist (`make
    test TEST_WORKERS=N`), whose workers take a file at a time in this order, the longest files come first so
    that none is left running alone at the end: e2e, integration, the quick lab's readers (by then it has
    ended), unit.
    Tests marked ``gpu`` run only where nvidia-smi lists a GPU; elsewhere they skip with that reason."""
    if hasattr(config, "workerinput"):
        order = {"tests/e2e": 0, "tests/integration": 1, READERS: 2, "tests/unit": 3}
    else:
        order = {tier: i for i, tier in enumerate(tier_durations.TIERS)}

    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::")[0]
        return order.get(path, order.get(tier_durations.tier_of(item.nodeid), len(order)))

    items.sort(key=rank)  # stable: files stay whole
    if any(item.get_closest_marker("gpu") for item in items) and gpu_count() == 0:
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(pytest.mark.skip(reason=NO_GPU))


@pytest.fixture(scope="session", autouse=True)
def own_folders(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    before, shm_before = fingerprint(), in_dev_shm()
    root = tmp_path_factory.mktemp("servelab")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MODEL_DIR", str(root / "models"))
        env.setenv("TRITON_MODEL_REPOSITORY", str(copy_sources(root / "model_repository")))
        # Every FastAPI server the tests start takes reloads with this token, from models anywhere in the
        # session's temporary folders (tests/unit/test_admin_guard.py checks both guards).
        env.setenv("ADMIN_TOKEN", ADMIN_TOKEN)
        env.setenv("MODEL_ROOT", str(tmp_path_factory.getbasetemp()))
        get_settings.cache_clear()  # settings are cached once read: read them again, with these folders
        yield root
    get_settings.cache_clear()
    changed = changes(before, fingerprint())
    assert not changed, "the tests changed the checkout's own folders:\n" + "\n".join(changed)
    # A segment still mapped is a running server's: one beside this session (another pytest-xdist worker's).
    left = {name for name in in_dev_shm() - shm_before if name.startswith(SHM_PREFIX)}
    left -= named_shm(psutil.process_iter()) if left else set()
    assert not left, f"the tests left Triton stubs' segments in /dev/shm: {sorted(left)}"


@pytest.fixture(scope="session")
def model() -> ArtifactPaths:
    """The offline stand-in model (PyTorch weights, ONNX, manifest), built once into this session's MODEL_DIR
    and model repository: a few seconds. No variants; the unit tier's ``artifacts`` is this (tests/unit/conftest.py)."""
    settings = get_settings()
    build_artifacts(ModelSource("offline"), settings.model_dir, settings.triton_model_repository, log=lambda *_: None)
    return ArtifactPaths.in_dir(settings.model_dir)


@pytest.fixture(scope="session")
def artifacts(model: ArtifactPaths, request: pytest.FixtureRequest) -> ArtifactPaths:
    """The offline model artifacts and their variants, built once into this session's MODEL_DIR and
    model repository. Built afresh each session rather than cached: the variants (quantization) take
    half a minute on an idle 2-CPU machine, several minutes on a loaded one. Where the session's quick lab
    runs beside (tests/e2e), it builds the same variants of the same model first thing: they are copied
    from it (``LabFolder.share_variants``), not built a second time at once."""
    settings = get_settings()
    if lab := quick_lab_folder(request.config):
        lab.share_variants(settings.model_dir)
    build_variants(settings.model_dir, load_manifest(model.manifest), settings.triton_model_repository,
                   log=lambda *_: None)
    return model
