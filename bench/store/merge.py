"""Merge: the results folders of the slices of one run, put back into one folder.

Slices are only merged when they are slices of the same thing: the same run id and the same
matrix as run, and every slice ran the same build of each image: a tag such as a nightly's moves,
and each slice resolves its own, so two slices can hold two builds under one name, a cell and its
baseline among them; merged, their difference would read as vLLM's. A (cell, repeat) present in
two slices is an error, not an overwrite. The reports are derived again from the merged JSONL, so
divergence against a baseline cell that ran in another slice is judged too.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from bench.core.records import Fingerprint, RunRecord
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
    same_builds(slices)

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


def same_builds(slices: list[ResultsDir]) -> None:
    """Raises ResultsError naming each image that the slices' fingerprints record as two builds,
    with each slice and what it ran. Two records are one build when their pins are equal (one
    registry digest: the same multi-arch image on two platforms has two image ids) or their image
    ids are (one image that reached the hosts under two names). Records with neither (a launcher
    that pulls nothing, an image that could not be resolved) say nothing about the build."""
    by_image: dict[str, list[tuple[Path, Fingerprint]]] = {}
    for s in slices:
        for f in s.fingerprints():
            if _pin(f) or f.image_id:
                by_image.setdefault(f.image, []).append((s.path, f))
    problems = []
    for image, records in by_image.items():
        if all(_one_build(a, b) for _, a in records for _, b in records):
            continue
        ran = "; ".join(dict.fromkeys(f"{path} ran {_build(f)}" for path, f in records))
        refs = ", ".join(dict.fromkeys(f.image_ref for _, f in records if f.image_ref)) or "its reference"
        problems.append(f"image {image}: the slices ran different builds of {refs} ({ran})")
    if problems:
        raise ResultsError(
            "; ".join(problems) + ". Merged, a cell and its baseline from two builds would be compared as one "
            "image, and their difference called vLLM's: not merged. Run every slice from one build: pin the "
            "image by digest (`ref: REPO@sha256:…` in the matrix, or the same `--image NAME=REPO@sha256:…` "
            "given to every slice; `regbench plan CONFIG --format pins` prints them for the current tags), "
            "then run the slices again under a new run id")


def _pin(f: Fingerprint) -> str | None:
    return f.image_pin or f.image_digest


def _one_build(a: Fingerprint, b: Fingerprint) -> bool:
    return bool((_pin(a) and _pin(a) == _pin(b)) or (a.image_id and a.image_id == b.image_id))


def _build(f: Fingerprint) -> str:
    pin, image_id = _pin(f), f.image_id
    if pin and image_id and pin != image_id:
        return f"{pin} (image {image_id})"
    return str(pin or image_id)


def _distinct(records: list[T]) -> list[T]:
    seen: dict[str, T] = {}
    for record in records:
        seen.setdefault(record.model_dump_json(), record)
    return list(seen.values())
