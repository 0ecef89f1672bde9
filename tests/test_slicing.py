from __future__ import annotations

import json

import pytest

from bench.cli import main
from bench.core.config import ConfigError, parse_config
from bench.core.matrix import expand
from bench.core.records import Summary
from bench.core.slicing import github_matrix, parse_shard, slice_cells
from bench.store.merge import merge
from bench.store.results import ResultsError

from . import synth


def test_shards_partition_the_cells(minimal):
    minimal["images"].append({"name": "img2", "python": "python3"})
    cells = expand(parse_config(minimal))
    parts = [slice_cells(cells, shard=(i, 3)) for i in (1, 2, 3)]
    assert sorted(c.id for p in parts for c in p) == sorted(c.id for c in cells)
    assert all(p for p in parts)
    assert slice_cells(cells, shard=(1, 3)) == slice_cells(cells, shard=(1, 3))  # stable
    assert [c.id for c in slice_cells(cells, cell_ids=[cells[2].id])] == [cells[2].id]
    with pytest.raises(ConfigError, match="no such cell"):
        slice_cells(cells, cell_ids=["nope"])
    with pytest.raises(ConfigError, match="no cell"):
        slice_cells(cells[:1], shard=(2, 2))


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b", "1/0"])
def test_bad_shards(text):
    with pytest.raises(ConfigError):
        parse_shard(text)


def test_github_matrix_lists_platforms_shards_and_runner_labels(minimal):
    minimal["platforms"] = ["cpu", "h200"]
    minimal["profiles"] = [{"name": "cpu"}, {"name": "h200", "runner_labels": ["self-hosted", "h200"]}]
    config = parse_config(minimal)
    data = json.loads(github_matrix(config, expand(config), 2))
    assert data["include"] == [
        {"platform": "cpu", "shard": "1/2", "runs-on": ["self-hosted"]},
        {"platform": "cpu", "shard": "2/2", "runs-on": ["self-hosted"]},
        {"platform": "h200", "shard": "1/2", "runs-on": ["self-hosted", "h200"]},
        {"platform": "h200", "shard": "2/2", "runs-on": ["self-hosted", "h200"]},
    ]


def _split(results, tmp_path, keep):
    """A copy of a synthetic run holding only the cells `keep` selects, as one slice would."""
    spec = synth.matrix()
    part = synth.create(tmp_path, results.path.name, spec)
    for r in results.runs():
        if keep(r.cell_id):
            synth.add_run(part, r.cell_id, r.repeat,
                          ids=[0] * 128 if "runai" in r.cell_id else None, text="" if "runai" in r.cell_id else "x")
    synth.fingerprint(part, "img", runai_model_streamer="0.16.0")
    return part


def test_merged_slices_give_the_verdicts_of_the_whole_run(tmp_path):
    whole = synth.streamer_bug(tmp_path / "whole", "run1")
    a = _split(whole, tmp_path / "a", lambda c: "safetensors" in c)
    b = _split(whole, tmp_path / "b", lambda c: "runai" in c)
    assert main(["merge", str(a.path), str(b.path), "-o", str(tmp_path / "merged")]) == 1
    assert main(["report", str(whole.path)]) == 1
    merged = Summary.model_validate_json((tmp_path / "merged" / "run1" / "summary.json").read_text())
    reference = Summary.model_validate_json((whole.path / "summary.json").read_text())
    assert [(c.cell_id, c.verdict, c.failures, c.runs, c.reasons) for c in merged.cells] == [
        (c.cell_id, c.verdict, c.failures, c.runs, c.reasons) for c in reference.cells]
    # The baseline ran in the other slice: divergence is still judged.
    assert "divergence" in merged.cells[1].reasons
    assert len((tmp_path / "merged" / "run1" / "fingerprint.jsonl").read_text().splitlines()) == 1


