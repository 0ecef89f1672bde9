"""The weight audit: the comparison on made-up deliveries, and the real runai-model-streamer
versions (side-by-side overlays) on the canary and on hand-written layouts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.audit import (
    AuditError, AuditReport, Delivered, FileOrder, ProbeError, _parse, audit_checkpoint, compare,
    default_python, file_orders,
)
from bench.checkpoint import TensorHash, hash_tensors, inspect_checkpoint, stream_stop
from bench.cli import main

from .conftest import ROOT
from .test_checkpoint import CANARY, shard_name, write_checkpoint

STREAMERS = ROOT / ".cache" / "streamers"
ALL_ORDERS = ["sorted", "reversed", "listing"]


def overlay(version: str) -> list[str]:
    path = STREAMERS / version
    assert (path / "runai_model_streamer").is_dir(), f"the {version} overlay is not installed at {path}"
    return [str(path)]


# --- the comparison, on made-up deliveries -------------------------------------------------------


def baseline_of(files: dict[str, list[str]]) -> list[TensorHash]:
    return [TensorHash(file=f, name=n, dtype="F32", shape=[2], nbytes=8, sha256=f"sha-{n}")
            for f, names in files.items() for n in names]


def delivered(h: TensorHash, **changes) -> Delivered:
    fields = dict(type="tensor", order="o", loader="streamer", name=h.name, dtype=h.dtype, shape=h.shape,
                  nbytes=h.nbytes, sha256=h.sha256)
    return Delivered(**(fields | changes))


LAYOUT = {"a.safetensors": ["a0", "a1"], "e.safetensors": [], "b.safetensors": ["b0"], "c.safetensors": ["c0", "c1"]}
ORDER = FileOrder(order="o", files=list(LAYOUT))


def test_everything_delivered_in_any_order_is_ok():
    base = baseline_of(LAYOUT)
    run = compare(ORDER, "streamer", base, [delivered(h) for h in reversed(base)], None, 0.1)
    assert run.ok and run.delivered == run.expected == 5
    assert run.line() == "order=o loader=streamer: 5/5 tensors delivered"


def test_a_stream_that_stops_is_lost_from_the_file_after_the_last_delivering_one():
    base = baseline_of(LAYOUT)
    run = compare(ORDER, "streamer", base, [delivered(h) for h in base[:2]], None, 0.1)
    assert run.missing == ["b0", "c0", "c1"]
    assert run.lost_from == "e.safetensors"
    assert [(f.file, f.missing, f.tensors) for f in run.file_losses] == [("b.safetensors", 1, 1), ("c.safetensors", 2, 2)]
    assert run.line() == "order=o loader=streamer: 2/5 tensors delivered, lost from e onwards"
    assert not run.ok


def test_scattered_losses_are_listed_per_file():
    base = baseline_of(LAYOUT)
    run = compare(ORDER, "streamer", base, [delivered(h) for h in base if h.name not in ("a1", "c0")], None, 0.1)
    assert run.lost_from is None
    assert run.line() == "order=o loader=streamer: 3/5 tensors delivered, missing in a (1/2), c (1/2)"


def test_extra_duplicated_and_altered_tensors():
    base = baseline_of(LAYOUT)
    got = [delivered(h) for h in base]
    got[0] = delivered(base[0], sha256="other")
    got[1] = delivered(base[1], dtype="BF16", shape=[4])
    got += [delivered(base[3]), delivered(base[3], name="ghost")]
    run = compare(ORDER, "streamer", base, got, None, 0.1)
    assert run.missing == [] and run.extra == ["ghost"] and run.duplicated == ["c0"]
    assert [(m.name, m.field) for m in run.mismatched] == [("a0", "bytes"), ("a1", "dtype"), ("a1", "shape")]
    assert "1 unknown, 1 duplicated, 2 differ from the files" in run.line()


def test_a_name_in_two_shards_must_arrive_twice_with_each_shards_bytes():
    base = baseline_of({"a.safetensors": ["w"], "b.safetensors": ["w"]})
    base[1] = base[1].model_copy(update={"sha256": "sha-w-b"})
    assert compare(FileOrder(order="o", files=["a.safetensors", "b.safetensors"]), "streamer", base,
                   [delivered(base[1]), delivered(base[0])], None, 0.1).ok
    once = compare(FileOrder(order="o", files=["a.safetensors", "b.safetensors"]), "streamer", base,
                   [delivered(base[0])], None, 0.1)
    assert once.missing == ["w"] and once.file_losses[0].file == "b.safetensors"


def test_a_loader_that_raised_is_a_finding_with_its_message():
    base = baseline_of(LAYOUT)
    run = compare(ORDER, "streamer", base, [], "ValueError: max() arg is an empty sequence", 0.1)
    assert not run.ok
    assert run.line().endswith("0/5 tensors delivered, lost from a onwards; ValueError: max() arg is an empty sequence")


# --- orders and the probe protocol ---------------------------------------------------------------


def test_orders_and_seeded_shuffles(tmp_path):
    write_checkpoint(tmp_path, [1, 1, 1, 1, 1])
    report = inspect_checkpoint(tmp_path)
    names = sorted(s.file for s in report.shards)
    orders = file_orders(report, ALL_ORDERS, shuffles=3, seed=7)
    assert [o.order for o in orders] == ALL_ORDERS + ["shuffle1", "shuffle2", "shuffle3"]
    assert orders[0].files == names and orders[1].files == names[::-1]
    assert orders[2].files == report.listing_order
    assert all(sorted(o.files) == names for o in orders[3:])
    assert [o.files for o in file_orders(report, [], 3, 7)] == [o.files for o in orders[3:]]
    assert [o.files for o in file_orders(report, [], 3, 8)] != [o.files for o in orders[3:]]
    with pytest.raises(AuditError, match="unknown order"):
        file_orders(report, ["backwards"], 0, 0)


def test_probe_output_outside_the_protocol_is_an_error():
    with pytest.raises(ProbeError, match="not part of its protocol"):
        _parse("Loading weights...\n", "")
    with pytest.raises(ProbeError, match="cannot stream: ModuleNotFoundError"):
        _parse(json.dumps({"type": "fatal", "error": "ModuleNotFoundError: no torch"}), "")
    with pytest.raises(ProbeError, match="before it could import"):
        _parse("", "Segmentation fault")


def test_a_python_without_the_streamer_is_a_usage_error(tmp_path, capsys):
    write_checkpoint(tmp_path, [1])
    # The bench's own venv has no torch: the probe says so and the audit stops, exit 2.
    with pytest.raises(ProbeError, match="cannot stream: ModuleNotFoundError"):
        audit_checkpoint(tmp_path, sys.executable, loaders=["streamer"])
    assert main(["audit", str(tmp_path), "--python", sys.executable, "--loaders", "streamer"]) == 2
    assert "cannot stream: ModuleNotFoundError: No module named 'torch'" in capsys.readouterr().err
    assert main(["audit", str(tmp_path), "--python", str(tmp_path / "no-python")]) == 2
    assert main(["audit", str(tmp_path), "--orders", "backwards"]) == 2
    assert main(["audit", str(tmp_path), "--env", "NOT A PAIR"]) == 2
    assert main(["audit", str(tmp_path), "--pythonpath", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "cannot run" in err and "expected NAME=VALUE" in err


def fake_python(tmp_path: Path, after_begin: str) -> str:
    """An interpreter stand-in that speaks the probe's protocol, starts the first run, then
    does `after_begin` (a shell command): how a streamer that hangs or crashes looks."""
    hello = json.dumps({"type": "probe", "python": "fake", "streamer_version": "0.16.0", "streamer_path": "/x",
                        "torch_version": "0", "vllm_version": None, "vllm_error": None})
    begin = json.dumps({"type": "begin", "order": "sorted", "loader": "streamer"})
    script = tmp_path / "fake-python"
    script.write_text(f"#!/bin/sh\necho '{hello}'\necho '{begin}'\n{after_begin}\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("after_begin, timeout_s, reason", [
    ("kill -SEGV $$", 60, "the probe died of signal 11 (Segmentation fault) while streaming"),
    ("exec sleep 30", 1, "timed out after 1 s while streaming"),
])
def test_a_probe_that_dies_or_hangs_fails_the_run_it_was_in(tmp_path, after_begin, timeout_s, reason):
    write_checkpoint(tmp_path / "ckpt", [2, 1])
    report = audit_checkpoint(tmp_path / "ckpt", fake_python(tmp_path, after_begin), orders=["sorted", "reversed"],
                              loaders=["streamer"], timeout_s=timeout_s)
    first, second = report.runs
    assert first.error == reason and first.delivered == 0 and first.expected == 3
    assert second.error.startswith("not run: ") and not second.ok
    assert len(report.problems) == 2 and report.lost == 6


# --- the real streamer ---------------------------------------------------------------------------


@pytest.mark.slow
def test_canary_with_0_16_0_in_sorted_order_loses_every_tensor(capsys):
    report = audit_checkpoint(CANARY, default_python(), overlay("0.16.0"), {}, orders=["sorted"], loaders=["streamer"])
    assert report.streamer_version == "0.16.0"
    assert report.streamer_path.startswith(str(STREAMERS / "0.16.0"))
    [run] = report.runs
    assert (run.expected, run.delivered, run.error) == (21, 0, None)
    assert run.line() == "order=sorted loader=streamer: 0/21 tensors delivered, lost from model-00001-of-00010 onwards"
    assert report.lost == 21 and report.problems == [run.line()]


@pytest.mark.slow
def test_0_16_0_loses_exactly_what_the_inspector_predicts_for_every_order(tmp_path):
    # Two consecutive empty shards in the middle: in name order (and reversed, the layout being
    # symmetric) the stream stops at the second one and the last two files are lost.
    counts = [2, 3, 0, 0, 4, 1]
    layout = write_checkpoint(tmp_path, counts)
    report = audit_checkpoint(tmp_path, default_python(), overlay("0.16.0"), {}, orders=ALL_ORDERS,
                              shuffles=4, seed=1, loaders=["streamer"])
    runs = {r.order: r for r in report.runs}
    assert sorted(runs["sorted"].missing) == sorted(t.name for f in (shard_name(5, 6), shard_name(6, 6)) for t in layout[f])
    assert len(runs["sorted"].missing) == 4 + 1
    # Nothing arrived after the last file that delivered: the first empty shard starts the loss.
    assert runs["sorted"].lost_from == shard_name(3, 6)
    assert sorted(runs["reversed"].missing) == sorted(t.name for f in (shard_name(1, 6), shard_name(2, 6)) for t in layout[f])
    inspected = inspect_checkpoint(tmp_path)
    by_file = {s.file: s for s in inspected.shards}
    for run in report.runs:
        predicted = stream_stop("sorted", [by_file[f] for f in run.files])
        assert len(run.missing) == predicted.lost_tensors, run.line()
        assert not run.extra and not run.duplicated and not run.mismatched and run.error is None


@pytest.mark.slow
def test_0_16_0_with_memory_limit_0_and_an_empty_shard_raises_and_the_audit_reports_it():
    report = audit_checkpoint(CANARY, default_python(), overlay("0.16.0"), {"RUNAI_STREAMER_MEMORY_LIMIT": "0"},
                              orders=["sorted"], loaders=["streamer"])
    [run] = report.runs
    assert run.error == "ValueError: max() arg is an empty sequence" and run.delivered == 0
    assert report.env == {"RUNAI_STREAMER_MEMORY_LIMIT": "0"}


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.16.1", "0.17.0"])
def test_fixed_versions_lose_nothing_in_any_order(tmp_path, version):
    write_checkpoint(tmp_path / "middle", [2, 3, 0, 0, 4, 1])
    write_checkpoint(tmp_path / "edges", [0, 0, 3, 0, 2, 0, 0])
    for ckpt in (CANARY, tmp_path / "middle", tmp_path / "edges"):
        report = audit_checkpoint(ckpt, default_python(), overlay(version), {}, orders=ALL_ORDERS, shuffles=3,
                                  seed=5, loaders=["streamer"])
        assert report.streamer_version == version
        assert len(report.runs) == 6 and report.ok, report.problems
        assert all(r.delivered == r.expected == report.baseline_tensors > 0 for r in report.runs)


@pytest.mark.slow
def test_cli_audit_exit_codes_and_json(capsys):
    assert main(["audit", str(CANARY), "--pythonpath", *overlay("0.16.0"), "--loaders", "streamer", "--orders", "sorted,listing"]) == 1
    text = capsys.readouterr().out
    assert "order=listing loader=streamer: 0/21 tensors delivered, lost from model-00001-of-00010 onwards" in text
    assert main(["audit", str(CANARY), "--pythonpath", *overlay("0.17.0"), "--loaders", "streamer", "--json",
                 "--env", "RUNAI_STREAMER_CONCURRENCY=2", "RUNAI_STREAMER_CHUNK_BYTESIZE=65536"]) == 0
    report = AuditReport.model_validate_json(capsys.readouterr().out)
    assert report.ok and [r.order for r in report.runs] == ALL_ORDERS
    assert report.env == {"RUNAI_STREAMER_CONCURRENCY": "2", "RUNAI_STREAMER_CHUNK_BYTESIZE": "65536"}


@pytest.mark.slow
@pytest.mark.parametrize("version, delivered", [("0.16.0", 0), ("0.17.0", 21)])
def test_vllm_iterator_sees_what_the_streamer_sees(version, delivered):
    # vLLM takes ~15 s to import: one probe, both loaders, one order.
    report = audit_checkpoint(CANARY, default_python(), overlay(version), {}, orders=["listing"])
    assert report.vllm_version is not None and not report.skipped
    assert [(r.loader, r.delivered) for r in report.runs] == [("streamer", delivered), ("vllm", delivered)]


def test_baseline_hashes_equal_what_safetensors_reads(tmp_path):
    # The hand-written shards and the baseline agree with the reference implementation.
    layout = write_checkpoint(tmp_path, [2, 0, 3])
    hashes = hash_tensors(tmp_path, inspect_checkpoint(tmp_path).shards)
    script = (
        "import hashlib, json, sys\n"
        "from safetensors import safe_open\n"
        "out = []\n"
        "for f in sys.argv[1:]:\n"
        "    with safe_open(f, framework='numpy') as s:\n"
        "        out += [(k, hashlib.sha256(s.get_tensor(k).tobytes()).hexdigest()) for k in s.keys()]\n"
        "print(json.dumps(out))\n"
    )
    files = [str(tmp_path / f) for f in layout]
    done = subprocess.run([default_python(), "-c", script, *files], capture_output=True, text=True, check=True)
    assert sorted(map(tuple, json.loads(done.stdout))) == sorted((h.name, h.sha256) for h in hashes)
    assert len(hashes) == 5
