"""Contrast over the matrix: what separates a failing cell from the passing ones. Pure.

For a failing or flaky cell, the smallest set of its own axis values such that every judged cell
sharing them fails ("fails only with load_format=runai_streamer and image=streamer-0.16.0"); its
passing neighbours (cells that differ from it in one axis and pass: "passes with safetensors in the
same image"); and the fingerprint fields whose value in its environment differs from every value in
the environments where the same model and load format pass (the cells that differ from it in the
image alone).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

from bench.core.compare import AXES
from bench.core.records import CellSummary, Fingerprint, Record
from bench.core.verdicts import Verdict

_FIELDS = ("vllm", "runai_model_streamer", "torch", "cuda", "transformers", "flashinfer", "triton", "nccl",
           "modelopt", "cudnn", "python", "arch", "gpu")


class Neighbour(Record):
    axis: str
    value: str  # the neighbour's value on that axis
    cell_id: str


class FingerprintDifference(Record):
    field: str
    failing: list[str]  # values in the failing cells' environments
    passing: list[str]  # values in the passing cells' environments


class Contrast(Record):
    cell_id: str
    only_with: dict[str, str]  # {} when no set of its values separates it (a failing cell's
    # twin on every axis passes, or nothing passes at all)
    passing_neighbours: list[Neighbour]
    fingerprint: list[FingerprintDifference]
    varying: list[str] = []  # the axes with more than one value among the judged cells
    # A knob's cell whose original (the same cell without the knob) passes: that knob.
    only_under_knob: str | None = None

    def describe(self) -> str:
        parts = []
        if self.only_under_knob:
            parts.append(f"fails only under knob {self.only_under_knob}: the same cell without it passes")
        if self.only_with:
            parts.append("fails only with " + " and ".join(f"{k}={v}" for k, v in self.only_with.items()))
        if self.passing_neighbours:
            parts.append("passes with " + "; with ".join(
                f"{n.axis}={n.value}" for n in self.passing_neighbours))
        for f in self.fingerprint:
            parts.append(f"{f.field} {', '.join(f.failing)} where it fails, {', '.join(f.passing)} where it passes")
        return "; ".join(parts) or "no contrast: nothing in the matrix passes to compare with"


def _axes(c: CellSummary) -> dict[str, str]:
    return {a: getattr(c, a) for a in AXES}


def contrast(cells: list[CellSummary], fingerprints: Sequence[Fingerprint] = ()) -> list[Contrast]:
    judged = [c for c in cells if c.verdict not in (Verdict.NOT_RUN, Verdict.NOT_RUNNABLE)]
    failing = [c for c in judged if c.verdict.failing]
    passing = [c for c in judged if c.verdict == Verdict.PASS]
    varying = [a for a in AXES if len({getattr(c, a) for c in judged}) > 1]
    prints = {f.image: f for f in fingerprints}
    out = []
    for cell in failing:
        mine = _axes(cell)
        only: dict[str, str] = {}
        if passing:
            for size in range(1, len(varying) + 1):
                found = next((dict((a, mine[a]) for a in subset) for subset in combinations(varying, size)
                              if all(c.verdict.failing for c in judged
                                     if all(getattr(c, a) == mine[a] for a in subset))), None)
                if found:
                    only = found
                    break
        neighbours = [
            Neighbour(axis=a, value=getattr(p, a), cell_id=p.cell_id)
            for p in passing for a in AXES
            if getattr(p, a) != mine[a] and all(getattr(p, b) == mine[b] for b in AXES if b != a)
        ]
        original = next((c for c in judged if cell.knob and c.cell_id == cell.baseline_id), None)
        out.append(Contrast(cell_id=cell.cell_id, only_with=only, passing_neighbours=neighbours,
                            fingerprint=_fingerprint(cell, passing, prints), varying=varying,
                            only_under_knob=cell.knob if original and original.verdict == Verdict.PASS else None))
    return out


def _fingerprint(cell: CellSummary, passing: list[CellSummary], prints: dict[str, Fingerprint]) -> list[FingerprintDifference]:
    mine = prints.get(cell.image)
    if mine is None:
        return []
    # Only where the same thing passes in another environment: there the environment is the difference.
    twins = [p for p in passing if p.image != cell.image and all(getattr(p, a) == getattr(cell, a)
                                                                  for a in AXES if a != "image")]
    theirs = [prints[p.image] for p in twins if p.image in prints]
    out = []
    for field in _FIELDS:
        value = getattr(mine, field)
        others = sorted({str(getattr(f, field)) for f in theirs if getattr(f, field) is not None})
        if value is not None and others and str(value) not in others:
            out.append(FingerprintDifference(field=field, failing=[str(value)], passing=others))
    return out
