"""Merge: the results folders of the slices of one run, put back into one folder.

Slices are only merged when they are slices of the same thing: the same run id and the same
matrix as run. A (cell, repeat) present in two slices is an error, not an overwrite. The reports
are derived again from the merged JSONL, so divergence against a baseline cell that ran in
another slice is judged too.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from bench.core.records import RunRecord
from bench.store.results import ResultsDir, ResultsError

T = TypeVar("T", bound=BaseModel)


def merge(sources: list[Path], out: Path) -> ResultsDir:
    if not sources:
        raise ResultsError("merge needs at least one results folder")
    slices = [ResultsDir(p) for p in sources]
    for s in slices:
        if not (s.path / "config.yaml").is_file():
            raise ResultsError(f"{s.path}: not a regbench results directory (no config.yaml)")
    run_ids = {s.path.name for s in slices}
    if len(run_ids) != 1:
        raise ResultsError(f"the folders are of different runs {sorted(run_ids)}: slices share one --run-id")
    # Compared as parsed, so that a key one regbench version writes out with its default and an
    # older one left out does not make the same matrix look different.
    configs = {s.path: s.config() for s in slices}
    first = next(iter(configs.values()))
    for path, config in configs.items():
        if config != first:
            raise ResultsError(f"{path}: ran a different matrix than {slices[0].path}")

    runs: list[RunRecord] = []
    seen: dict[tuple[str, int], Path] = {}
    for s in slices:
        for r in s.runs():
            key = (r.cell_id, r.repeat)
            if key in seen:
                raise ResultsError(f"{r.cell_id} #{r.repeat} is in both {seen[key]} and {s.path}")
            seen[key] = s.path
            runs.append(r)

    target = out / run_ids.pop()
    if target.exists():
        raise ResultsError(f"{target} exists already")
    target.mkdir(parents=True)
    merged = ResultsDir(target)
    shutil.copyfile(slices[0].path / "config.yaml", target / "config.yaml")
    for s in slices:
        if (s.path / "cells").is_dir():
            shutil.copytree(s.path / "cells", target / "cells", dirs_exist_ok=True)
    for r in runs:
        merged.add_run(r)
    for s in slices:
        for q in s.requests():
            if (q.cell_id, q.repeat) in seen and seen[(q.cell_id, q.repeat)] == s.path:
                merged.add_request(q)
    # Slices on one platform fingerprint the same images: keep each distinct record once.
    for f in _distinct([f for s in slices for f in s.fingerprints()]):
        merged.add_fingerprint(f)
    for p in _distinct([p for s in slices for p in s.preflights()]):
        merged.add_preflight(p)
    # The run planned what its slices planned; it ended when the last slice did.
    plans = [s.plan(first, s.runs()) for s in slices]
    ends = [p.finished_at for p in plans]
    merged.write_plan(plans[0].model_copy(update={
        "cells": list(dict.fromkeys(c for p in plans for c in p.cells)),
        "started_at": min(p.started_at for p in plans),
        "finished_at": None if None in ends else max(e for e in ends if e is not None),
        "interrupted": any(p.interrupted for p in plans),
    }))
    return merged


def _distinct(records: list[T]) -> list[T]:
    seen: dict[str, T] = {}
    for record in records:
        seen.setdefault(record.model_dump_json(), record)
    return list(seen.values())
