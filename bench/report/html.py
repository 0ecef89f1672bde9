"""report.html: one self-contained page of a run. Pure: records in, text out.

A heatmap of the matrix (rows model × load format, columns platform × image; green pass, amber
flaky, red fail) whose cells open to their runs, reasons, sample outputs, log excerpts, the
image's fingerprint and a small SVG plot of boot time and request latency per run.

Self-contained because it is opened from CI artifacts, often offline: the CSS and JS
(report.css, report.js beside this module) are inlined, no fonts, no CDN, and a
Content-Security-Policy that would block any network fetch anyway.

The markup is Jinja templates (templates/*.html.j2) with autoescape on, so everything from the
records is escaped by markupsafe, in the templates and in the SVG plots (bench.report.svg)
alike: server logs and model outputs are untrusted text, and a model without weights emits
arbitrary bytes. This module bundles the records into a Report, gives the templates a few views
of them (which runs, which samples, what to count), and renders.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from dataclasses import dataclass
from importlib.resources import files

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from bench.core.diagnosis import CellDiagnosis, Match
from bench.core.perf import METRICS
from bench.core.records import (
    CellSummary,
    Finding,
    Fingerprint,
    LogExcerpt,
    RequestRecord,
    Summary,
    TokenDiff,
)
from bench.core.stats import percent_range, rate_text
from bench.core.verdicts import Verdict
from bench.report.model import Report, headline
from bench.report.perf import PLOTS, strip_svg
from bench.report.svg import run_bars, run_whiskers

RUNS_SHOWN = 200  # rows per cell's runs table; the JSONL has the rest
PLOT_RUNS = 500
SAMPLE_PROMPTS = 8
TEXT_CHARS = 400
TOKEN_IDS = 48
DETAIL_CHARS = 3000
NONDET_SHOWN = 50

LABEL = {Verdict.PASS: "PASS", Verdict.FLAKY: "FLAKY", Verdict.FAIL: "FAIL", Verdict.NOT_RUN: "NOT RUN",
         Verdict.NOT_RUNNABLE: "NOT RUNNABLE"}
# CSS classes (a class name cannot hold the space of "not run").
CLASS = {Verdict.PASS: "pass", Verdict.FLAKY: "flaky", Verdict.FAIL: "fail", Verdict.NOT_RUN: "notrun",
         Verdict.NOT_RUNNABLE: "notrun"}
MEANING = {Verdict.PASS: "pass: no run failed", Verdict.FLAKY: "flaky: some runs failed",
           Verdict.FAIL: "fail: every run failed", Verdict.NOT_RUN: "not run",
           Verdict.NOT_RUNNABLE: "not runnable on this host: no server was started"}


# --- views the templates draw -----------------------------------------------------------------


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit} more chars)"


def _anchor(cell_id: str) -> str:
    return "cell-" + cell_id


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _ids(ids: list[int] | None) -> str:
    if ids is None:
        return "(none)"
    shown = ", ".join(str(i) for i in ids[:TOKEN_IDS])
    return f"[{shown}{', …' if len(ids) > TOKEN_IDS else ''}] ({len(ids)} ids)"


def _reasons(cell: CellSummary) -> str:
    return ", ".join(f"{r} ({n}/{cell.runs})" for r, n in cell.reasons.items()) or "no finding"


def _overall(summary: Summary) -> tuple[str, str]:
    cls = {0: CLASS[Verdict.PASS], 2: CLASS[Verdict.NOT_RUN], 130: CLASS[Verdict.NOT_RUN]}.get(
        summary.exit_code, CLASS[Verdict.FAIL])
    return headline(summary), cls


def _tally(summary: Summary) -> str:
    counts = {v: sum(1 for c in summary.cells if c.verdict == v) for v in LABEL}
    return " · ".join(f"{n} {LABEL[v].lower()}" for v, n in counts.items() if n)


@dataclass(frozen=True)
class Grid:
    """The heatmap: columns platform × image, rows model × load format, None where the matrix has no cell."""

    cols: list[tuple[str, str]]
    rows: list[tuple[str, str, list[CellSummary | None]]]


def _grid(cells: list[CellSummary]) -> Grid:
    rows = list(dict.fromkeys((c.model, c.load_format) for c in cells))
    cols = list(dict.fromkeys((c.platform, c.image) for c in cells))
    at = {(c.model, c.load_format, c.platform, c.image): c for c in cells}
    return Grid(cols, [(m, f, [at.get((m, f, p, i)) for p, i in cols]) for m, f in rows])


def _interval(cell: CellSummary) -> str:
    return f"failure rate {percent_range(*cell.failure_rate_interval)}" if cell.failure_rate_interval else "no run"


def _pass_rate(cell: CellSummary) -> float:
    return (cell.runs - cell.failures) / cell.runs if cell.runs else 0.0


@dataclass(frozen=True)
class Plots:
    boot: Markup
    latency: Markup
    note: str  # when only the first PLOT_RUNS runs are drawn


def _plots(report: Report, cell: CellSummary) -> Plots:
    runs, reqs_of = report.runs_of(cell), report.requests_of(cell)
    failed = {r.repeat for r in cell.run_results if r.failed}
    repeats = sorted(runs)[:PLOT_RUNS]
    boot = run_bars("boot time per run", [(r, runs[r].server.boot_s) for r in repeats], failed, "s")
    latency = run_whiskers("request latency per run (min–median–max)",
                           [(r, [q.latency_s for q in reqs_of.get(r, [])]) for r in repeats], failed, "s")
    return Plots(boot, latency, f" (first {PLOT_RUNS} of {len(runs)} runs)" if len(runs) > PLOT_RUNS else "")


@dataclass(frozen=True)
class RunRow:
    repeat: int
    status: str
    cls: str
    reasons: str
    boot: str
    requests: str
    latency: str  # median / max over the run's requests
    findings: list[Finding]
    divergence: list[TokenDiff]
    first_divergence: TokenDiff | None
    excerpt: LogExcerpt | None
    log_path: str


@dataclass(frozen=True)
class RunRows:
    rows: list[RunRow]
    more: int  # runs left out of the table


def _run_rows(report: Report, cell: CellSummary) -> RunRows:
    runs, reqs_of = report.runs_of(cell), report.requests_of(cell)
    excerpts = report.excerpts.get(cell.cell_id, {})
    results = {r.repeat: r for r in cell.run_results}
    repeats = sorted(runs)
    rows = []
    for repeat in repeats[:RUNS_SHOWN]:
        run = runs[repeat]
        result = results.get(repeat)
        if run.interrupted or result is None:
            status, cls, reasons = "interrupted", CLASS[Verdict.NOT_RUN], "not judged"
        elif result.not_runnable:
            status, cls, reasons = Verdict.NOT_RUNNABLE.value, CLASS[Verdict.NOT_RUNNABLE], ", ".join(result.reasons)
        elif result.failed:
            status, cls, reasons = Verdict.FAIL.value, CLASS[Verdict.FAIL], ", ".join(result.reasons)
        else:
            status, cls, reasons = Verdict.PASS.value, CLASS[Verdict.PASS], "–"
        lat = [q.latency_s for q in reqs_of.get(repeat, [])]
        divergence = result.divergence if result is not None else []
        rows.append(RunRow(
            repeat=repeat, status=status, cls=cls, reasons=reasons, boot=_seconds(run.server.boot_s),
            requests=_seconds(run.requests_s), latency=f"{statistics.median(lat):.2f} / {max(lat):.2f}" if lat else "–",
            findings=result.beside_divergence if result is not None else [], divergence=divergence,
            first_divergence=min(divergence, key=lambda d: d.position) if divergence else None,
            excerpt=excerpts.get(repeat), log_path=run.server.log_path))
    return RunRows(rows, len(repeats) - RUNS_SHOWN)


@dataclass(frozen=True)
class Samples:
    label: str  # which run these are
    repeat: int
    requests: list[RequestRecord]
    more: int  # the run's prompts left out


def _samples(report: Report, cell: CellSummary) -> list[Samples]:
    """The first SAMPLE_PROMPTS requests of the first clean run and of the first failing run."""
    reqs_of = report.requests_of(cell)
    results = sorted(cell.run_results, key=lambda r: r.repeat)
    clean = next((r.repeat for r in results if not r.failed), None)
    bad = next((r.repeat for r in results if r.failed), None)
    out = []
    for repeat, label in ((clean, "first clean run"), (bad, "first failing run")):
        if repeat is not None and reqs_of.get(repeat):
            reqs = sorted(reqs_of[repeat], key=lambda q: q.prompt_id)
            out.append(Samples(label, repeat, reqs[:SAMPLE_PROMPTS], len(reqs) - SAMPLE_PROMPTS))
    return out


@dataclass(frozen=True)
class Nondeterminism:
    prompts: list[tuple[str, TokenDiff, str]]  # prompt, its earliest difference, the repeats that differ
    more: int  # prompts left out


def _nondeterminism(cell: CellSummary) -> Nondeterminism:
    by_prompt: dict[str, list[TokenDiff]] = defaultdict(list)
    for d in cell.nondeterminism:
        by_prompt[d.prompt_id].append(d)
    prompts = []
    for prompt, diffs in list(by_prompt.items())[:NONDET_SHOWN]:
        repeats = ", ".join(f"#{d.repeat}" for d in diffs[:20]) + (" …" if len(diffs) > 20 else "")
        prompts.append((prompt, min(diffs, key=lambda d: d.position), repeats))
    return Nondeterminism(prompts, len(by_prompt) - NONDET_SHOWN)


def _facts(d: CellDiagnosis) -> list[str]:
    return [f"Contrast: {d.contrast}", *(f"Server log: {x}" for x in d.log_evidence),
            *(f"Context, the passing cells' logs show it too: {x}" for x in d.log_context),
            *(f"Pre-flight: {x}" for x in d.preflight), *([f"Environment: {d.fingerprint}"] if d.fingerprint else [])]


def _match(i: int, m: Match) -> tuple[str, list[str]]:
    """A known signature's heading and its evidence, explanation and fixes."""
    head = "Symptom, not the cause" if m.symptom_only else "Likely cause" if i == 0 else "Also matches"
    return head, ([f"for: {x.says}" for x in m.supports] + [f"against: {x.says}" for x in m.contradicts]
                  + [f"not known: {x.says}" for x in m.unknown] + [f"why: {m.explanation}"]
                  + [f"fix {n}: {f}" for n, f in enumerate(m.fixes, 1)]
                  + ([f"confirm: {m.confirm}"] if m.confirm else [])
                  + ([f"references: {'; '.join(m.references)}"] if m.references else []))


