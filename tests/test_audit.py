"""The weight audit: the comparison on made-up deliveries, and the real runai-model-streamer
versions (side-by-side overlays) on the canary and on hand-written layouts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cli import main
from bench.weights.audit import (
    Delivered,
    FileOrder,
    _parse,
    audit_checkpoint,
    compare,
    default_python,
    file_orders,
)
from bench.weights.checkpoint import TensorHash, hash_tensors, inspect_checkpoint, stream_stop
from bench.weights.errors import AuditError, ReaderError
from bench.weights.model import AuditReport
from bench.weights.protocols import READER

from .support import CANARY, ROOT, needs_canary, needs_vllm, shard_name, write_checkpoint

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


def test_a_stream_that_stops_is_a_tail_of_lost_shards():
    base = baseline_of(LAYOUT)
    run = compare(ORDER, "streamer", base, [delivered(h) for h in base[:2]], None, 0.1)
    assert run.missing == ["b0", "c0", "c1"]
    assert [(f.file, f.missing, f.tensors) for f in run.file_losses] == [("b.safetensors", 1, 1), ("c.safetensors", 2, 2)]
    # One empty shard between data shards does not stop #157's stream: the stop is not placed at it.
    assert (run.stop.stop_at, run.stop.lost_files) == (None, ["b.safetensors", "c.safetensors"])
    assert run.line() == ("order=o loader=streamer: 2/5 tensors delivered; "
                          "stream stops before b; lost 3/5 tensors: 2 shards from b on")
    assert not run.ok


def test_scattered_losses_are_listed_per_file():
    base = baseline_of(LAYOUT)
    run = compare(ORDER, "streamer", base, [delivered(h) for h in base if h.name not in ("a1", "c0")], None, 0.1)
    assert run.stop is None
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
    # The stream ended where the loader raised, not at an empty shard.
    assert run.stop.stop_at is None
    assert run.line().endswith("0/5 tensors delivered; stream stops before a; lost 5/5 tensors: 3 shards from a on; "
                               "ValueError: max() arg is an empty sequence")


# --- one description of a stop, in inspect and in audit ----------------------------------------

# data, empty, empty, data, data in name order: #157 stops at the second empty shard.
DEED = [5, 0, 0, 4, 3]
DEED_SORTED = ("stream stops at empty shards model-00002-of-00005, model-00003-of-00005 (two in a row); "
               "lost 7/12 tensors: 2 shards from model-00004-of-00005 on")


def as_157_would_deliver(baseline: list[TensorHash], lost_files: list[str]) -> list[Delivered]:
    return [delivered(h) for h in baseline if h.file not in lost_files]


def test_inspect_and_audit_describe_a_stop_in_the_same_words(tmp_path, capsys):
    write_checkpoint(tmp_path, DEED)
    report = inspect_checkpoint(tmp_path)
    baseline = hash_tensors(tmp_path, report.shards)
    predicted = {s.order: s for s in report.stream_stops}
    assert predicted["sorted"].describe() == DEED_SORTED
    assert main(["inspect", str(tmp_path)]) == 1
    inspected = capsys.readouterr().out
    for run in file_orders(report, ALL_ORDERS, shuffles=6, seed=3):
        stop = stream_stop(run.order, [next(s for s in report.shards if s.file == f) for f in run.files])
        audited = compare(run, "streamer", baseline, as_157_would_deliver(baseline, stop.lost_files), None, 0.1,
                          report.shards)
        assert audited.stop == (stop if stop.risk else None), run.files
        assert audited.ok == (not stop.risk)
        if stop.risk:
            assert audited.line().startswith(f"order={run.order} loader=streamer: {12 - stop.lost_tensors}/12 "
                                             f"tensors delivered; {stop.describe()}")
        if run.order in predicted:
            assert predicted[run.order] == stop
            assert (f"{run.order:8} {stop.describe()}" if stop.risk else f"{run.order:8} safe") in inspected
    assert DEED_SORTED in inspected


# --- orders and the reader protocol ---------------------------------------------------------------


def test_orders_and_seeded_shuffles(tmp_path):
    write_checkpoint(tmp_path, [1, 1, 1, 1, 1])
    report = inspect_checkpoint(tmp_path)
    names = sorted(s.file for s in report.shards)
    orders = file_orders(report, ALL_ORDERS, shuffles=3, seed=7)
    assert [o.order for o in orders] == [*ALL_ORDERS, "shuffle1", "shuffle2", "shuffle3"]
    assert orders[0].files == names and orders[1].files == names[::-1]
    assert orders[2].files == report.listing_order
    assert all(sorted(o.files) == names for o in orders[3:])
    assert [o.files for o in file_orders(report, [], 3, 7)] == [o.files for o in orders[3:]]
    assert [o.files for o in file_orders(report, [], 3, 8)] != [o.files for o in orders[3:]]
    with pytest.raises(AuditError, match="unknown order"):
        file_orders(report, ["backwards"], 0, 0)


def test_reader_output_outside_the_protocol_is_an_error():
    with pytest.raises(ReaderError, match="not part of its protocol"):
        _parse("Loading weights...\n", "")
    with pytest.raises(ReaderError, match="cannot stream: ModuleNotFoundError"):
        _parse(json.dumps({"type": "fatal", "error": "ModuleNotFoundError: no torch"}), "")
    with pytest.raises(ReaderError, match="before it could import"):
        _parse("", "Segmentation fault")


def test_a_python_without_the_streamer_is_a_usage_error(tmp_path, capsys):
    write_checkpoint(tmp_path, [1])
    # The bench's own venv has no torch: the reader says so and the audit stops, exit 2.
    with pytest.raises(ReaderError, match="cannot stream: ModuleNotFoundError"):
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
    """An interpreter stand-in that speaks the reader's protocol, starts the first run, then
    does `after_begin` (a shell command): how a streamer that hangs or crashes looks."""
    hello = json.dumps({"type": "hello", "python": "fake", "streamer_version": "0.16.0", "streamer_path": "/x",
                        "torch_version": "0", "vllm_version": None, "vllm_error": None})
    begin = json.dumps({"type": "begin", "order": "sorted", "loader": "streamer"})
    script = tmp_path / "fake-python"
    script.write_text(f"#!/bin/sh\necho '{hello}'\necho '{begin}'\n{after_begin}\n")
    script.chmod(0o755)
    return str(script)


def test_a_report_written_when_the_reader_was_called_the_probe_reads_the_same(tmp_path):
    write_checkpoint(tmp_path / "ckpt", [2, 1])
    report = audit_checkpoint(tmp_path / "ckpt", fake_python(tmp_path, "exit 0"), orders=["sorted"], loaders=["streamer"])
    written = json.loads(report.model_dump_json())
    assert written["reader_exit_code"] == 0 and written["reader_seconds"] > 0
    assert not any(key.startswith("probe_") for key in written)
    old = {key.replace("reader_", "probe_"): value for key, value in written.items()}
    assert AuditReport.model_validate_json(json.dumps(old)) == report


@pytest.mark.parametrize("after_begin, timeout_s, reason", [
    ("kill -SEGV $$", 60, "the reader died of signal 11 (Segmentation fault) while streaming"),
    ("exec sleep 30", 1, "timed out after 1 s while streaming"),
])
def test_a_reader_that_dies_or_hangs_fails_the_run_it_was_in(tmp_path, after_begin, timeout_s, reason):
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
    assert run.line() == ("order=sorted loader=streamer: 0/21 tensors delivered; stream stops at empty shard "
                          "model-00001-of-00010 (first); lost 21/21 tensors: 6 shards from model-00002-of-00010 on")
    assert run.stop == inspect_checkpoint(CANARY).stream_stops[0]
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
    # The stream stops at the second of the two empty shards in a row, as inspect says.
    assert runs["sorted"].stop.ended_by == [shard_name(3, 6), shard_name(4, 6)]
    assert runs["sorted"].stop.lost_files == [shard_name(5, 6), shard_name(6, 6)]
    assert sorted(runs["reversed"].missing) == sorted(t.name for f in (shard_name(1, 6), shard_name(2, 6)) for t in layout[f])
    inspected = inspect_checkpoint(tmp_path)
    by_file = {s.file: s for s in inspected.shards}
    for run in report.runs:
        predicted = stream_stop(run.order, [by_file[f] for f in run.files])
        assert len(run.missing) == predicted.lost_tensors, run.line()
        assert run.stop == (predicted if predicted.risk else None), run.line()
        assert not run.extra and not run.duplicated and not run.mismatched and run.error is None


@pytest.mark.slow
def test_0_16_0_stop_is_described_alike_by_both_commands(tmp_path, capsys):
    write_checkpoint(tmp_path, DEED)
    assert main(["inspect", str(tmp_path)]) == 1
    inspected = capsys.readouterr().out
    assert main(["audit", str(tmp_path), "--pythonpath", *overlay("0.16.0"), "--loaders", "streamer",
                 "--orders", "sorted,listing"]) == 1
    audited = capsys.readouterr().out
    assert "✗ order=sorted loader=streamer: 5/12 tensors delivered\n" in audited
    assert f"\n    {DEED_SORTED}\n" in audited and f"sorted   {DEED_SORTED}\n" in inspected
    # The listing order is whatever this filesystem gives: the two commands agree on it too.
    listing = inspect_checkpoint(tmp_path).stream_stops[1]
    if listing.risk:
        assert f"\n    {listing.describe()}\n" in audited and f"listing  {listing.describe()}\n" in inspected
    else:
        assert "✓ order=listing loader=streamer: 12/12 tensors delivered" in audited


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
    assert main(["audit", str(CANARY), "--pythonpath", *overlay("0.16.0"), "--loaders", "streamer",
                 "--orders", "sorted,listing"]) == 1
    text = capsys.readouterr().out
    assert "✗ order=listing loader=streamer: 0/21 tensors delivered\n" in text
    listing = inspect_checkpoint(CANARY).stream_stops[1]
    assert f"\n    {listing.describe()}\n" in text
    assert main(["audit", str(CANARY), "--pythonpath", *overlay("0.17.0"), "--loaders", "streamer", "--format", "json",
                 "--env", "RUNAI_STREAMER_CONCURRENCY=2", "RUNAI_STREAMER_CHUNK_BYTESIZE=65536"]) == 0
    report = AuditReport.model_validate_json(capsys.readouterr().out)
    assert report.ok and [r.order for r in report.runs] == ALL_ORDERS
    assert report.env == {"RUNAI_STREAMER_CONCURRENCY": "2", "RUNAI_STREAMER_CHUNK_BYTESIZE": "65536"}


@pytest.mark.slow
@pytest.mark.parametrize("version, delivered", [("0.16.0", 0), ("0.17.0", 21)])
def test_vllm_iterator_sees_what_the_streamer_sees(version, delivered):
    # vLLM's own iterator, compiled from its file: vLLM itself is not imported (that takes ~10 s).
    report = audit_checkpoint(CANARY, default_python(), overlay(version), {}, orders=["listing"])
    assert report.vllm_version is not None and not report.skipped
    assert report.vllm_iterator.startswith("runai_safetensors_weights_iterator compiled from ")
    assert report.vllm_iterator.endswith("weight_utils.py (vLLM not imported)")
    assert [(r.loader, r.delivered) for r in report.runs] == [("streamer", delivered), ("vllm", delivered)]


# --- vLLM's iterator without importing vLLM -------------------------------------------------------

READER_DRIVER = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("reader", sys.argv[1])
reader = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reader)  # from here on, only reader.emit writes to stdout
sys.path.insert(0, sys.argv[2])
try:
    iterator, how = reader.load_vllm_iterator()
except Exception as exc:
    reader.emit(error=reader.describe(exc))
    sys.exit()
result = dict(how=how, names=sorted(k for k in iterator.__globals__ if not k.startswith("__")),
              vllm_imported="vllm" in sys.modules)
try:
    result["out"] = [list(t) for t in iterator(["/x/a.safetensors", "/x/b.safetensors"], False)]
except Exception as exc:
    result["out"] = reader.describe(exc)
reader.emit(**result)
"""

