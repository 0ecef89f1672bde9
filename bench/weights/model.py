"""What `regbench inspect` and `regbench audit` say about a checkpoint: their report records.

Pure pydantic models, no I/O: bench.weights reads the headers and streams the tensors to fill
them, bench.weights.render draws them, and bench.versions reads audit reports back from a map's
folders. The JSON of both commands is these models' dump.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field

from bench.core.records import Record

# --- inspect: what the headers say ----------------------------------------------------------------


class TensorInfo(Record):
    name: str
    dtype: str
    shape: list[int]
    start: int  # absolute offsets in the file, header included
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


class Shard(Record):
    file: str  # relative to the checkpoint directory
    size: int  # bytes on disk
    tensors: list[TensorInfo] = []
    metadata: dict[str, str] = {}
    error: str | None = None  # the header could not be used; tensors is then empty
    in_index: bool | None = None  # None: the checkpoint has no index

    @property
    def empty(self) -> bool:
        return self.error is None and not self.tensors

    @property
    def data_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def dtypes(self) -> list[str]:
        return sorted({t.dtype for t in self.tensors})


class IndexInfo(Record):
    file: str
    files: list[str] = []  # distinct shard files its weight_map names
    tensors: int = 0
    total_size: int | None = None
    error: str | None = None


class DtypeCount(Record):
    dtype: str
    tensors: int
    bytes: int


class ScaleCount(Record):
    suffix: str
    tensors: int
    dtypes: list[str]
    examples: list[str]


class QuantConfig(Record):
    source: str  # "hf_quant_config.json" or "config.json:quantization_config"
    method: str | None
    settings: dict[str, Any]


ProblemKind = Literal[
    "unreadable_shard", "unreadable_index", "unreadable_config", "index_file_missing",
    "shard_not_in_index", "tensor_missing", "tensor_in_wrong_shard", "tensor_not_in_index",
    "duplicate_tensor", "stream_stop_risk",
]


class Problem(Record):
    kind: ProblemKind
    message: str
    files: list[str] = []
    tensors: list[str] = []


class StreamStop(Record):
    """Where a stream of the files stops early, for one order of them: predicted from the headers
    by ``bench.weights.checkpoint.stream_stop`` (runai-model-streamer #157, the releases that lose
    tensors silently), or seen by the audit (``observed_stop`` there). ``describe`` is the one
    wording both `inspect` and `audit` print."""

    order: str  # "sorted", "listing"; the audit's orders also "reversed", "shuffleN"
    files: list[str]  # every shard, in the order streamed
    stop_at: int | None  # index into files of the empty shard that ends the stream (#157)
    lost_files: list[str]  # the shards with tensors that the stream never reaches, in order
    lost_tensors: int
    tensors: int

    @property
    def risk(self) -> bool:
        return self.lost_tensors > 0

    @property
    def ended_by(self) -> list[str]:
        """The empty shard(s) that end the stream: the first file when it is empty, else the two
        empty shards in a row whose second begins a request that holds nothing."""
        if self.stop_at is None:
            return []
        return self.files[max(self.stop_at - 1, 0):self.stop_at + 1]

    def describe(self) -> str:
        """Where the stream stops and which shards' tensors never arrive; "" when nothing is lost.
        Shards are named by stem: every one of them ends in .safetensors."""
        if not self.risk:
            return ""
        first = _stem(self.lost_files[0])
        if self.stop_at == 0:
            where = f"stream stops at empty shard {_stem(self.files[0])} (first)"
        elif self.stop_at is not None:
            before, at = map(_stem, self.ended_by)
            where = f"stream stops at empty shards {before}, {at} (two in a row)"
        else:
            where = f"stream stops before {first}"
        n = len(self.lost_files)
        shards = f"shard {first}" if n == 1 else f"{n} shards from {first} on"
        return f"{where}; lost {self.lost_tensors}/{self.tensors} tensors: {shards}"


def _stem(file: str) -> str:
    return file.removesuffix(".safetensors")


class CheckpointReport(Record):
    path: str
    shards: list[Shard]  # sorted by file name
    listing_order: list[str]  # what vLLM's unsorted glob sees
    index: IndexInfo | None
    dtypes: list[DtypeCount]
    scales: list[ScaleCount]
    quantization: list[QuantConfig]
    stream_stops: list[StreamStop]
    notes: list[str]
    problems: list[Problem]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def tensor_count(self) -> int:
        return sum(len(s.tensors) for s in self.shards)

    @property
    def data_bytes(self) -> int:
        return sum(s.data_bytes for s in self.shards)

    @property
    def empty_shards(self) -> list[str]:
        return [s.file for s in self.shards if s.empty]


# --- audit: what the loader delivered -------------------------------------------------------------


class Mismatch(Record):
    name: str
    field: Literal["bytes", "dtype", "shape"]
    expected: str
    got: str


class FileLoss(Record):
    file: str
    missing: int
    tensors: int


class AuditRun(Record):
    """One loader streaming one order of the files, compared tensor by tensor with the baseline."""

    order: str
    loader: str
    files: list[str]
    expected: int
    delivered: int
    missing: list[str] = []
    extra: list[str] = []
    duplicated: list[str] = []
    mismatched: list[Mismatch] = []
    file_losses: list[FileLoss] = []
    # The stream stopped: no shard with tensors after the last one that delivered got through.
    # Described with the same StreamStop as `inspect`'s prediction.
    stop: StreamStop | None = None
    error: str | None = None  # the loader raised, timed out, or the reader died during this run
    seconds: float | None = None
    # The reader has no way to call this release of the loader: the run says nothing about the
    # weights, so it has no missing tensors and is neither ok nor a problem.
    unsupported: str | None = None

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.duplicated or self.mismatched or self.error
                    or self.unsupported)

    @property
    def problem(self) -> bool:
        """Lost, altered or raised: a finding about the loader (an unsupported run is none)."""
        return not self.ok and not self.unsupported

    def line(self, with_stop: bool = True) -> str:
        """One line per run; ``with_stop=False`` leaves out the stop's description (``stop.describe()``,
        the same words as `inspect`'s) for a view that prints it on a line of its own."""
        if self.unsupported:
            return (f"order={self.order} loader={self.loader}: not audited, the reader cannot drive this "
                    f"loader version: {self.unsupported}")
        text = f"order={self.order} loader={self.loader}: {self.delivered}/{self.expected} tensors delivered"
        stopped = set(self.stop.lost_files) if self.stop is not None else set()
        if self.stop is not None and with_stop:
            text += f"; {self.stop.describe()}"
        scattered = [f for f in self.file_losses if f.file not in stopped]
        if scattered:
            text += (", also" if stopped else ",") + " missing in " + ", ".join(
                f"{Path(f.file).stem} ({f.missing}/{f.tensors})" for f in scattered
            )
        if self.extra:
            text += f", {len(self.extra)} unknown"
        if self.duplicated:
            text += f", {len(self.duplicated)} duplicated"
        if self.mismatched:
            text += f", {len({m.name for m in self.mismatched})} differ from the files"
        if self.error:
            text += f"; {self.error}"
        return text


