from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def minimal() -> dict:
    """The smallest valid matrix, as parsed YAML."""
    return {
        "name": "t",
        "models": [{"name": "m", "path": "/models/m"}],
        "load_formats": [{"name": "safetensors"}, {"name": "runai_streamer"}],
        "images": [{"name": "img", "python": sys.executable}],
        "baseline": "safetensors",
        "workload": {"prompts": [{"id": "p", "prompt": "hi"}]},
    }
