"""The unit tier: no server processes, nothing that takes long. Its ``artifacts`` is the offline stand-in
model alone (tests/conftest.py's ``model``, a few seconds), never the variants (minutes on a loaded machine):
a unit test that needs a variant belongs in tests/integration."""

import pytest

from servelab.core.artifacts import ArtifactPaths


@pytest.fixture(scope="session")
def artifacts(model: ArtifactPaths) -> ArtifactPaths:
    return model
