"""Checkpoint inspector: what a safetensors checkpoint holds, read from its headers alone.

Why this exists: vLLM's loaders disagree about which files make up a checkpoint. The default
loader trusts model.safetensors.index.json; the runai_streamer loader streams every
``*.safetensors`` of the directory in listing order (an unsorted glob). A checkpoint whose index
and files disagree, or whose empty shards sit where runai-model-streamer stops streaming in the
releases its #157 affects (measured ranges: bench/signatures/runai-empty-shard-stream-stop.yaml),
therefore loads differently depending on the load format, and the difference can be silent.
The inspector finds those layouts before a server is ever booted.

Only headers are read (8 bytes of length, then JSON): no torch, no weights in memory, so it runs
in the bench's own venv. The one place that reads tensor bytes is ``hash_tensors``, the baseline
of the weight audit, which hashes every tensor's raw bytes in parallel (hashlib releases the GIL,
so threads use every core).

``shard_header`` writes the same format by hand, for the benchmark and the tests' checkpoints.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
import os
import struct
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from bench.core.diagnosis import stream_stop_releases
from bench.core.errors import RegbenchError
from bench.core.location import is_object_uri
from bench.core.records import Record
from bench.weights.model import (
    CheckpointReport,
    DtypeCount,
    IndexInfo,
    Problem,
    QuantConfig,
    ScaleCount,
    Shard,
    StreamStop,
    TensorInfo,
)

INDEX_NAME = "model.safetensors.index.json"
HF_QUANT_CONFIG = "hf_quant_config.json"
PATTERN = "*.safetensors"
# The limit safetensors itself and runai-model-streamer apply; a larger length is a corrupt file.
MAX_HEADER = 100 * 1024 * 1024
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
# Longest first: "weight_scale_2" must not be counted as "weight_scale"-something-else.
SCALE_SUFFIXES = (
    "weight_scale_inv", "weight_scale_2", "weight_scale", "weight_global_scale",
    "input_global_scale", "input_scale", "k_scale", "v_scale",
)
SHOWN = 10  # names per problem in the human output; the JSON has all of them


class NotACheckpoint(RegbenchError, ValueError):
    """The path is not a directory holding safetensors shards or an index."""


class TensorHash(Record):
    file: str
    name: str
    dtype: str
    shape: list[int]
    nbytes: int
    sha256: str


# --- headers -------------------------------------------------------------------------------------


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError(f"duplicate keys in the header: {sorted({k for k in keys if keys.count(k) > 1})}")
    return dict(pairs)


def _expected_bytes(dtype: str, shape: list[int]) -> int | None:
    bits = DTYPE_BITS.get(dtype)
    return None if bits is None else (math.prod(shape) * bits + 7) // 8


def _parse_header(raw: bytes, data_start: int, data_size: int) -> tuple[list[TensorInfo], dict[str, str]]:
    """The tensors of a header, checked the way the safetensors library checks them: known entry
    shape, sizes that match dtype and shape, offsets that tile the data area without gaps."""
    header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError("__metadata__ must map strings to strings")
    tensors = []
    for name, entry in header.items():
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise ValueError(f"{name}: an entry needs exactly dtype, shape and data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str):
            raise ValueError(f"{name}: dtype is not a string")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError(f"{name}: shape is not a list of non-negative integers")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) for o in offsets) or not 0 <= offsets[0] <= offsets[1]):
            raise ValueError(f"{name}: data_offsets is not [begin, end] with 0 <= begin <= end")
        expected = _expected_bytes(dtype, shape)
        if expected is not None and expected != offsets[1] - offsets[0]:
            raise ValueError(f"{name}: {dtype}{shape} is {expected} bytes, data_offsets span {offsets[1] - offsets[0]}")
        tensors.append(TensorInfo(name=name, dtype=dtype, shape=shape,
                                  start=data_start + offsets[0], end=data_start + offsets[1]))
    position = data_start
    for t in sorted(tensors, key=lambda t: (t.start, t.end)):
        if t.start != position:
            what = "overlaps the previous tensor" if t.start < position else "leaves a gap before it"
            raise ValueError(f"{t.name}: data_offsets {what}")
        position = t.end
    if position != data_start + data_size:
        raise ValueError(f"the tensors cover {position - data_start} bytes of a {data_size}-byte data area")
    return tensors, metadata


class Files(Protocol):
    """A checkpoint's files wherever they are: a local folder (LocalFiles) or an object-store
    prefix (bench.weights.objstore.ObjectFiles). Reads raise OSError."""

    where: str  # for messages: the folder or the URI

    def listing(self) -> list[str]:
        """The *.safetensors names in the order vLLM's runai_streamer loader lists them."""
        ...

    def size(self, name: str) -> int: ...

    def read(self, name: str, start: int, length: int) -> bytes: ...

    def text(self, name: str) -> str | None:
        """A small file's whole text; None when there is no such file."""
        ...


