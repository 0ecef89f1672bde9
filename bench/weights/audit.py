"""Weight audit: stream every tensor through the real loader and compare it with the files.

Why: a loader can lose tensors without an error. runai-model-streamer stops streaming at an
empty shard that begins a request in the releases its #157 affects (measured: 0.13.3 and
0.15.0-0.16.0; bench/signatures/runai-empty-shard-stream-stop.yaml) and the server still boots, from
whatever the model initialised the missing weights to; only the outputs say something is wrong,
much later. The audit checks the loader itself, before any server: every tensor of the files
must arrive exactly once, with the file's bytes, dtype and shape, whatever order the files come
in (vLLM's runai_streamer loader hands them over in directory-listing order).

The bench process has neither torch nor the streamer, so the streaming is done by
``reader.py`` run with the system-under-test's Python and overlay (the same PYTHONPATH
semantics as a run's image), while the bench hashes the baseline from the raw files meanwhile.
A loader that raises is a finding; a reader that cannot start at all is a ReaderError.

Where the reader runs: a process of this host, or, given an image reference, a container of that
image; each is a reader back-end registered by name (bench.weights.readers: audit_local,
audit_docker, the latter imported only then: a local audit never imports the docker SDK). Both
are context managers with the same two calls (bench.weights.protocols.Reader), and leaving them
always ends the reader.
"""

from __future__ import annotations

import json
import os
import random
import signal
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, TypeAdapter, ValidationError

from bench.core.config import Image
from bench.core.location import is_object_uri
from bench.core.records import Record
from bench.weights import readers
from bench.weights.checkpoint import Files, TensorHash, checkpoint_files, hash_tensors, inspect_files, observed_stop
from bench.weights.errors import AuditError, ReaderError
from bench.weights.model import AuditReport, AuditRun, CheckpointReport, FileLoss, Mismatch, Shard, Skipped, TensorInfo
from bench.weights.protocols import ReaderSpec

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its .venv-vllm is the default Python
ORDERS = ("sorted", "reversed", "listing")
LOADERS = ("streamer", "vllm")
DEFAULT_TIMEOUT_S = 1800.0


def default_python() -> str:
    """The system-under-test venv next to the bench, else whatever python3 is on PATH."""
    venv = ROOT / ".venv-vllm" / "bin" / "python"
    return str(venv) if venv.exists() else "python3"


# --- the reader's output ---------------------------------------------------------------------------


class ReaderHello(Record):
    type: Literal["hello"]
    python: str
    streamer_version: str
    streamer_path: str
    torch_version: str
    vllm_version: str | None
    vllm_error: str | None
    vllm_iterator: str | None = None  # how vLLM's iterator was loaded (compiled from its file, or imported)
    import_seconds: float | None = None  # torch and the streamer
    vllm_seconds: float | None = None  # loading vLLM's iterator


class ReaderBegin(Record):
    type: Literal["begin"]
    order: str
    loader: str


class Delivered(Record):
    type: Literal["tensor"]
    order: str
    loader: str
    name: str
    dtype: str
    shape: list[int]
    nbytes: int
    sha256: str


class ReaderEnd(Record):
    type: Literal["end"]
    order: str
    loader: str
    error: str | None
    seconds: float
    unsupported: str | None = None  # the reader cannot drive this loader release: nothing was audited


class ReaderDone(Record):
    type: Literal["done"]
    streamer_version: str


class ReaderFatal(Record):
    type: Literal["fatal"]
    error: str


ReaderLine = TypeAdapter(
    Annotated[ReaderHello | ReaderBegin | Delivered | ReaderEnd | ReaderDone | ReaderFatal, Field(discriminator="type")]
)


# --- orders ---------------------------------------------------------------------------------------


class FileOrder(Record):
    order: str
    files: list[str]  # shard file names, relative to the checkpoint


def file_orders(report: CheckpointReport, orders: Sequence[str], shuffles: int, seed: int) -> list[FileOrder]:
    """The file lists to stream. Shuffles are seeded so that a failing order can be replayed."""
    unknown = [o for o in orders if o not in ORDERS]
    if unknown:
        raise AuditError(f"unknown order(s) {unknown}: use {', '.join(ORDERS)}")
    if shuffles < 0:
        raise AuditError("shuffles must be >= 0")
    names = sorted(s.file for s in report.shards)
    lists = {"sorted": names, "reversed": names[::-1], "listing": list(report.listing_order)}
    out = [FileOrder(order=o, files=lists[o]) for o in orders]
    rng = random.Random(seed)
    for i in range(1, shuffles + 1):
        shuffled = list(names)
        rng.shuffle(shuffled)
        out.append(FileOrder(order=f"shuffle{i}", files=shuffled))
    return out