FAKE_WEIGHT_UTILS = """
import os
from collections.abc import Generator

from vllm.config import ModelConfig
from vllm.platforms import current_platform

try:
    from json import dumps as SafetensorsStreamer
except ImportError:
    SafetensorsStreamer = None

_FORMAT = "{name}@{device}"


def where(name, device):
    return _FORMAT.format(name=name, device=device)


def other():
    return ModelConfig


def keep(f):
    return f


{decorator}def runai_safetensors_weights_iterator(files: list[str], use_tqdm: bool) -> Generator[tuple[str, str], None, None]:
    device = "cuda" if current_platform.is_cuda_alike() else "cpu"
    for f in files:
        yield {uses}os.path.basename(f), where(SafetensorsStreamer(f), device)
"""


def fake_vllm(root: Path, decorator: str = "", uses: str = "") -> Path:
    """A package named vllm whose weight_utils defines the iterator; importing any of it is recorded."""
    package = root / "vllm"
    (package / "model_executor" / "model_loader").mkdir(parents=True)
    for init in (package, package / "model_executor", package / "model_executor" / "model_loader"):
        (init / "__init__.py").write_text("")
    (package / "config.py").write_text("ModelConfig = 'the config'\n")
    (package / "platforms.py").write_text(
        "class P:\n    def is_cuda_alike(self):\n        return True\ncurrent_platform = P()\n")
    (package / "model_executor" / "model_loader" / "weight_utils.py").write_text(
        FAKE_WEIGHT_UTILS.replace("{decorator}", decorator).replace("{uses}", uses))
    return root