def _perf_plots(report: Report) -> list[Markup]:
    """Distributions per cell, where a reader would rather look than read: boot, weight loading,
    time to first token, inter-token latency (every sample of every run)."""
    plots = []
    for name in PLOTS:
        metric = METRICS[name]
        rows = [(c.cell_id, [v for repeat, run in sorted(report.runs_of(c).items()) if not run.interrupted
                             for v in metric.per_run(run, report.requests_of(c).get(repeat, []))])
                for c in report.summary.cells]
        svg = strip_svg(f"{metric.label} ({metric.unit}), one dot per sample, tick at the median", metric.unit,
                        [(label, vs) for label, vs in rows if vs])
        if svg:
            plots.append(svg)
    return plots


def _fingerprint_fields(fps: list[Fingerprint]) -> list[str]:
    """The columns some image has a value for."""
    return [f for f in Fingerprint.model_fields if any(getattr(fp, f) is not None for fp in fps)]


# --- rendering --------------------------------------------------------------------------------

# Shared by every page of the package (report.html, the history trend page): one look, one escaper.
TEMPLATES = Environment(loader=PackageLoader("bench.report"), autoescape=True, trim_blocks=True, lstrip_blocks=True,
                        undefined=StrictUndefined)
TEMPLATES.globals.update(
    LABEL=LABEL, CLASS=CLASS, MEANING=MEANING, Verdict=Verdict, TEXT_CHARS=TEXT_CHARS, DETAIL_CHARS=DETAIL_CHARS,
    anchor=_anchor, grid=_grid, interval=_interval, pass_rate=_pass_rate, reasons=_reasons, rate_text=rate_text,
    overall=_overall, tally=_tally, plots=_plots, run_rows=_run_rows, samples=_samples, nondeterminism=_nondeterminism,
    facts=_facts, match=_match, perf_plots=_perf_plots, fingerprint_fields=_fingerprint_fields,
)
TEMPLATES.filters.update(cut=_truncate, ids=_ids)
PAGE_CSS = Markup(files("bench.report").joinpath("report.css").read_text(encoding="utf-8"))
PAGE_JS = Markup(files("bench.report").joinpath("report.js").read_text(encoding="utf-8"))

# C0 controls (ANSI colour codes, NULs from a model without weights) are parse errors in HTML;
# a lone surrogate (half an emoji from a stream) cannot even be written as UTF-8. The templates
# hold none of them, so the rendered page is cleaned whole rather than value by value.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


def tidy_html(markup: str) -> str:
    return _CONTROL.sub("\ufffd", markup)


def render(report: Report) -> str:
    """The page: only markup here, every figure and choice comes from the report and the views above."""
    return tidy_html(TEMPLATES.get_template("report.html.j2").render(r=report, css=PAGE_CSS, js=PAGE_JS)) + "\n"


def html_report(report: Report) -> str:
    """report.html of a judged run."""
    return render(report)


def _fingerprint_table(fps: list[Fingerprint]) -> str:
    """The environments table alone (the page's last section)."""
    return tidy_html(TEMPLATES.get_template("parts.html.j2").module.fingerprint_table(fps))  # type: ignore[attr-defined]
