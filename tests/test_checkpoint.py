"""The checkpoint inspector on hand-written checkpoints (pure Python, no torch) and on the canary."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from bench.cli import main
from bench.weights import checkpoint
from bench.weights.checkpoint import NotACheckpoint, hash_tensors, inspect_checkpoint, stream_stop
from bench.weights.model import CheckpointReport, Shard, TensorInfo

from .support import CANARY, needs_canary, raw, shard_name, write_checkpoint, write_index, write_shard


def kinds(report: CheckpointReport) -> list[str]:
    return sorted(p.kind for p in report.problems)


def problem(report: CheckpointReport, kind: str):
    [found] = [p for p in report.problems if p.kind == kind]
    return found


# --- the canary ----------------------------------------------------------------------------------


@needs_canary
def test_canary_shards_listing_order_and_risk():
    stamp = json.loads((CANARY / "regbench-canary.json").read_text())
    report = inspect_checkpoint(CANARY)
    assert len(report.shards) == 10 and report.tensor_count == stamp["tensors"] == 21
    assert sorted(report.empty_shards) == sorted(stamp["empty"])
    assert report.listing_order == stamp["listing_order"]
    assert [d.dtype for d in report.dtypes] == ["F32"] and report.dtypes[0].tensors == 21
    # The index names only the data shards: not an inconsistency, since an empty shard holds nothing.
    assert kinds(report) == ["stream_stop_risk", "stream_stop_risk"]
    for stop in report.stream_stops:
        assert stop.stop_at == 0 and stop.lost_tensors == 21
    assert any("RUNAI_STREAMER_MEMORY_LIMIT=0" in n for n in report.notes)


@needs_canary
def test_canary_cli_json_round_trips_and_exits_1(capsys):
    assert main(["inspect", str(CANARY), "--format", "json"]) == 1
    report = CheckpointReport.model_validate_json(capsys.readouterr().out)
    assert report.tensor_count == 21 and not report.ok


@needs_canary
def test_canary_cli_table_names_the_risk(capsys):
    assert main(["inspect", str(CANARY)]) == 1
    text = capsys.readouterr().out
    assert ("sorted   stream stops at empty shard model-00001-of-00010 (first); "
            "lost 21/21 tensors: 6 shards from model-00002-of-00010 on\n") in text
    assert "stream_stop_risk" in text


# --- index consistency ---------------------------------------------------------------------------


def test_consistent_checkpoint_has_no_problem(tmp_path, capsys):
    write_checkpoint(tmp_path, [2, 3, 1])
    report = inspect_checkpoint(tmp_path)
    assert report.ok and report.tensor_count == 6
    assert all(s.in_index for s in report.shards)
    assert not any(s.risk for s in report.stream_stops)
    assert main(["inspect", str(tmp_path)]) == 0
    assert "no problems" in capsys.readouterr().out


def test_missing_shard_file(tmp_path):
    layout = write_checkpoint(tmp_path, [2, 3, 1])
    gone = shard_name(2, 3)
    (tmp_path / gone).unlink()
    report = inspect_checkpoint(tmp_path)
    found = problem(report, "index_file_missing")
    assert found.files == [gone]
    assert found.tensors == sorted(t.name for t in layout[gone])
    # Its tensors are reported once, with the missing file, not again as missing tensors.
    assert kinds(report) == ["index_file_missing"]
    assert main(["inspect", str(tmp_path)]) == 1


def test_tensor_in_index_but_absent(tmp_path):
    layout = write_checkpoint(tmp_path, [2, 2])
    weight_map = {t.name: f for f, ts in layout.items() for t in ts}
    weight_map["lm_head.weight"] = shard_name(2, 2)
    write_index(tmp_path, weight_map)
    report = inspect_checkpoint(tmp_path)
    assert kinds(report) == ["tensor_missing"]
    assert problem(report, "tensor_missing").tensors == ["lm_head.weight"]


def test_tensors_and_shard_the_index_ignores(tmp_path):
    layout = write_checkpoint(tmp_path, [2, 2])
    write_shard(tmp_path / "consolidated.safetensors", [raw("tok_embeddings.weight")])
    write_index(tmp_path, {t.name: f for f, ts in layout.items() for t in ts if t.name != "layers.2.t1.weight"})
    report = inspect_checkpoint(tmp_path)
    assert kinds(report) == ["shard_not_in_index", "tensor_not_in_index"]
    assert problem(report, "shard_not_in_index").files == ["consolidated.safetensors"]
    assert problem(report, "tensor_not_in_index").tensors == ["layers.2.t1.weight", "tok_embeddings.weight"]


def test_tensor_in_a_different_shard_than_indexed(tmp_path):
    layout = write_checkpoint(tmp_path, [2, 2])
    weight_map = {t.name: f for f, ts in layout.items() for t in ts}
    weight_map["layers.1.t0.weight"] = shard_name(2, 2)
    write_index(tmp_path, weight_map)
    found = problem(inspect_checkpoint(tmp_path), "tensor_in_wrong_shard")
    assert found.tensors == ["layers.1.t0.weight"] and found.files == [shard_name(1, 2), shard_name(2, 2)]


def test_duplicate_tensor_across_shards(tmp_path):
    write_checkpoint(tmp_path, [2, 2], index=False)
    write_shard(tmp_path / "extra.safetensors", [raw("layers.1.t1.weight"), raw("other")])
    report = inspect_checkpoint(tmp_path)
    found = problem(report, "duplicate_tensor")
    assert found.tensors == ["layers.1.t1.weight"]
    assert found.files == ["extra.safetensors", shard_name(1, 2)]


def test_unreadable_index(tmp_path):
    write_checkpoint(tmp_path, [1])
    (tmp_path / checkpoint.INDEX_NAME).write_text('{"weight_map": ["not", "a", "map"]}')
    assert kinds(inspect_checkpoint(tmp_path)) == ["unreadable_index"]


# --- broken shards -------------------------------------------------------------------------------


def test_truncated_shard_is_a_problem_not_a_crash(tmp_path):
    write_checkpoint(tmp_path, [2, 2])
    path = tmp_path / shard_name(2, 2)
    path.write_bytes(path.read_bytes()[:-5])
    report = inspect_checkpoint(tmp_path)
    assert kinds(report) == ["tensor_missing", "unreadable_shard"]
    broken = report.shards[1]
    assert broken.error is not None and "data area" in broken.error and not broken.empty


@pytest.mark.parametrize("header, message", [
    (b"\xff" * 8, "header length"),
    (b"\x04\x00\x00\x00\x00\x00\x00\x00[1] ", "not a JSON object"),
    (b"\x04\x00\x00\x00\x00\x00\x00\x00{{{{", "Expecting"),
])
def test_garbage_headers(tmp_path, header, message):
    (tmp_path / "model.safetensors").write_bytes(header)
    [shard] = inspect_checkpoint(tmp_path).shards
    assert message in shard.error


def test_size_that_does_not_match_dtype_and_shape(tmp_path):
    body = json.dumps({"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 4]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(len(body).to_bytes(8, "little") + body + b"\0" * 4)
    [shard] = inspect_checkpoint(tmp_path).shards
    assert "is 8 bytes, data_offsets span 4" in shard.error


def test_duplicate_key_in_one_header(tmp_path):
    body = b'{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
    (tmp_path / "model.safetensors").write_bytes(len(body).to_bytes(8, "little") + body + b"\0")
    [shard] = inspect_checkpoint(tmp_path).shards
    assert "duplicate keys" in shard.error


# --- the #157 stop ------------------------------------------------------------------------------


@pytest.mark.parametrize("counts, stop_at, lost", [
    ([0, 2, 3], 0, 5),  # empty first: everything
    ([2, 0, 3], None, 0),  # one empty between data shards: harmless
    ([2, 0, 0, 3, 4], 2, 7),  # two in a row: the files after them
    ([2, 3, 0, 0], 3, 0),  # two in a row at the end: the stream stops with nothing left to lose
    ([2, 0, 3, 0, 0, 1], 4, 1),
    ([0, 0, 0], 0, 0),
])
def test_stream_stop_in_sorted_order(tmp_path, counts, stop_at, lost):
    write_checkpoint(tmp_path, counts)
    report = inspect_checkpoint(tmp_path)
    [stop] = [s for s in report.stream_stops if s.order == "sorted"]
    assert (stop.stop_at, stop.lost_tensors, stop.risk) == (stop_at, lost, lost > 0)
    sorted_risks = [p for p in report.problems if p.kind == "stream_stop_risk" and p.message.startswith("sorted")]
    assert len(sorted_risks) == (lost > 0)


def shards(counts: list[int]) -> list[Shard]:
    out = []
    for i, count in enumerate(counts):
        tensors = [TensorInfo(name=f"s{i}.t{j}", dtype="U8", shape=[1], start=8 + j, end=9 + j) for j in range(count)]
        out.append(Shard(file=f"s{i}.safetensors", size=8 + count, tensors=tensors))
    return out


def test_stream_stop_follows_the_listing_order_not_the_names(tmp_path):
    write_checkpoint(tmp_path, [0, 2, 0, 3])
    report = inspect_checkpoint(tmp_path)
    listed = [n for n in os.listdir(tmp_path) if n.endswith(".safetensors")]
    [stop] = [s for s in report.stream_stops if s.order == "listing"]
    assert stop.files == listed == report.listing_order
    expected = stream_stop("listing", [next(s for s in report.shards if s.file == f) for f in listed])
    assert stop == expected


def test_a_stop_says_which_empty_shards_end_the_stream_and_which_shards_are_lost():
    first = stream_stop("sorted", shards([0, 2, 0, 3]))
    assert first.ended_by == ["s0.safetensors"]
    assert first.describe() == "stream stops at empty shard s0 (first); lost 5/5 tensors: 2 shards from s1 on"
    # data, empty, empty, data: the second empty shard begins a request with nothing in it.
    middle = stream_stop("listing", shards([3, 0, 0, 2]))
    assert (middle.stop_at, middle.ended_by, middle.lost_files) == (2, ["s1.safetensors", "s2.safetensors"], ["s3.safetensors"])
    assert middle.describe() == "stream stops at empty shards s1, s2 (two in a row); lost 2/5 tensors: shard s3"
    # A third empty shard in the row changes nothing: the stop is at the second.
    assert stream_stop("sorted", shards([3, 0, 0, 0, 2, 1])).ended_by == ["s1.safetensors", "s2.safetensors"]
    safe = stream_stop("sorted", shards([3, 0, 2]))
    assert (safe.ended_by, safe.describe()) == ([], "")


@pytest.mark.parametrize("counts, missing, stop_at, lost_files", [
    ([3, 0, 0, 2], {"s3.safetensors": 2}, 2, ["s3.safetensors"]),  # what #157 predicts: placed as predicted
    ([0, 2, 3], {"s1.safetensors": 2, "s2.safetensors": 3}, 0, ["s1.safetensors", "s2.safetensors"]),
    ([3, 0, 2, 1], {"s2.safetensors": 2, "s3.safetensors": 1}, None, ["s2.safetensors", "s3.safetensors"]),
    ([3, 0, 0, 2, 1], {"s4.safetensors": 1}, None, ["s4.safetensors"]),  # a tail, but not #157's
])
def test_observed_stop_is_placed_where_the_prediction_is_when_the_loss_matches_it(counts, missing, stop_at, lost_files):
    stop = checkpoint.observed_stop("o", shards(counts), missing)
    assert (stop.stop_at, stop.lost_files) == (stop_at, lost_files)
    assert stop.lost_tensors == sum(missing.values()) and stop.tensors == sum(counts)
    if stop_at is None:
        assert stop.describe().startswith(f"stream stops before {lost_files[0].removesuffix('.safetensors')};")


def test_observed_stop_is_none_for_losses_that_are_not_a_tail():
    assert checkpoint.observed_stop("o", shards([3, 0, 2]), {}) is None
    assert checkpoint.observed_stop("o", shards([3, 0, 2]), {"s0.safetensors": 1}) is None
    assert checkpoint.observed_stop("o", shards([3, 0, 2]), {"s2.safetensors": 1}) is None


def test_a_shard_of_zero_sized_tensors_streams_nothing_like_an_empty_one():
    zero = Shard(file="z.safetensors", size=8, tensors=[TensorInfo(name="z", dtype="F32", shape=[0], start=8, end=8)])
    stop = stream_stop("sorted", [zero, *shards([2])])
    assert stop.stop_at == 0 and stop.lost_tensors == 3


def test_a_broken_header_does_not_count_as_empty():
    broken = Shard(file="b.safetensors", size=3, error="too short")
    assert stream_stop("sorted", [broken, *shards([2])]).stop_at is None


# --- census and quantization ---------------------------------------------------------------------


def test_dtype_census_scales_and_quantization(tmp_path):
    write_shard(tmp_path / "model-00001-of-00002.safetensors", [
        raw("l.0.q.weight", "F8_E4M3", (4, 4)),
        raw("l.0.q.weight_scale", "F32", (1, 1)),
        raw("l.0.q.input_scale", "F32", (1, 1)),
        raw("l.0.norm.weight", "BF16", (4, 1)),
    ])
    write_shard(tmp_path / "model-00002-of-00002.safetensors", [
        raw("l.1.q.weight", "U8", (4, 2)),  # FP4, two values a byte
        raw("l.1.q.weight_scale", "F8_E4M3", (4, 1)),
        raw("l.1.q.weight_scale_2", "F32", (1, 1)),
        raw("l.1.q.input_scale", "F32", (1, 1)),
    ])
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16}}))
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "modelopt"}}))
    report = inspect_checkpoint(tmp_path)
    census = {d.dtype: (d.tensors, d.bytes) for d in report.dtypes}
    assert census == {"BF16": (1, 8), "F32": (4, 16), "F8_E4M3": (2, 20), "U8": (1, 8)}
    scales = {s.suffix: (s.tensors, s.dtypes) for s in report.scales}
    assert scales == {"weight_scale_2": (1, ["F32"]), "weight_scale": (2, ["F32", "F8_E4M3"]),
                      "input_scale": (2, ["F32"])}
    assert [(q.source, q.method) for q in report.quantization] == [
        ("hf_quant_config.json", "NVFP4"), ("config.json:quantization_config", "modelopt")]
    assert report.quantization[0].settings["group_size"] == 16
    assert report.ok


def test_unreadable_config_json(tmp_path):
    write_checkpoint(tmp_path, [1])
    (tmp_path / "config.json").write_text("{not json")
    assert kinds(inspect_checkpoint(tmp_path)) == ["unreadable_config"]


# --- not a checkpoint ----------------------------------------------------------------------------


def test_not_a_checkpoint(tmp_path, capsys):
    (tmp_path / "README.md").write_text("hi")
    with pytest.raises(NotACheckpoint):
        inspect_checkpoint(tmp_path)
    with pytest.raises(NotACheckpoint):
        inspect_checkpoint(tmp_path / "README.md")
    assert main(["inspect", str(tmp_path)]) == 2
    assert main(["inspect", str(tmp_path / "nope")]) == 2
    captured = capsys.readouterr()
    assert "no *.safetensors" in captured.err and "not a directory" in captured.err
    assert "Traceback" not in captured.err


# --- baseline hashing ----------------------------------------------------------------------------


def test_hash_tensors_matches_the_written_bytes_across_units_and_chunks(tmp_path, monkeypatch):
    layout = write_checkpoint(tmp_path, [3, 0, 5, 1])
    # Tiny units and chunks: many units per file, many reads per tensor, in parallel.
    monkeypatch.setattr(checkpoint, "UNIT", 40)
    monkeypatch.setattr(checkpoint, "CHUNK", 7)
    report = inspect_checkpoint(tmp_path)
    hashes = hash_tensors(tmp_path, report.shards, workers=3)
    expected = [(f, t.name, hashlib.sha256(t.data).hexdigest()) for f, ts in layout.items() for t in ts]
    assert [(h.file, h.name, h.sha256) for h in hashes] == expected
    assert all(h.nbytes == 24 and h.shape == [2, 3] and h.dtype == "F32" for h in hashes)


def test_hash_tensors_reports_a_file_that_shrank(tmp_path):
    write_checkpoint(tmp_path, [2])
    report = inspect_checkpoint(tmp_path)
    path = tmp_path / shard_name(1, 1)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(OSError, match="ends before"):
        hash_tensors(tmp_path, report.shards)


def test_inspect_names_the_stream_stops_releases_from_the_signature_library(tmp_path, capsys):
    """One source: the measured ranges of bench/signatures/runai-empty-shard-stream-stop.yaml,
    in the problem (what the pre-flight records) and in the table, and no other range."""
    from bench.core.diagnosis import shipped_releases, stream_stop_releases

    write_checkpoint(tmp_path, [0, 2, 3])
    (risk,) = [p for p in inspect_checkpoint(tmp_path).problems if p.kind == "stream_stop_risk" and
               p.message.startswith("sorted")]
    said = stream_stop_releases()
    assert risk.message.endswith(f"({said})")
    assert "silent in 0.13.3 and 0.15.0–0.16.0" in said and "fixed in 0.16.1" in said
    assert shipped_releases().regime("0.14.0") == "loud"  # the range upstream cites is not all silent
    assert main(["inspect", str(tmp_path)]) == 1
    text = " ".join(capsys.readouterr().out.split())
    assert f"stream stop ({said}):" in text and "0.14.0-0.16.0" not in text