# --- comparison -----------------------------------------------------------------------------------


def _differences(expected: TensorHash, got: Delivered) -> list[Mismatch]:
    out = []
    if expected.dtype != got.dtype:
        out.append(Mismatch(name=got.name, field="dtype", expected=expected.dtype, got=got.dtype))
    if expected.shape != got.shape:
        out.append(Mismatch(name=got.name, field="shape", expected=str(expected.shape), got=str(got.shape)))
    if expected.sha256 != got.sha256:
        out.append(Mismatch(name=got.name, field="bytes", expected=expected.sha256, got=got.sha256))
    return out


def _shards_of(baseline: Sequence[TensorHash]) -> dict[str, Shard]:
    """Stand-ins for the inspected shards, from the baseline alone (what a test's made-up baseline has)."""
    by_file: dict[str, list[TensorInfo]] = defaultdict(list)
    for h in baseline:
        by_file[h.file].append(TensorInfo(name=h.name, dtype=h.dtype, shape=h.shape, start=0, end=h.nbytes))
    return {f: Shard(file=f, size=0, tensors=ts) for f, ts in by_file.items()}


def compare(run: FileOrder, loader: str, baseline: Sequence[TensorHash], delivered: Sequence[Delivered],
            error: str | None, seconds: float | None, shards: Sequence[Shard] | None = None) -> AuditRun:
    """Matches deliveries to the baseline as multisets per name: a name in two shards must arrive
    twice, each with the bytes of one of them. ``shards``: the inspected shards (default: what the
    baseline says of them), to place a stop exactly where `inspect` does."""
    pending: dict[str, list[TensorHash]] = defaultdict(list)
    for h in baseline:
        pending[h.name].append(h)
    unmatched: dict[str, list[Delivered]] = defaultdict(list)
    for d in delivered:
        candidates = pending.get(d.name, [])
        exact = next((h for h in candidates if not _differences(h, d)), None)
        if exact is not None:
            candidates.remove(exact)
        else:
            unmatched[d.name].append(d)
    mismatched, extra, duplicated = [], [], []
    for name, got in unmatched.items():
        for d in got:
            if pending.get(name):
                mismatched += _differences(pending[name].pop(0), d)
            elif any(h.name == name for h in baseline):
                duplicated.append(name)
            else:
                extra.append(name)
    missing = [h for hs in pending.values() for h in hs]

    per_file: defaultdict[str, int] = defaultdict(int)
    for h in baseline:
        per_file[h.file] += 1
    missing_per_file: defaultdict[str, int] = defaultdict(int)
    for h in missing:
        missing_per_file[h.file] += 1
    losses = [FileLoss(file=f, missing=missing_per_file[f], tensors=per_file[f])
              for f in run.files if missing_per_file[f]]
    by_file = {s.file: s for s in shards} if shards is not None else _shards_of(baseline)
    in_order = [by_file.get(f) or Shard(file=f, size=0) for f in run.files]
    stop = observed_stop(run.order, in_order, missing_per_file) if losses else None
    if stop is not None and error is not None:
        # The loader raised (or the reader died): the stream ended there, not at an empty shard.
        stop = stop.model_copy(update={"stop_at": None})
    return AuditRun(
        order=run.order, loader=loader, files=run.files, expected=len(baseline), delivered=len(delivered),
        missing=sorted(h.name for h in missing), extra=sorted(extra), duplicated=sorted(duplicated),
        mismatched=mismatched, file_losses=losses, stop=stop, error=error, seconds=seconds,
    )


# --- running the reader ---------------------------------------------------------------------------


@dataclass
class _ReaderRun:
    hello: ReaderHello
    delivered: dict[tuple[str, str], list[Delivered]]
    ended: dict[tuple[str, str], ReaderEnd]
    begun: list[tuple[str, str]]