def run_reader_loader(root: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", READER_DRIVER, str(READER), str(root)], capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout)


def test_the_iterator_is_compiled_from_the_installed_file_with_what_it_uses(tmp_path):
    result = run_reader_loader(fake_vllm(tmp_path))
    assert result["how"].startswith("runai_safetensors_weights_iterator compiled from ")
    assert result["how"].endswith("vllm/model_executor/model_loader/weight_utils.py (vLLM not imported)")
    assert not result["vllm_imported"]
    # Its own module-level helpers and imports, nothing else (not `other`, not ModelConfig).
    assert result["names"] == ["Generator", "SafetensorsStreamer", "_FORMAT", "current_platform", "os",
                               "runai_safetensors_weights_iterator", "where"]
    # The real import in the try: body (json.dumps), and the stand-in platform (not CUDA).
    assert result["out"] == [["a.safetensors", '"/x/a.safetensors"@cpu'], ["b.safetensors", '"/x/b.safetensors"@cpu']]


@pytest.mark.parametrize("decorator, uses, reason, out", [
    ("@keep\n", "", "runai_safetensors_weights_iterator is decorated", None),
    ("", "ModelConfig and ", "needs ModelConfig from vllm.config", None),
    # Importing the module does not make the name exist: streaming then raises, a finding of the run.
    ("", "undefined_name and ", "needs undefined_name, which", "NameError: name 'undefined_name' is not defined"),
])
def test_an_iterator_that_needs_more_of_vllm_is_imported_instead(tmp_path, decorator, uses, reason, out):
    result = run_reader_loader(fake_vllm(tmp_path, decorator, uses))
    assert result["vllm_imported"]
    assert result["how"].startswith("vllm.model_executor.model_loader.weight_utils imported (NotExtractable: ")
    assert reason in result["how"]
    # The imported module's own platform, not the stand-in: this fake one says CUDA.
    assert result["out"] == out or [row[1].endswith("@cuda") for row in result["out"]] == [True, True]


def test_no_vllm_at_all_is_reported_as_such(tmp_path):
    assert run_reader_loader(tmp_path) == {"error": "ModuleNotFoundError: No module named 'vllm'"}


@pytest.mark.slow
def test_the_compiled_iterator_is_vllms_own_code():
    # In the real vLLM venv: the extracted iterator has the same bytecode as the imported one, and
    # every name it uses is bound to the same object, but current_platform (the stand-in).
    script = """
import importlib.util, sys, types
spec = importlib.util.spec_from_file_location("reader", sys.argv[1])
reader = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reader)
extracted, how = reader.load_vllm_iterator()
import vllm.model_executor.model_loader.weight_utils as real
def same(a, b):
    consts = lambda c: [k for k in c.co_consts if not isinstance(k, types.CodeType)]
    codes = lambda c: [k for k in c.co_consts if isinstance(k, types.CodeType)]
    return (a.co_code == b.co_code and a.co_names == b.co_names and consts(a) == consts(b)
            and all(same(x, y) for x, y in zip(codes(a), codes(b))) and len(codes(a)) == len(codes(b)))
names = sorted(k for k in extracted.__globals__ if not k.startswith("__"))
reader.emit(how=how, names=names,
           same_code=same(extracted.__code__, real.runai_safetensors_weights_iterator.__code__),
           same_objects={n: extracted.__globals__[n] is real.__dict__[n]
                         or (isinstance(real.__dict__[n], (str, int, float, tuple))
                             and extracted.__globals__[n] == real.__dict__[n]) for n in names},
           functions_same_code={n: same(extracted.__globals__[n].__code__, real.__dict__[n].__code__)
                                for n in names if isinstance(extracted.__globals__[n], types.FunctionType)})
"""
    done = subprocess.run([default_python(), "-c", script, str(READER)], capture_output=True, text=True, check=True)
    result = json.loads(done.stdout)
    assert "(vLLM not imported)" in result["how"] and result["same_code"]
    assert all(result["functions_same_code"].values()) and "enable_tqdm" in result["functions_same_code"]
    differ = {n for n, same in result["same_objects"].items() if not same}
    # The module's own functions are compiled anew (same code, new objects), its constants are
    # equal, and of what it imports, only the platform is stood in for.
    assert differ == {"current_platform", *result["functions_same_code"]}
    assert {"torch", "tqdm", "SafetensorsStreamer", "_BAR_FORMAT"} <= set(result["names"])


@needs_vllm  # its safetensors is the reference
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


# Measured release by release on the canary (docs/diagnosis.md); one release per regime here.
REGIMES = [
    ("0.13.0", "fails loudly", "AttributeError: 'NoneType' object has no attribute 'chunks'"),  # only stream_file
    ("0.13.3", "loses silently", None),  # stream_files without device
    ("0.14.0", "fails loudly", "ValueError: max() arg is an empty sequence"),
    ("0.15.0", "loses silently", None),
    ("0.16.1", "delivers everything", None),
]


@pytest.mark.parametrize(("version", "regime", "error"), REGIMES)
@needs_vllm  # and its overlays (scripts/setup-vllm.sh installs both)
@needs_canary
def test_older_streamer_apis_are_called_the_way_they_take_and_show_their_own_regime(version, regime, error):
    report = audit_checkpoint(CANARY, default_python(), overlay(version), {}, orders=["sorted"], loaders=["streamer"])
    [run] = report.runs
    assert report.streamer_version == version
    assert "unexpected keyword argument" not in str(run.error) and "no attribute 'stream_files'" not in str(run.error)
    if regime == "delivers everything":
        assert report.ok and run.delivered == 21
    else:
        assert run.delivered == 0 and report.lost == 21
        assert (run.error is not None and error in run.error) if regime == "fails loudly" else run.error is None


def fake_streamer(root: Path, version: str, body: str) -> str:
    """An overlay holding a made-up runai-model-streamer release (package and metadata)."""
    pkg = root / "runai_model_streamer"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(body)
    meta = root / f"runai_model_streamer-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: runai-model-streamer\nVersion: {version}\n")
    return str(root)