def test_merge_refuses_what_is_not_slices_of_one_run(tmp_path):
    a = synth.healthy(tmp_path / "a", "run1")
    b = synth.healthy(tmp_path / "b", "run1")
    with pytest.raises(ResultsError, match="in both"):
        merge([a.path, b.path], tmp_path / "out")
    c = synth.healthy(tmp_path / "c", "run2")
    with pytest.raises(ResultsError, match="different runs"):
        merge([a.path, c.path], tmp_path / "out")
    d = synth.create(tmp_path / "d", "run1", synth.matrix(repeats=3))
    with pytest.raises(ResultsError, match="different matrix"):
        merge([a.path, d.path], tmp_path / "out")
    assert main(["merge", str(a.path), str(c.path), "-o", str(tmp_path / "out")]) == 2


NIGHTLY = "vllm/vllm-openai:cu130-nightly"
# Two builds of one tag, as the docker launcher records them (bench.serve.images.pin_of):
# the registry digest of the tag's repository is the pin, the image id is the engine's.
BUILD_1 = dict(image_ref=NIGHTLY, image_pin="vllm/vllm-openai@sha256:" + "1" * 64,
               image_digest="vllm/vllm-openai@sha256:" + "1" * 64, image_id="sha256:" + "a" * 64)
BUILD_2 = dict(image_ref=NIGHTLY, image_pin="vllm/vllm-openai@sha256:" + "2" * 64,
               image_digest="vllm/vllm-openai@sha256:" + "2" * 64, image_id="sha256:" + "b" * 64)


def _pinned_split(results, tmp_path, keep, build):
    part = _split(results, tmp_path, keep)
    (part.path / "fingerprint.jsonl").unlink()
    synth.fingerprint(part, "img", runai_model_streamer="0.16.0", **build)
    return part


def test_merge_refuses_slices_that_ran_two_builds_of_one_tag(tmp_path):
    """The baseline cell's slice pulled one nightly and the test cell's slice the next: merged,
    the divergence between them would be called a vLLM regression."""
    whole = synth.streamer_bug(tmp_path / "whole", "run1")
    a = _pinned_split(whole, tmp_path / "a", lambda c: "safetensors" in c, BUILD_1)
    b = _pinned_split(whole, tmp_path / "b", lambda c: "runai" in c, BUILD_2)
    with pytest.raises(ResultsError) as err:
        merge([a.path, b.path], tmp_path / "out")
    said = str(err.value)
    assert f"image img: the slices ran different builds of {NIGHTLY}" in said
    assert f"{a.path} ran {BUILD_1['image_pin']} (image {BUILD_1['image_id']})" in said
    assert f"{b.path} ran {BUILD_2['image_pin']} (image {BUILD_2['image_id']})" in said
    assert "--image NAME=REPO@sha256:" in said and "--format pins" in said
    assert not (tmp_path / "out" / "run1").exists()
    assert main(["merge", str(a.path), str(b.path), "-o", str(tmp_path / "out")]) == 2


def test_merge_takes_slices_of_one_build(tmp_path):
    whole = synth.streamer_bug(tmp_path / "whole", "run1")
    a = _pinned_split(whole, tmp_path / "a", lambda c: "safetensors" in c, BUILD_1)
    b = _pinned_split(whole, tmp_path / "b", lambda c: "runai" in c, BUILD_1)
    merged = merge([a.path, b.path], tmp_path / "out")
    assert [f.image_pin for f in merged.fingerprints()] == [BUILD_1["image_pin"]]


def test_one_digest_on_two_architectures_is_one_build(tmp_path):
    """A multi-arch tag's slices on an x86 and an arm64 host: one registry digest (the image
    index's), two image ids (each platform's image config)."""
    whole = synth.streamer_bug(tmp_path / "whole", "run1")
    a = _pinned_split(whole, tmp_path / "a", lambda c: "safetensors" in c, BUILD_1)
    b = _pinned_split(whole, tmp_path / "b", lambda c: "runai" in c,
                      dict(BUILD_1, image_id="sha256:" + "c" * 64, arch="aarch64"))
    assert len(merge([a.path, b.path], tmp_path / "out").fingerprints()) == 2