def _parse(text: str, stderr_tail: str, reason: str | None = None) -> _ReaderRun:
    hello = None
    delivered: dict[tuple[str, str], list[Delivered]] = defaultdict(list)
    ended: dict[tuple[str, str], ReaderEnd] = {}
    begun: list[tuple[str, str]] = []
    for raw in text.splitlines():
        try:
            line = ReaderLine.validate_json(raw)
        except ValidationError as exc:
            raise ReaderError(f"the reader wrote a line that is not part of its protocol: {raw[:200]!r}\n{exc}") from None
        if isinstance(line, ReaderFatal):
            raise ReaderError(f"the reader cannot stream: {line.error}")
        if isinstance(line, ReaderHello):
            hello = line
        elif isinstance(line, ReaderBegin):
            begun.append((line.order, line.loader))
        elif isinstance(line, Delivered):
            delivered[(line.order, line.loader)].append(line)
        elif isinstance(line, ReaderEnd):
            ended[(line.order, line.loader)] = line
    if hello is None:
        how = f": {reason}" if reason else ""
        raise ReaderError(f"the reader stopped before it could import the streamer{how}\n{stderr_tail}")
    return _ReaderRun(hello=hello, delivered=delivered, ended=ended, begun=begun)


def _exit_reason(code: int | None, timed_out: float | None) -> str:
    if timed_out is not None:
        return f"timed out after {timed_out:.0f} s"
    if code is not None and code < 0:
        return f"the reader died of signal {-code} ({signal.strsignal(-code)})"
    return f"the reader exited with code {code}"


def audit_checkpoint(
    path: str | Path,
    python: str,
    pythonpath: Sequence[str] = (),
    env: dict[str, str] | None = None,
    orders: Sequence[str] = ORDERS,
    shuffles: int = 0,
    seed: int = 0,
    loaders: Sequence[str] = LOADERS,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    workers: int | None = None,
    image_ref: str | None = None,
    pull: Literal["always", "if-missing", "never"] = "if-missing",
    overlays: Sequence[str] = (),
    run_id: str | None = None,
) -> AuditReport:
    """Streams the checkpoint in every order with every loader and compares with the files.

    ``image_ref``: run the reader in a container of that image instead of on this host (``pull``:
    its pull policy); ``python`` and ``pythonpath`` are then the image's, ``overlays`` host folders
    mounted in and put first on its PYTHONPATH (an image's overlay under the docker launcher), and
    ``run_id`` labels the container for `regbench clean` (default "audit").
    Raises NotACheckpoint, AuditError (bad arguments) or ReaderError (the reader could not run)."""
    remote = isinstance(path, str) and is_object_uri(path)
    env = dict(env or {})
    unknown = [name for name in loaders if name not in LOADERS]
    if unknown or not loaders:
        raise AuditError(f"loaders must be some of {', '.join(LOADERS)}, got {list(loaders)}")
    # The bench reads object storage under the same variables as the reader (and the server).
    files = checkpoint_files(path if remote else Path(path).resolve(), {**os.environ, **env})
    where = files.where.rstrip("/")
    report = inspect_files(files)
    if not report.shards:
        raise AuditError(f"{where}: no *.safetensors files to stream")
    runs = file_orders(report, orders, shuffles, seed)
    image = _reader_image(python, pythonpath, env, image_ref, pull, overlays)
    # An image reference is what runs the reader in a container of the image.
    plan = _ReaderPlan(runs=runs, loaders=list(loaders), where=where, backend="local" if image_ref is None else "docker",
                       local=None if remote or image_ref is None else Path(where), overlays=tuple(overlays),
                       run_id=run_id or "audit")
    streamed = _stream(image, plan, report, files, workers, timeout_s)
    results = _audit_runs(runs, loaders, streamed, report.shards)
    hello = streamed.parsed.hello
    skipped = [Skipped(loader="vllm", reason=f"vllm does not import: {hello.vllm_error}")] \
        if hello.vllm_error is not None else []
    return AuditReport(
        path=where, python=python, pythonpath=list(pythonpath), env=env, image=image_ref, overlays=list(overlays),
        streamer_version=hello.streamer_version, streamer_path=hello.streamer_path,
        torch_version=hello.torch_version, vllm_version=hello.vllm_version,
        vllm_iterator=hello.vllm_iterator, skipped=skipped,
        baseline_tensors=len(streamed.baseline), baseline_bytes=sum(h.nbytes for h in streamed.baseline),
        baseline_seconds=round(streamed.baseline_s, 3), reader_exit_code=streamed.exit_code,
        reader_seconds=round(streamed.reader_s, 3), reader_import_seconds=hello.import_seconds,
        reader_vllm_seconds=hello.vllm_seconds, runs=results,
        checkpoint_problems=report.problems, problems=[r.line() for r in results if r.problem],
    )


