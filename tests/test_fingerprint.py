from __future__ import annotations

import os
import sys

from bench.core.config import Image
from bench.serve.fingerprint import fingerprint
from bench.serve.launch import image_env


def fake_dist(root, name: str, version: str) -> None:
    d = root / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_versions_come_from_inside_the_environment_overlay_first(tmp_path):
    overlay = tmp_path / "overlay"
    fake_dist(overlay, "runai-model-streamer", "0.16.0")
    fake_dist(overlay, "torch", "2.13.0+cu128")
    (overlay / "torch").mkdir()
    (overlay / "torch" / "__init__.py").write_text("raise RuntimeError('the probe must not import torch')\n")
    (overlay / "torch" / "version.py").write_text("from typing import Optional\ncuda: Optional[str] = '12.8'\n")
    image = Image(name="img", python=sys.executable, pythonpath=[str(overlay)])
    fp = fingerprint(image, image_env(image, dict(os.environ)))
    assert fp.error is None
    assert (fp.runai_model_streamer, fp.torch, fp.cuda) == ("0.16.0", "2.13.0+cu128", "12.8")
    assert fp.python == ".".join(map(str, sys.version_info[:3]))


def test_a_missing_interpreter_is_recorded_not_raised(tmp_path):
    image = Image(name="img", python=str(tmp_path / "nope"))
    fp = fingerprint(image, dict(os.environ))
    assert fp.error and "probe failed" in fp.error and fp.vllm is None