@pytest.mark.parametrize(("body", "why"), [
    ("", "no SafetensorsStreamer"),
    ("class SafetensorsStreamer:\n"
     "    def __enter__(self): return self\n"
     "    def __exit__(self, *a): pass\n"
     "    def get_tensors(self): return iter(())\n"
     "    def stream_files(self, requests, credentials, device): pass\n", "take other arguments"),
])
@needs_vllm
def test_a_release_the_reader_cannot_call_is_unsupported_never_a_loss(tmp_path, capsys, body, why):
    path = fake_streamer(tmp_path / "overlay", "0.0.1", body)
    report = audit_checkpoint(CANARY, default_python(), [path], {}, orders=["sorted", "listing"], loaders=["streamer"])
    assert report.streamer_version == "0.0.1"
    assert [r.unsupported is not None and why in r.unsupported for r in report.runs] == [True, True]
    assert report.lost == 0 and not report.problems and not report.ok
    assert all(r.missing == [] and r.stop is None and r.error is None for r in report.runs)
    assert main(["audit", str(CANARY), "--pythonpath", path, "--loaders", "streamer"]) == 2
    shown = capsys.readouterr().out
    assert "the reader cannot drive this loader version" in shown and "lost" not in shown


def test_the_last_line_says_a_loader_that_raised_failed_loudly_not_that_it_lost_weights(tmp_path, capsys):
    # The loader raises at the start of each run, as 0.13.4-0.14.0's does at an empty first shard.
    write_checkpoint(tmp_path / "ckpt", [2, 1])
    error = "ValueError: max() arg is an empty sequence"
    lines = [{"type": "end", "order": "sorted", "loader": "streamer", "error": error, "seconds": 0.1},
             {"type": "begin", "order": "reversed", "loader": "streamer"},
             {"type": "end", "order": "reversed", "loader": "streamer", "error": error, "seconds": 0.1},
             {"type": "done", "streamer_version": "0.14.0"}]
    python = fake_python(tmp_path, "\n".join(f"echo '{json.dumps(x)}'" for x in lines))
    assert main(["audit", str(tmp_path / "ckpt"), "--python", python, "--orders", "sorted,reversed",
                 "--loaders", "streamer"]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"2 run(s) failed loudly ({error})"