def _reader_image(python: str, pythonpath: Sequence[str], env: dict[str, str], image_ref: str | None,
                  pull: Literal["always", "if-missing", "never"], overlays: Sequence[str]) -> Image:
    """Where the reader runs, as an image of the matrix: this host's Python, or a container's."""
    if overlays and image_ref is None:
        raise AuditError("overlays are mounted into a container: they need an image")
    try:
        return Image(name="audit", ref=image_ref, pull=pull, python=python, pythonpath=list(pythonpath), env=env)
    except ValidationError as exc:
        raise AuditError(f"invalid reader settings: {exc.errors(include_url=False)[0]['msg']}") from None


@dataclass
class _ReaderPlan:
    """What the reader is asked to stream, and where the checkpoint is for it."""

    runs: list[FileOrder]
    loaders: list[str]
    where: str  # the checkpoint as the reader names its files: a folder or an object store URI
    backend: str  # the reader back-end (bench.weights.readers): "local" or "docker"
    local: Path | None  # a host folder to mount into the reader's container; None: no container, or remote
    overlays: tuple[str, ...]
    run_id: str


@dataclass
class _Streamed:
    """One reader run and the baseline hashed while it ran."""

    baseline: list[TensorHash]
    baseline_s: float
    reader_s: float
    exit_code: int | None  # None: it timed out
    reason: str  # how the reader ended, for runs it did not finish
    parsed: _ReaderRun


def _stream(image: Image, plan: _ReaderPlan, report: CheckpointReport, files: Files, workers: int | None,
            timeout_s: float) -> _Streamed:
    """Runs the reader over every order and loader; the baseline is hashed from the files meanwhile."""
    with tempfile.TemporaryDirectory(prefix="regbench-audit-") as scratch_dir:
        scratch = Path(scratch_dir)
        plan_file = scratch / "plan.json"
        plan_file.write_text(json.dumps({
            "runs": [{"order": r.order, "files": [f"{plan.where}/{f}" for f in r.files]} for r in plan.runs],
            "loaders": plan.loaders,
        }))
        local = plan.local
        spec = ReaderSpec(image=image, plan=plan_file, scratch=scratch, checkpoint=local,
                          files=() if local is None else tuple(local / shard.file for shard in report.shards),
                          overlays=plan.overlays, run_id=plan.run_id)
        reader = readers.start(plan.backend, spec)
        with reader as running:
            # The reader spends its first seconds importing torch: hash the baseline meanwhile.
            started = time.monotonic()
            try:
                baseline = hash_tensors(plan.where, report.shards, workers, files)
            except OSError as exc:
                raise AuditError(f"cannot read the checkpoint: {exc}") from None
            baseline_s = time.monotonic() - started
            code = running.wait(timeout_s)
            timed_out = timeout_s if code is None else None
            reader_s = time.monotonic() - started
            stdout, stderr_tail = running.output()
        reason = _exit_reason(code, timed_out)
        parsed = _parse(stdout, stderr_tail, reason)
    return _Streamed(baseline=baseline, baseline_s=baseline_s, reader_s=reader_s,
                     exit_code=None if timed_out else code, reason=reason, parsed=parsed)


def _audit_runs(runs: Sequence[FileOrder], loaders: Sequence[str], streamed: _Streamed,
                shards: Sequence[Shard]) -> list[AuditRun]:
    """Each order and loader the reader was asked for, compared with the baseline; a run the reader
    did not finish says how it ended, one it cannot drive says so."""
    parsed, baseline, reason = streamed.parsed, streamed.baseline, streamed.reason
    results = []
    for run in runs:
        for loader in loaders:
            key = (run.order, loader)
            if loader == "vllm" and parsed.hello.vllm_error is not None:
                continue
            end = parsed.ended.get(key)
            if end is not None and end.unsupported is not None:
                results.append(AuditRun(order=run.order, loader=loader, files=run.files, expected=len(baseline),
                                         delivered=0, seconds=end.seconds, unsupported=end.unsupported))
                continue
            if end is not None:
                error, seconds = end.error, end.seconds
            elif key in parsed.begun:
                error, seconds = f"{reason} while streaming", None
            else:
                error, seconds = f"not run: {reason} before this run", None
            results.append(compare(run, loader, baseline, parsed.delivered.get(key, []), error, seconds, shards))
    if not results:
        raise ReaderError(f"nothing was audited: vLLM does not import ({parsed.hello.vllm_error})")
    return results
