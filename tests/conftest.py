import pytest

from servelab.artifacts import ArtifactPaths, ModelSource, build_artifacts
from servelab.settings import get_settings


@pytest.fixture(scope="session")
def artifacts() -> ArtifactPaths:
    """The offline model artifacts in MODEL_DIR, built once (a no-op when already up to date)."""
    model_dir = get_settings().model_dir
    build_artifacts(ModelSource("offline"), model_dir, log=lambda *_: None)
    return ArtifactPaths.in_dir(model_dir)
