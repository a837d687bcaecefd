"""Every environment variable servelab reads, in one place.

Each role has its own settings class; the README's configuration table is generated from the
field descriptions here (``python -m servelab.settings``), and a test keeps the two in sync.
Containers and local runs read the same variables with the same defaults.
"""

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from servelab.paths import REPO_ROOT
from servelab.preprocess import DEFAULT_MAX_PIXELS


class _Env(BaseSettings):
    # Variable names are the field names in upper case; no prefix, to keep the lab's names.
    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore")


class ModelSettings(_Env):
    """Model artifacts (every stage)."""

    model_dir: Path = Field(REPO_ROOT / "models", description="Folder with food11.pt, food11.json and food11.onnx (`servelab models build` writes them).")


class ServeSettings(_Env):
    """The FastAPI services (fastapi_pt, fastapi_onnx)."""

    host: str = Field("127.0.0.1", description="Address the service binds to (`0.0.0.0` inside a container).")
    port: int = Field(8000, description="Port of the FastAPI service.")
    max_image_pixels: int = Field(DEFAULT_MAX_PIXELS, description="Images whose header declares more pixels are refused (413) before decoding.")


class Settings(ModelSettings, ServeSettings):
    """All settings together, for code that needs several roles."""


@lru_cache
def get_settings() -> Settings:
    return Settings()


SETTINGS_CLASSES: tuple[type[BaseSettings], ...] = (ModelSettings, ServeSettings)


def markdown_table() -> str:
    """The configuration table for the README: variable, default, used by, meaning."""
    rows = ["| variable | default | used by | meaning |", "|---|---|---|---|"]
    for cls in SETTINGS_CLASSES:
        role = (cls.__doc__ or cls.__name__).strip().splitlines()[0]
        for name, field in cls.model_fields.items():
            default = field.default
            if isinstance(default, Path) and default.is_relative_to(REPO_ROOT):
                default = f"<checkout>/{default.relative_to(REPO_ROOT)}"
            rows.append(f"| `{name.upper()}` | `{default}` | {role} | {field.description} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