class Skipped(Record):
    loader: str
    reason: str


def _was_probe(figure: str) -> AliasChoices:
    """An AuditReport field named reader_<figure>, read under its old name probe_<figure> too."""
    return AliasChoices(f"reader_{figure}", f"probe_{figure}")


class AuditReport(Record):
    path: str
    python: str
    pythonpath: list[str]
    env: dict[str, str]
    image: str | None = None  # the image whose container ran the reader; None: this host
    overlays: list[str] = []  # host folders mounted into that container, first on its PYTHONPATH
    streamer_version: str
    streamer_path: str
    torch_version: str
    vllm_version: str | None
    vllm_iterator: str | None = None  # how the reader loaded vLLM's runai_safetensors_weights_iterator
    skipped: list[Skipped]
    baseline_tensors: int
    baseline_bytes: int
    baseline_seconds: float
    # The reader process (bench.weights.reader): a report written before it had that name says probe_*.
    reader_exit_code: int | None = Field(validation_alias=_was_probe("exit_code"))  # None: killed on timeout
    reader_seconds: float | None = Field(None, validation_alias=_was_probe("seconds"))  # start to exit
    reader_import_seconds: float | None = Field(None, validation_alias=_was_probe("import_seconds"))  # of which torch+streamer
    reader_vllm_seconds: float | None = Field(None, validation_alias=_was_probe("vllm_seconds"))  # and vLLM's iterator
    runs: list[AuditRun]
    checkpoint_problems: list[Problem]  # from inspect, for context: the verdict is about the runs
    problems: list[str]  # one line per run that lost, duplicated, altered or raised

    @property
    def ok(self) -> bool:
        """Every run audited and none lost, altered or raised."""
        return not self.problems and not self.unsupported

    @property
    def unsupported(self) -> list[str]:
        """Why runs could not be audited with this loader release (see AuditRun.unsupported)."""
        return sorted({r.unsupported for r in self.runs if r.unsupported})

    @property
    def lost(self) -> int:
        """Tensors missing, summed over every run."""
        return sum(len(r.missing) for r in self.runs)