class LocalFiles:
    def __init__(self, path: Path):
        self.path = path
        self.where = str(path)

    def listing(self) -> list[str]:
        return listing_order(self.path)

    def size(self, name: str) -> int:
        return (self.path / name).stat().st_size

    def read(self, name: str, start: int, length: int) -> bytes:
        with (self.path / name).open("rb") as f:
            f.seek(start)
            return f.read(length)

    def text(self, name: str) -> str | None:
        file = self.path / name
        return file.read_text(encoding="utf-8") if file.exists() else None


def read_shard(files: Files, file: str) -> Shard:
    """One shard's header, from two reads (its 8-byte length, then the JSON). A header that
    cannot be used is a Shard with an error, not a raise: a broken shard is a finding about the
    checkpoint."""
    try:
        size = files.size(file)
    except OSError as exc:
        return Shard(file=file, size=0, error=str(exc))
    try:
        prefix = files.read(file, 0, 8)
        if len(prefix) < 8:
            raise ValueError(f"{size} bytes: too short for a safetensors file")
        (length,) = struct.unpack("<Q", prefix)
        if length > MAX_HEADER or 8 + length > size:
            raise ValueError(f"header length {length} does not fit a {size}-byte file")
        raw = files.read(file, 8, length)
        tensors, metadata = _parse_header(raw, 8 + length, size - 8 - length)
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return Shard(file=file, size=size, error=str(exc))
    return Shard(file=file, size=size, tensors=tensors, metadata=metadata)


def listing_order(path: Path) -> list[str]:
    """The shards in directory-listing order: what glob.glob(dir/*.safetensors) returns (glob
    walks os.scandir, the same readdir order as os.listdir, and skips hidden names)."""
    return [n for n in os.listdir(path) if fnmatch.fnmatch(n, PATTERN) and not n.startswith(".")]


# --- the #157 trigger ----------------------------------------------------------------------------


def _stop_index(shards: Sequence[Shard]) -> int | None:
    request_begins = True
    for i, shard in enumerate(shards):
        streams_nothing = shard.data_bytes == 0 and shard.error is None
        if streams_nothing and request_begins:
            return i
        request_begins = streams_nothing
    return None


def stream_stop(order: str, shards: Sequence[Shard]) -> StreamStop:
    """Replays FilesRequestsIterator.next_request of the runai-model-streamer releases that lose
    tensors silently (#157; ``stream_stop_releases``) on the shards in the given order. A file
    that streams no bytes ends the request it is in and is consumed; a request that *begins* at
    such a file is returned as None, which the streamer takes for the end of the stream. Requests
    begin at the first file, after every empty file, and within a file when the memory limit
    splits it, so the trigger is an empty first file or two in a row whatever the limit is.
    Everything from the trigger on is lost, silently."""
    stop_at = _stop_index(shards)
    lost = [] if stop_at is None else [s for s in shards[stop_at:] if s.tensors]
    return StreamStop(
        order=order, files=[s.file for s in shards], stop_at=stop_at,
        lost_files=[s.file for s in lost], lost_tensors=sum(len(s.tensors) for s in lost),
        tensors=sum(len(s.tensors) for s in shards),
    )


def observed_stop(order: str, shards: Sequence[Shard], missing: Mapping[str, int]) -> StreamStop | None:
    """The stop a stream shows: ``shards`` in the order streamed, ``missing`` the tensors that did
    not arrive per file. A stop is a tail: every shard with tensors after the last one that
    delivered anything delivered nothing. Its place is the one ``stream_stop`` predicts when the
    loss is exactly the predicted one (so `inspect` and `audit` name the same empty shards), else
    just "before the first shard lost". None: nothing lost, or not as a tail."""
    delivering = [i for i, s in enumerate(shards) if s.tensors and missing.get(s.file, 0) < len(s.tensors)]
    tail = shards[(delivering[-1] + 1 if delivering else 0):]
    lost = [s for s in tail if s.tensors]
    if not lost or any(missing.get(s.file, 0) != len(s.tensors) for s in lost):
        return None
    predicted = stream_stop(order, shards)
    if predicted.lost_files == [s.file for s in lost]:
        return predicted
    return StreamStop(
        order=order, files=[s.file for s in shards], stop_at=None, lost_files=[s.file for s in lost],
        lost_tensors=sum(len(s.tensors) for s in lost), tensors=sum(len(s.tensors) for s in shards),
    )


