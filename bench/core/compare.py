"""Comparison of two runs (e.g. image tag N-1 and N of one matrix). Pure: judged cells in, changes out.

Matching. Cells are matched by cell id. When no id is common to both runs (the same matrix on
another image tag has other ids) the image axis is ignored automatically and cells are matched
by (model, load_format, platform); `ignore` names axes to leave out explicitly. A key that fits
more than one cell of a run is ambiguous: a usage error rather than a guess.

A *regression* is a matched cell that passed in A and fails or is flaky in B, or that shows a
failure reason in B it did not show in A (when A judged any run), or that is slower in B by the
rule of bench.core.perf (the bootstrap interval of a metric's ratio lies beyond its threshold;
"cannot tell" is reported, not a regression). Cells only in one run are
listed but are no regression: there is nothing to compare them with.

Output divergence compares, per prompt, the outputs of each cell's first clean run, with the
comparator given (bench.core.tokens; `logprobs` tolerates a token in the other side's top k);
sampled prompts only under `exact`, as in the judge. It is reported, not a regression by itself: a
new torch or kernel may legitimately change numerics.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Literal

from bench.core.config import ConfigError
from bench.core.judge import own_findings, reference_outputs
from bench.core.perf import METRICS, MIN_RUNS, SlowdownCheck, run_values, slowdowns
from bench.core.records import CellSummary, Fingerprint, Record, RequestRecord, RunRecord
from bench.core.stats import rate_text
from bench.core.tokens import EXACT, Comparator, Output
from bench.core.verdicts import Verdict

AXES = ("model", "load_format", "platform", "image")


class Side(Record):
    """One run as compared: its judged cells, first clean outputs and fingerprints."""

    name: str
    cells: list[CellSummary]
    outputs: dict[str, dict[str, Output]]  # cell id -> prompt id -> first clean run's output
    fingerprints: list[Fingerprint]
    perf: dict[str, dict[str, list[float]]] = {}  # cell id -> metric -> one value per run (bench.core.perf)


def side_from_records(
    name: str,
    cells: list[CellSummary],
    runs: list[RunRecord],
    requests: list[RequestRecord],
    fingerprints: list[Fingerprint],
    sampled: frozenset[str] = frozenset(),
) -> Side:
    """`sampled`: prompts whose outputs are left out, being sampled under a tolerant rule (a draw
    from probabilities that moved a little may land anywhere in them; bench.core.judge.divergence)."""
    runs_of: dict[str, list[RunRecord]] = defaultdict(list)
    reqs_of: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in runs:
        runs_of[r.cell_id].append(r)
    for q in requests:
        reqs_of[q.cell_id].append(q)
    # reference_outputs skips runs with findings of their own; a run that only diverged from
    # the baseline still counts as clean here, which is what "its output" means for comparing.
    outputs = {c.cell_id: reference_outputs(runs_of[c.cell_id], [q for q in reqs_of[c.cell_id] if q.prompt_id not in sampled],
                                            {r.repeat: own_findings(r) for r in c.run_results}) for c in cells}
    perf = {c.cell_id: run_values(runs_of[c.cell_id], reqs_of[c.cell_id]) for c in cells}
    return Side(name=name, cells=cells, outputs=outputs, fingerprints=fingerprints, perf=perf)


class PromptOutput(Record):
    prompt_id: str
    status: Literal["same", "differs", "no clean run in A", "no clean run in B", "only in A", "only in B"]
    position: int | None = None  # first differing token when status is "differs"


class CellChange(Record):
    label: str  # the cell id, or its axes with "a→b" where they differ
    a_id: str
    b_id: str
    a_verdict: str
    b_verdict: str
    a_rate: str  # "0/20 (0–16 %)"
    b_rate: str
    new_reasons: list[str]
    gone_reasons: list[str]
    regression: bool
    improvement: bool
    why: list[str]  # what makes it a regression
    outputs: list[PromptOutput]
    a_nondeterministic: bool
    b_nondeterministic: bool
    slowdowns: list[SlowdownCheck] = []  # one per metric both sides measured


class FingerprintChange(Record):
    image_a: str
    image_b: str
    field: str
    a: str | None
    b: str | None


class RunComparison(Record):
    a_name: str
    b_name: str
    comparator: str = "exact"  # the rule outputs were compared by
    ignored_axes: list[str]
    auto_ignored: bool  # the image axis was ignored because no cell id was common
    cells: list[CellChange]
    only_a: list[str]
    only_b: list[str]
    fingerprint_changes: list[FingerprintChange]

    @property
    def regressions(self) -> list[CellChange]:
        return [c for c in self.cells if c.regression]


def _key(cell: CellSummary, ignore: frozenset[str]) -> tuple[str, ...]:
    # A knob's cell (`invariance`) matches the same knob's cell of the other run, even with the
    # image axis ignored: its knob is not part of the image.
    return tuple(getattr(cell, axis) for axis in AXES if axis not in ignore) + ((cell.knob,) if cell.knob else ())


def _index(side: Side, ignore: frozenset[str], which: str) -> dict[tuple[str, ...], CellSummary]:
    out: dict[tuple[str, ...], CellSummary] = {}
    for c in side.cells:
        k = _key(c, ignore)
        if k in out:
            raise ConfigError(
                f"{which} ({side.name}): cells {out[k].cell_id} and {c.cell_id} match the same key "
                f"{'/'.join(k)} with {', '.join(sorted(ignore))} ignored; compare fewer axes away"
            )
        out[k] = c
    return out


def _label(a: CellSummary, b: CellSummary) -> str:
    if a.cell_id == b.cell_id:
        return a.cell_id
    parts = [getattr(a, x) if getattr(a, x) == getattr(b, x) else f"{getattr(a, x)}→{getattr(b, x)}" for x in AXES]
    return "__".join(parts)


def _outputs(a: dict[str, Output], b: dict[str, Output], comparator: Comparator) -> list[PromptOutput]:
    out = []
    for prompt in sorted(a.keys() | b.keys()):
        ia, ib = a.get(prompt), b.get(prompt)
        if ia is None:
            out.append(PromptOutput(prompt_id=prompt, status="only in B" if a else "no clean run in A"))
        elif ib is None:
            out.append(PromptOutput(prompt_id=prompt, status="only in A" if b else "no clean run in B"))
        else:
            pos = comparator.first_difference(ib, ia)
            out.append(PromptOutput(prompt_id=prompt, status="same" if pos is None else "differs", position=pos))
    return out


def _cell_change(
    a: CellSummary, b: CellSummary, out_a: dict[str, Output], out_b: dict[str, Output], comparator: Comparator,
    perf_a: dict[str, list[float]] | None = None, perf_b: dict[str, list[float]] | None = None,
    thresholds: dict[str, float] | None = None,
) -> CellChange:
    new = sorted(set(b.reasons) - set(a.reasons)) if a.runs else []
    why = []
    if a.verdict == Verdict.PASS and b.verdict.failing:
        why.append(f"verdict pass → {b.verdict}")
    if new:
        why.append(f"new failure reasons: {', '.join(new)}")
    checks = slowdowns(perf_a or {}, perf_b or {}, thresholds)
    why += [c.text() for c in checks if c.verdict == "slower"]
    return CellChange(
        label=_label(a, b), a_id=a.cell_id, b_id=b.cell_id, a_verdict=a.verdict, b_verdict=b.verdict,
        a_rate=rate_text(a.failures, a.runs), b_rate=rate_text(b.failures, b.runs),
        new_reasons=new, gone_reasons=sorted(set(a.reasons) - set(b.reasons)),
        regression=bool(why), improvement=a.verdict.failing and b.verdict == Verdict.PASS, why=why,
        outputs=_outputs(out_a, out_b, comparator), a_nondeterministic=a.nondeterministic, b_nondeterministic=b.nondeterministic,
        slowdowns=checks,
    )


def _fingerprint_changes(a: Side, b: Side, pairs: list[tuple[str, str]]) -> list[FingerprintChange]:
    # The last line per image wins: a later fingerprint supersedes an earlier one.
    fa = {f.image: f for f in a.fingerprints}
    fb = {f.image: f for f in b.fingerprints}
    fields = [f for f in Fingerprint.model_fields if f != "image"]
    out = []
    for ia, ib in pairs:
        x, y = fa.get(ia), fb.get(ib)
        if x is None or y is None:
            if x is not y:
                out.append(FingerprintChange(image_a=ia, image_b=ib, field="fingerprint",
                                             a="recorded" if x else None, b="recorded" if y else None))
            continue
        for field in fields:
            va, vb = getattr(x, field), getattr(y, field)
            if va != vb:
                out.append(FingerprintChange(image_a=ia, image_b=ib, field=field, a=va, b=vb))
    return out


def compare(
    a: Side, b: Side, ignore: frozenset[str] = frozenset(), comparator: Comparator = EXACT,
    thresholds: dict[str, float] | None = None,
) -> RunComparison:
    """Matches A's cells with B's (see the module docstring) and lists what changed."""
    unknown = sorted(ignore - set(AXES))
    if unknown:
        raise ConfigError(f"--match-ignore {', '.join(unknown)}: axes are {', '.join(AXES)}")
    if set(AXES) <= ignore:
        raise ConfigError("--match-ignore: at least one axis must be left to match cells by")
    auto = False
    if not ignore and not {c.cell_id for c in a.cells} & {c.cell_id for c in b.cells}:
        ignore, auto = frozenset({"image"}), True
    index_a, index_b = _index(a, ignore, "A"), _index(b, ignore, "B")
    matched = [k for k in index_a if k in index_b]
    if not matched:
        raise ConfigError(
            f"no cell of A ({a.name}) matches a cell of B ({b.name}) by "
            f"{' × '.join(x for x in AXES if x not in ignore)}; pass --match-ignore AXIS to match by fewer axes"
        )
    unknown_metrics = sorted(set(thresholds or {}) - set(METRICS))
    if unknown_metrics:
        raise ConfigError(f"--threshold {', '.join(unknown_metrics)}: metrics are {', '.join(METRICS)}")
    changes = [
        _cell_change(index_a[k], index_b[k], a.outputs.get(index_a[k].cell_id, {}),
                     b.outputs.get(index_b[k].cell_id, {}), comparator,
                     a.perf.get(index_a[k].cell_id), b.perf.get(index_b[k].cell_id), thresholds)
        for k in matched
    ]
    pairs = list(dict.fromkeys((index_a[k].image, index_b[k].image) for k in matched))
    return RunComparison(
        a_name=a.name, b_name=b.name, comparator=comparator.name, ignored_axes=sorted(ignore), auto_ignored=auto,
        cells=changes,
        only_a=[c.cell_id for k, c in index_a.items() if k not in index_b],
        only_b=[c.cell_id for k, c in index_b.items() if k not in index_a],
        fingerprint_changes=_fingerprint_changes(a, b, pairs),
    )


def _outputs_line(outputs: list[PromptOutput]) -> str:
    if not outputs:
        return "outputs: no clean run on either side to compare"
    statuses = {o.status for o in outputs}
    if statuses == {"same"}:
        return f"outputs the same ({len(outputs)} prompts, first clean runs)"
    if len(statuses) == 1 and statuses != {"differs"}:
        return f"outputs: {statuses.pop()} to compare ({len(outputs)} prompts)"
    parts = [
        f"{o.prompt_id} differs at token {o.position}" if o.status == "differs" else f"{o.prompt_id} {o.status}"
        for o in outputs if o.status != "same"
    ]
    same = sum(1 for o in outputs if o.status == "same")
    return "outputs: " + "; ".join(parts) + (f"; {same} the same" if same else "")


def _perf_lines(checks: list[SlowdownCheck], verbose: bool) -> list[str]:
    """Slower metrics are in the cell's `why`; here the rest, with too few runs said once."""
    few = [c for c in checks if c.verdict == "cannot tell" and min(c.runs) < MIN_RUNS]
    out = [c.text() for c in checks if c not in few and c.verdict != "slower" and (c.verdict != "same" or verbose)]
    if few:
        runs = sorted({c.runs for c in few})
        out.append(f"performance: not enough repeats to tell ({', '.join(f'{a} and {b}' for a, b in runs)} runs; "
                   f"{MIN_RUNS} needed) for {', '.join(METRICS[c.metric].label for c in few)}")
    return out


