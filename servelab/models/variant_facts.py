"""What `servelab models build` recorded about each variant (``food11_variants.json``: size,
precision, agreement with fp32), when the file is there."""

import json
from pathlib import Path

FACTS_FILE = "food11_variants.json"


def variant_facts(model_dir: Path) -> dict[str, dict]:
    """variant name -> its facts; empty when the variants were not built."""
    path = Path(model_dir) / FACTS_FILE
    if not path.exists():
        return {}
    return {v["name"]: v for v in json.loads(path.read_text())["variants"]}