# --- inspect -------------------------------------------------------------------------------------


def _index(files: Files) -> tuple[IndexInfo | None, dict[str, str]]:
    try:
        text = files.text(INDEX_NAME)
    except OSError as exc:
        return IndexInfo(file=INDEX_NAME, error=f"{type(exc).__name__}: {exc}"), {}
    if text is None:
        return None, {}
    try:
        data = json.loads(text)
        weight_map = data["weight_map"] if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ValueError("no weight_map mapping tensor names to file names")
    except (OSError, ValueError, KeyError) as exc:
        return IndexInfo(file=INDEX_NAME, error=f"{type(exc).__name__}: {exc}"), {}
    total = data.get("metadata", {}).get("total_size") if isinstance(data.get("metadata"), dict) else None
    return IndexInfo(file=INDEX_NAME, files=sorted(set(weight_map.values())), tensors=len(weight_map),
                     total_size=total if isinstance(total, int) else None), weight_map


def _json_object(files: Files, name: str) -> dict | None:
    """A small JSON file's object; None when the file is not there. Raises ValueError (bad JSON,
    not an object) or OSError."""
    text = files.text(name)
    if text is None:
        return None
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def _quantization(files: Files) -> tuple[list[QuantConfig], list[Problem]]:
    found, problems = [], []
    try:
        hf = _json_object(files, HF_QUANT_CONFIG)
        quant = hf.get("quantization", hf) if hf is not None else None
        if hf is not None and not isinstance(quant, dict):
            raise ValueError("not a JSON object")
        if isinstance(quant, dict):
            found.append(QuantConfig(source=HF_QUANT_CONFIG, method=quant.get("quant_algo"), settings=quant))
    except (OSError, ValueError) as exc:
        problems.append(Problem(kind="unreadable_config", message=f"{HF_QUANT_CONFIG}: {exc}", files=[HF_QUANT_CONFIG]))
    try:
        config = _json_object(files, "config.json")
    except (OSError, ValueError) as exc:
        problems.append(Problem(kind="unreadable_config", message=f"config.json: {exc}", files=["config.json"]))
    else:
        quant = config.get("quantization_config") if config is not None else None
        if isinstance(quant, dict):
            found.append(QuantConfig(source="config.json:quantization_config",
                                     method=quant.get("quant_method"), settings=quant))
    return found, problems


def _census(shards: Sequence[Shard]) -> tuple[list[DtypeCount], list[ScaleCount]]:
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    scales: dict[str, list[TensorInfo]] = defaultdict(list)
    for t in (t for s in shards for t in s.tensors):
        counts[t.dtype] += 1
        sizes[t.dtype] += t.nbytes
        leaf = t.name.rsplit(".", 1)[-1]
        if leaf in SCALE_SUFFIXES:
            scales[leaf].append(t)
    dtypes = [DtypeCount(dtype=d, tensors=counts[d], bytes=sizes[d]) for d in sorted(counts)]
    scale_counts = [
        ScaleCount(suffix=s, tensors=len(scales[s]), dtypes=sorted({t.dtype for t in scales[s]}),
                   examples=sorted(t.name for t in scales[s])[:3])
        for s in SCALE_SUFFIXES if scales[s]
    ]
    return dtypes, scale_counts