def format_comparison(c: RunComparison, verbose: bool = False) -> list[str]:
    """The comparison as plain text lines, regressions first."""
    lines = [f"A: {c.a_name}", f"B: {c.b_name}"]
    if c.ignored_axes:
        by = " × ".join(x for x in AXES if x not in c.ignored_axes)
        why = " (no cell id is common to both runs)" if c.auto_ignored else ""
        lines.append(f"cells matched by {by}, {', '.join(c.ignored_axes)} ignored{why}")
    else:
        lines.append("cells matched by cell id")
    lines.append(f"outputs compared by {c.comparator}")
    lines.append("")
    order = sorted(c.cells, key=lambda x: (not x.regression, not x.improvement))
    for cell in order:
        tag = "REGRESSION" if cell.regression else ("improved" if cell.improvement else "same" if
                                                    cell.a_verdict == cell.b_verdict else "changed")
        lines.append(f"{tag:<10}  {cell.label}: {cell.a_verdict.upper()} {cell.a_rate} → "
                     f"{cell.b_verdict.upper()} {cell.b_rate}")
        for w in cell.why:
            lines.append(f"            {w}")
        if cell.gone_reasons:
            lines.append(f"            reasons gone: {', '.join(cell.gone_reasons)}")
        lines.append(f"            {_outputs_line(cell.outputs)}")
        lines += [f"            {line}" for line in _perf_lines(cell.slowdowns, verbose)]
        if cell.b_nondeterministic and not cell.a_nondeterministic:
            lines.append("            nondeterministic in B (outputs differ between its repeats), not in A")
    for name, ids in (("only in A", c.only_a), ("only in B", c.only_b)):
        if ids:
            lines += ["", f"{name} (not compared): {', '.join(ids)}"]
    lines += ["", "environment changes:" if c.fingerprint_changes else "environment: no fingerprint change"]
    for f in c.fingerprint_changes:
        images = f.image_a if f.image_a == f.image_b else f"{f.image_a} → {f.image_b}"
        lines.append(f"  {images}: {f.field} {f.a if f.a is not None else '-'} → {f.b if f.b is not None else '-'}")
    n = len(c.regressions)
    lines += ["", f"{n} regression{'s' if n != 1 else ''} in {len(c.cells)} matched cells"]
    return lines
