"""Pre-flight: cheap checks of the weights before the expensive cells.

An end-to-end cell costs minutes per repeat and only says *that* outputs are wrong; reading the
checkpoint's headers and streaming its tensors through the environment's loader takes seconds
and says *why*. `inspect` runs once per model it can read (a local folder, a resolved hub
snapshot, an s3:// prefix); `audit` once per (model, image, load format) that streams with
runai_streamer, in the orders that matter for #157: sorted and listing order (what vLLM's
unsorted glob hands the streamer; an object store lists keys sorted). A lossy audit makes its cells
fail with `weights_lost` even if no request is ever sent.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from bench.core.config import Config
from bench.core.location import is_object_uri
from bench.core.matrix import Cell
from bench.core.records import PreflightRecord
from bench.serve.launch import loader_env, server_env
from bench.serve.protocols import AuditSite
from bench.weights import readers
from bench.weights.audit import audit_checkpoint
from bench.weights.checkpoint import NotACheckpoint, inspect_checkpoint
from bench.weights.errors import AuditError, ReaderError

STREAMING_FORMATS = {"runai_streamer", "runai_streamer_sharded"}
AUDIT_ORDERS = ("sorted", "listing")


def readable(path: str) -> bool:
    """Whether the pre-flight can read the model before any server: a local folder (a resolved
    hub snapshot included) or an object-store URI."""
    return os.path.isdir(path) or is_object_uri(path)


def audit_env(config: Config, cell: Cell) -> dict[str, str]:
    """What the audit streams under: the variables the cell's servers get (an object store's
    endpoint and credentials among them) and those vLLM's loader sets from the load format's
    `model_loader_extra_config`, so the audit streams as the server will."""
    return {**server_env(cell, cell.server, cell.profile), **loader_env(cell.load_format)}


def _inspections(config: Config, cells: list[Cell], status: Callable[[str], None]) -> list[PreflightRecord]:
    """`inspect` once per model it can read: the checkpoint's problems, and its #157 risks as
    notes, with the empty shards that end the stream."""
    out: list[PreflightRecord] = []
    for cell in {c.model.name: c for c in cells}.values():
        model = cell.model
        if not readable(model.path):
            continue  # a hub id not resolved into the cache: nothing to read before vLLM fetches it
        status(f"pre-flight: inspect {model.name}")
        try:
            report = inspect_checkpoint(model.path, {**os.environ, **audit_env(config, cell)})
        except NotACheckpoint as exc:
            # No safetensors to read: no empty shard stops a stream either.
            out.append(PreflightRecord(kind="inspect", model=model.name, ok=False, problems=[str(exc)],
                                       stream_stop_shards=[]))
            continue
        # A #157 risk is a property of the files, not a failure: the audit says if it bites.
        risks = [f"{p.kind}: {p.message}" for p in report.problems if p.kind == "stream_stop_risk"]
        problems = [f"{p.kind}: {p.message}" for p in report.problems if p.kind != "stream_stop_risk"]
        stops = list(dict.fromkeys(f for s in report.stream_stops if s.risk for f in s.ended_by))
        out.append(PreflightRecord(kind="inspect", model=model.name, ok=not problems, problems=problems, notes=risks,
                                   stream_stop_shards=stops))
    return out


def preflight(
    config: Config, cells: list[Cell], status: Callable[[str], None] = lambda s: None,
    audit_in: AuditSite = "local", run_id: str | None = None,
) -> list[PreflightRecord]:
    """`audit_in` (the launcher's, bench.serve.protocols.Launcher.audit_in): the reader back-end
    (bench.weights.readers): "local", the image's Python and overlay on this host; "docker", a
    container of the image (`ref`) with the overlay mounted as the docker launcher mounts it,
    labelled with `run_id`."""
    needed = readers.needs(audit_in)
    out = _inspections(config, cells, status)
    seen = set()
    for cell in cells:
        key = (cell.model.name, cell.image.name, cell.load_format.name)
        if cell.load_format.vllm_format not in STREAMING_FORMATS or key in seen or not readable(cell.model.path):
            continue
        seen.add(key)
        base = PreflightRecord(kind="audit", model=key[0], image=key[1], load_format=key[2], ok=True)
        missing = [f for f in needed if getattr(cell.image, f) is None]
        if missing:
            out.append(base.model_copy(update={"skipped": True, "notes": [f"the image has no `{missing[0]}` to run"]}))
            continue
        # The back-end that runs an image by its reference runs it in a container.
        boxed = "ref" in needed
        status(f"pre-flight: audit {cell.model.name} with {cell.image.name}")
        env = audit_env(config, cell)
        try:
            # In a container: the image's own Python, its overlay (folders of this host) mounted in.
            audit = audit_checkpoint(
                cell.model.path, cell.image.python, () if boxed else cell.image.pythonpath, env,
                orders=AUDIT_ORDERS, loaders=("streamer",), timeout_s=600,
                image_ref=cell.image.ref if boxed else None, pull=cell.image.pull,
                overlays=cell.image.pythonpath if boxed else (), run_id=run_id,
            )
        except (AuditError, ReaderError, NotACheckpoint) as exc:
            out.append(base.model_copy(update={"skipped": True, "notes": [str(exc)]}))
            continue
        if audit.unsupported and not audit.problems:
            out.append(base.model_copy(update={"skipped": True, "notes": [
                f"the reader cannot drive runai-model-streamer {audit.streamer_version}: " + "; ".join(audit.unsupported)]}))
            continue
        out.append(base.model_copy(update={
            "ok": not audit.problems, "lost": audit.lost, "problems": list(audit.problems),
            "notes": [f"runai-model-streamer {audit.streamer_version}: " + "; ".join(r.line() for r in audit.runs)],
        }))
    return out