def _names(names: Iterable[str]) -> str:
    names = list(names)
    shown = ", ".join(names[:SHOWN])
    return shown + (f" … and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def _index_problems(shards: Sequence[Shard], index: IndexInfo | None, weight_map: dict[str, str]) -> list[Problem]:
    problems = []
    where: dict[str, list[str]] = defaultdict(list)
    for s in shards:
        for t in s.tensors:
            where[t.name].append(s.file)
    dupes = sorted(n for n, files in where.items() if len(files) > 1)
    if dupes:
        files = sorted({f for n in dupes for f in where[n]})
        problems.append(Problem(
            kind="duplicate_tensor", files=files, tensors=dupes,
            message=f"{len(dupes)} tensor name(s) in more than one shard ({_names(files)}): {_names(dupes)}",
        ))
    if index is None:
        return problems
    if index.error is not None:
        problems.append(Problem(kind="unreadable_index", files=[index.file], message=f"{index.file}: {index.error}"))
        return problems
    on_disk = {s.file for s in shards}
    missing_files = [f for f in index.files if f not in on_disk]
    if missing_files:
        lost = sorted(n for n, f in weight_map.items() if f in missing_files and n not in where)
        problems.append(Problem(
            kind="index_file_missing", files=missing_files, tensors=lost,
            message=f"the index names {len(missing_files)} file(s) that do not exist: {_names(missing_files)}",
        ))
    # An empty shard can never appear in a weight_map, and no loader reads anything from it:
    # only a shard with tensors that the index ignores makes the loaders disagree.
    unindexed = [s.file for s in shards if s.tensors and s.file not in index.files]
    if unindexed:
        problems.append(Problem(
            kind="shard_not_in_index", files=unindexed,
            message=f"{len(unindexed)} shard(s) with tensors that the index does not name "
                    f"(the runai_streamer loader reads them, the default loader does not): {_names(unindexed)}",
        ))
    absent = sorted(n for n, f in weight_map.items() if n not in where and f in on_disk)
    if absent:
        problems.append(Problem(
            kind="tensor_missing", tensors=absent, files=sorted({weight_map[n] for n in absent}),
            message=f"{len(absent)} tensor(s) in the index but in no shard: {_names(absent)}",
        ))
    misplaced = sorted(n for n, f in weight_map.items() if where.get(n) and f not in where[n])
    if misplaced:
        problems.append(Problem(
            kind="tensor_in_wrong_shard", tensors=misplaced,
            files=sorted({weight_map[n] for n in misplaced} | {f for n in misplaced for f in where[n]}),
            message=f"{len(misplaced)} tensor(s) in a different shard than the index says: {_names(misplaced)}",
        ))
    extra = sorted(n for n in where if n not in weight_map)
    if extra:
        problems.append(Problem(
            kind="tensor_not_in_index", tensors=extra, files=sorted({f for n in extra for f in where[n]}),
            message=f"{len(extra)} tensor(s) in the shards but not in the index: {_names(extra)}",
        ))
    return problems


def _stop_problem(stop: StreamStop) -> Problem:
    return Problem(
        kind="stream_stop_risk", files=stop.lost_files,
        message=f"{stop.order} order: {stop.describe()} ({stream_stop_releases()})",
    )


def checkpoint_files(path: str | Path, env: Mapping[str, str] | None = None) -> Files:
    """The files of a checkpoint folder or object-store URI (read under `env`'s variables, the
    process's own by default). Raises NotACheckpoint when there is nothing to read there."""
    if isinstance(path, str) and is_object_uri(path):
        from bench.weights.objstore import ObjectFiles, ObjectStoreError  # boto3 only for object storage

        try:
            return ObjectFiles(path, os.environ if env is None else env)
        except (ObjectStoreError, ValueError) as exc:
            raise NotACheckpoint(str(exc)) from None
    path = Path(path)
    if not path.is_dir():
        raise NotACheckpoint(f"{path}: not a directory")
    return LocalFiles(path)


def safetensors_bytes(path: str, env: Mapping[str, str] | None = None) -> int | None:
    """The size of a model's *.safetensors files, in a local folder or under an object-store
    prefix; None where there are none to see (a hub id, an unreachable bucket)."""
    try:
        files = checkpoint_files(path, env)
        return sum(files.size(f) for f in files.listing()) or None
    except (NotACheckpoint, OSError):
        return None


def inspect_checkpoint(path: str | Path, env: Mapping[str, str] | None = None) -> CheckpointReport:
    """Everything the headers say about a checkpoint folder or object-store prefix, and what is
    wrong with it. `env`: the variables object storage is read under (the process's by default)."""
    return inspect_files(checkpoint_files(path, env))


def inspect_files(files: Files) -> CheckpointReport:
    try:
        listed = files.listing()
        has_index = files.text(INDEX_NAME) is not None if not listed else True
    except OSError as exc:
        raise NotACheckpoint(f"{files.where}: cannot list: {exc}") from None
    if not listed and not has_index:
        raise NotACheckpoint(f"{files.where}: no *.safetensors files and no {INDEX_NAME}")
    index, weight_map = _index(files)
    shards = [read_shard(files, f) for f in sorted(listed)]
    if index is not None and index.error is None:
        shards = [s.model_copy(update={"in_index": s.file in index.files}) for s in shards]
    by_file = {s.file: s for s in shards}

    problems = [
        Problem(kind="unreadable_shard", files=[s.file], message=f"{s.file}: {s.error}")
        for s in shards if s.error is not None
    ]
    problems += _index_problems(shards, index, weight_map)
    quantization, config_problems = _quantization(files)
    problems += config_problems
    stops = [stream_stop("sorted", shards), stream_stop("listing", [by_file[f] for f in listed])]
    problems += [_stop_problem(s) for s in stops if s.risk]
    notes = []
    if any(s.empty for s in shards):
        notes.append(
            "runai-model-streamer 0.16.x raises `ValueError: max() arg is an empty sequence` "
            "with RUNAI_STREAMER_MEMORY_LIMIT=0 when any shard is empty"
        )
    dtypes, scales = _census(shards)
    return CheckpointReport(
        path=files.where, shards=shards, listing_order=listed, index=index, dtypes=dtypes, scales=scales,
        quantization=quantization, stream_stops=stops, notes=notes, problems=problems,
    )


# --- baseline hashing ----------------------------------------------------------------------------

CHUNK = 8 * 1024 * 1024
# Tensors of one file are grouped into units of at least this size: small enough that a few
# big shards still spread over every core, large enough that a unit is not dominated by overhead.
UNIT = 64 * 1024 * 1024


def _hash_remote_unit(files: Files, file: str, tensors: Sequence[TensorInfo]) -> list[TensorHash]:
    """A unit's tensors are contiguous in the file (the header leaves no gaps): one ranged read,
    hashed as it arrives."""
    from bench.weights.objstore import ObjectFiles

    assert isinstance(files, ObjectFiles)
    start, end = tensors[0].start, tensors[-1].end
    stream = files.chunks(file, start, end - start, CHUNK)
    pending = b""
    out = []
    for t in tensors:
        h = hashlib.sha256()
        remaining = t.nbytes
        while remaining:
            if not pending:
                pending = next(stream, b"")
                if not pending:
                    raise OSError(f"{files.where}/{file}: ends before {t.name} does")
            take = pending[:remaining]
            h.update(take)
            pending = pending[len(take):]
            remaining -= len(take)
        out.append(TensorHash(file=file, name=t.name, dtype=t.dtype, shape=t.shape, nbytes=t.nbytes, sha256=h.hexdigest()))
    return out


def _hash_unit(path: Path, file: str, tensors: Sequence[TensorInfo]) -> list[TensorHash]:
    out = []
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    # Unbuffered: every byte goes straight from the page cache into buf, once.
    with path.open("rb", buffering=0) as f:
        for t in tensors:
            h = hashlib.sha256()
            f.seek(t.start)
            remaining = t.nbytes
            while remaining:
                n = f.readinto(view[: min(CHUNK, remaining)])
                if not n:
                    raise OSError(f"{path}: ends before {t.name} does (the file shrank while being read?)")
                h.update(view[:n])
                remaining -= n
            out.append(TensorHash(file=file, name=t.name, dtype=t.dtype, shape=t.shape,
                                  nbytes=t.nbytes, sha256=h.hexdigest()))
    return out


def _units(shards: Sequence[Shard]) -> list[tuple[str, list[TensorInfo]]]:
    units = []
    for s in shards:
        group: list[TensorInfo] = []
        size = 0
        for t in sorted(s.tensors, key=lambda t: t.start):
            group.append(t)
            size += t.nbytes
            if size >= UNIT:
                units.append((s.file, group))
                group, size = [], 0
        if group:
            units.append((s.file, group))
    # Largest first, so that the last unit to finish is a small one and no core idles long.
    return sorted(units, key=lambda u: -sum(t.nbytes for t in u[1]))


def hash_tensors(path: str | Path, shards: Sequence[Shard], workers: int | None = None,
                 files: Files | None = None) -> list[TensorHash]:
    """sha256 of every tensor's raw bytes, read via the header offsets, each byte read once.
    Shards with an unusable header contribute nothing (inspect reports them)."""
    files = checkpoint_files(path) if files is None else files
    workers = workers or os.cpu_count() or 1
    units = _units(shards)

    def unit(u: tuple[str, list[TensorInfo]]) -> list[TensorHash]:
        if isinstance(files, LocalFiles):
            return _hash_unit(files.path / u[0], u[0], u[1])
        return _hash_remote_unit(files, u[0], u[1])

    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = pool.map(unit, units)
        hashes = [h for unit in results for h in unit]
    order = {(s.file, t.name): i for i, (s, t) in enumerate((s, t) for s in shards for t in s.tensors)}
    return sorted(hashes, key=lambda h: order[(h.file, h.name)])


# --- writing (the benchmark and the tests' checkpoints) ------------------------------------------


def shard_header(entries: Sequence[tuple[str, str, list[int], int]], metadata: dict[str, str] | None = None) -> bytes:
    """The 8-byte length and JSON header of a shard whose tensors (name, dtype, shape, nbytes)
    follow it back to back, padded with spaces to 8 bytes as safetensors does."""
    header: dict[str, Any] = {"__metadata__": metadata if metadata is not None else {"format": "pt"}}
    offset = 0
    for name, dtype, shape, nbytes in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw
