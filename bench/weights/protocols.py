"""What a reader back-end is to the weight audit (bench.weights.audit): where the reader
(``reader.py``, the script that streams a checkpoint through the real loaders) runs, a process of
this host (bench.weights.audit_local) or a container of the image (bench.weights.audit_docker),
and the one interface both give it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bench.core.config import Image

READER = Path(__file__).resolve().parent / "reader.py"  # the script every back-end runs
TAIL_LINES = 15  # of the reader's stderr, kept for the error that says why it stopped


@dataclass(frozen=True)
class ReaderSpec:
    """What a back-end is asked to run: the reader with `plan` under `image`'s Python and
    variables; `scratch` a folder of this host for the reader's run. For a container: `checkpoint`
    the local folder to mount (None: object storage), `files` its shard files, `overlays` host
    folders mounted in first on PYTHONPATH, `run_id` its label for `regbench clean`."""

    image: Image
    plan: Path
    scratch: Path
    checkpoint: Path | None = None
    files: tuple[Path, ...] = ()
    overlays: tuple[str, ...] = ()
    run_id: str = "audit"


class Reader(Protocol):
    """A started reader (the context manager's value): leaving the context ends it, whatever happened."""

    def wait(self, timeout_s: float) -> int | None:
        """Its exit code (negative: the signal that killed it), or None: it timed out and was killed."""
        ...

    def output(self) -> tuple[str, str]:
        """After wait: its stdout (the JSON lines) and the tail of its stderr, kept apart."""
        ...
