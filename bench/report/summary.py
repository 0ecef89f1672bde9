"""Report: a judged run (bench.core.judge.judge) → summary.json, summary.md, junit.xml, report.html
and the console table. Renders only; reading the records and log excerpts, and writing the files,
is bench.store.publish."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from rich.table import Table

from bench.core.diagnosis import Diagnosis
from bench.core.records import (
    CellSummary,
    Fingerprint,
    JobRecord,
    PreflightRecord,
    Summary,
)
from bench.core.stats import percent_range
from bench.core.verdicts import Reason, Verdict
from bench.report.html import html_report
from bench.report.junit import junit_xml
from bench.report.model import Report, headline
from bench.report.perf import perf_markdown

_MARK = {Verdict.PASS: "PASS", Verdict.FAIL: "FAIL", Verdict.FLAKY: "FLAKY", Verdict.NOT_RUN: "NOT RUN",
         Verdict.NOT_RUNNABLE: "NOT RUNNABLE"}


def _reasons(c: CellSummary) -> str:
    parts = [f"{reason} ({n}/{c.runs})" for reason, n in c.reasons.items()]
    if c.divergence_positions:
        parts.append(f"first divergence at token {min(c.divergence_positions)}")
    if c.unconfirmed:
        parts.append("unconfirmed, not counted: " + ", ".join(
            n.prompt_id or "reference text" for n in c.unconfirmed))
    return ", ".join(parts) or "-"


def _nll(c: CellSummary) -> str:
    if not c.reference_nll:
        return "-"
    shown = sorted({"NaN/error" if x is None else f"{x:.2f}" for x in c.reference_nll})
    return "–".join([shown[0], shown[-1]]) if len(shown) > 1 else shown[0]


def _interval(c: CellSummary) -> str:
    return percent_range(*c.failure_rate_interval) if c.failure_rate_interval else "-"


def _nondeterminism_lines(c: CellSummary, limit: int = 10) -> list[str]:
    first: dict[str, int] = {}
    repeats: dict[str, set[int]] = defaultdict(set)
    for d in c.nondeterminism:
        first[d.prompt_id] = min(first.get(d.prompt_id, d.position), d.position)
        repeats[d.prompt_id].add(d.repeat)
    lines = [
        f"- `{c.cell_id}`: prompt `{p}` differs between repeats at token {pos} ({len(repeats[p])} of {c.runs} runs)"
        for p, pos in list(first.items())[:limit]
    ]
    if len(first) > limit:
        lines.append(f"- `{c.cell_id}`: … {len(first) - limit} more prompts")
    return lines


def _unconfirmed_label(reason: Reason, prompt_id: str | None) -> str:
    if reason == Reason.HTTP_ERROR:
        return f"contract probe of prompt `{prompt_id}`, refused (HTTP 400)"
    return f"known answer of prompt `{prompt_id}`" if prompt_id else "reference-text ceiling"


def _unconfirmed_where(reason: Reason, holds: Sequence[CellSummary]) -> str:
    """Where else in the matrix a set-aside check holds, or a refused contract probe is served."""
    cells = ", ".join(f"`{c.cell_id}`" for c in holds)
    if reason == Reason.HTTP_ERROR:
        return f"served in {cells}" if holds else "served by no judged cell: no server here has the feature"
    return (f"it holds in {cells}: the check depends on numerics" if holds
            else "it holds in no judged cell: the check does not fit this model, or every cell answers wrongly")


def unconfirmed_markdown(cells: Sequence[CellSummary]) -> list[str]:
    """The "Unconfirmed: set aside, not counted" section: absolute checks set aside because the
    baseline missed them too, and contract probes the server refuses, with where else in the
    matrix each one holds, so a reader can tell a check that does not fit the model's numerics
    from everything answering wrongly."""
    noted = [c for c in cells if c.unconfirmed]
    if not noted:
        return []
    lines = ["", "## Unconfirmed: set aside, not counted", "",
             "Known answers or the reference ceiling that the baseline cell missed too, with nothing else "
             "against the cell, and contract probes the server refuses (as the baseline does, or under a knob): "
             "not counted in the cell's verdict.", ""]
    keys = sorted({(n.reason, n.prompt_id) for c in noted for n in c.unconfirmed},
                  key=lambda k: (k[0], k[1] or ""))
    for reason, prompt in keys:
        missing = [c for c in noted if any((n.reason, n.prompt_id) == (reason, prompt) for n in c.unconfirmed)]
        counted = [c for c in cells if reason in c.reasons and c not in missing]
        holds = [c for c in cells if c.runs and c not in missing and c not in counted]
        how = (f"refused in {len(missing)} cell(s), skipped there" if reason == Reason.HTTP_ERROR else
               f"missed in {len(missing)} cell(s) with the baseline, with no divergence and a normal reference score")
        lines.append(f"- {_unconfirmed_label(reason, prompt)}: {how}; {_unconfirmed_where(reason, holds)}")
        for c in missing:
            n = next(n for n in c.unconfirmed if (n.reason, n.prompt_id) == (reason, prompt))
            lines.append(f"  - `{c.cell_id}` ({n.runs}/{c.runs} runs): {n.detail[:160]}")
    return lines


def _escape_pipes(text: str) -> str:
    return text.replace("|", "\\|")  # a token's text may hold one; it would end the table's cell


def invariance_markdown(cells: Sequence[CellSummary]) -> list[str]:
    """The knobs' cells (`invariance`): each against the same cell without its knob."""
    knobs = [c for c in cells if c.knob]
    if not knobs:
        return []
    lines = ["", "## Invariance: settings that must not change outputs", "",
             "Each knob's cell against the same cell without the knob, by "
             f"{knobs[0].comparator}; a difference is `invariance_broken`.", "",
             "| knob | changes | cell without it | held in | first difference |", "|---|---|---|---|---|"]
    for c in knobs:
        broken = c.reasons.get(Reason.INVARIANCE_BROKEN, 0)
        held = f"{c.runs - broken}/{c.runs}" if c.runs else "not run"
        lines.append(f"| {c.knob} | {c.knob_changes} | `{c.baseline_id}` | {'**' + held + '**' if broken else held} | "
                     f"{_escape_pipes(c.invariance_broken or '-')} |")
    return lines


def diagnosis_markdown(diagnosis: Diagnosis) -> list[str]:
    """The "Diagnosis" section: per failing cell its evidence and the known causes it matches."""
    if not diagnosis.cells:
        return []
    lines = ["", "## Diagnosis", ""]
    for d in diagnosis.cells:
        lines += [f"### `{d.cell_id}`: {d.verdict.upper()} ({', '.join(d.reasons)})", ""]
        lines.append(f"- Contrast: {d.contrast}")
        lines += [f"- Server log: {e}" for e in d.log_evidence]
        lines += [f"- Context, the passing cells' logs show it too: {e}" for e in d.log_context]
        lines += [f"- Pre-flight: {p}" for p in d.preflight]
        if d.fingerprint:
            lines.append(f"- Environment: {d.fingerprint}")
        lines.append("")
        if not d.matches:
            lines += ["**No known signature.** The evidence above is all there is; no cause is guessed.", ""]
        for i, m in enumerate(d.matches):
            head = "Likely cause" if i == 0 and not m.symptom_only else "Symptom, not the cause" if m.symptom_only \
                else "Also matches"
            lines.append(f"**{head}: {m.title}** (`{m.signature}`: {len(m.supports)} for, {len(m.contradicts)} against, "
                         f"{len(m.unknown)} not known)")
            lines += [f"- for: {e.says}" for e in m.supports]
            lines += [f"- against: {e.says}" for e in m.contradicts]
            lines += [f"- not known: {e.says}" for e in m.unknown]
            lines.append(f"- why: {m.explanation}")
            lines += [f"- fix {n}: {f}" for n, f in enumerate(m.fixes, 1)]
            if m.confirm:
                lines.append(f"- confirm: `{m.confirm}`")
            if m.references:
                lines.append(f"- references: {'; '.join(m.references)}")
            lines.append("")
    return lines


def jobs_markdown(jobs: Sequence[JobRecord]) -> list[str]:
    """The cluster jobs behind the run; a job that did not complete says why its cell has fewer runs."""
    if not jobs:
        return []
    lines = ["", "## Slurm jobs", "",
             "One job per cell; a cell whose job did not complete has the runs it made before.", "",
             "Attempt: submitted again by `--resume`; requeued: run again by Slurm under the same job id.", "",
             "| cell | job | attempt | requeued | node | state | reason | exit | CUDA_VISIBLE_DEVICES |",
             "|---|---|---|---|---|---|---|---|---|"]
    for j in jobs:
        state = j.state if j.state == "COMPLETED" else f"**{j.state}**"
        lines.append(f"| `{j.cell_id}` | {j.job_id} | {j.attempt} | {j.restarts} | {j.node or '-'} | {state} | "
                     f"{j.reason or '-'} | {j.exit_code or '-'} | {j.cuda_visible_devices or '-'} |")
    return lines


def markdown(summary: Summary, fingerprints: list[Fingerprint], diagnosis: Diagnosis | None = None,
             jobs: Sequence[JobRecord] = ()) -> str:
    verdict = headline(summary)
    lines = [
        f"# regbench {summary.config_name}: {verdict}",
        "",
        f"Run `{summary.run_id}`, {summary.finished_at - summary.started_at:.0f} s. "
        "Failures/runs counts fresh servers; the failure rate is its Wilson 95 % interval. "
        f"Outputs compared by {summary.cells[0].comparator if summary.cells else 'exact'}; reference text: "
        "mean negative log-likelihood per token of the reference passage (nats, lower is likelier).",
        "",
        "| cell | verdict | failures/runs | failure rate | reasons | reference text | baseline |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in summary.cells:
        lines.append(
            f"| `{c.cell_id}` | **{_MARK[c.verdict]}** | {c.failures}/{c.runs} | {_interval(c)} | {_reasons(c)} | "
            f"{_nll(c)} | {'`' + c.baseline_id + '`' if c.baseline_id else '(is baseline)'} |"
        )
    examples = [c for c in summary.cells if c.example]
    if examples:
        lines += ["", "## First finding per failing cell", ""]
        lines += [f"- `{c.cell_id}`: {c.example}" for c in examples]
    lines += preflight_markdown(summary.preflight)
    lines += unconfirmed_markdown(summary.cells)
    lines += invariance_markdown(summary.cells)
    lines += nondeterminism_markdown(summary.cells)
    lines += environments_markdown(fingerprints)
    lines += jobs_markdown(jobs)
    lines += perf_markdown(summary.cells)
    if diagnosis is not None:
        lines += diagnosis_markdown(diagnosis)
    lines += ["", "Per-run detail: `report.html` and `junit.xml` in the results folder."]
    return "\n".join(lines) + "\n"


def preflight_markdown(preflight: Sequence[PreflightRecord]) -> list[str]:
    """The checks of the weights made before any server, each with its problems and notes."""
    if not preflight:
        return []
    lines = ["", "## Pre-flight: the weights before any server", ""]
    for p in preflight:
        what = f"{p.kind} `{p.model}`" + (f" with `{p.image}` / `{p.load_format}`" if p.image else "")
        state = "skipped" if p.skipped else "ok" if p.ok else "**FAILED**" + (
            f" ({p.lost} tensor deliveries lost)" if p.lost else "")
        lines.append(f"- {what}: {state}")
        lines += [f"  - {line}" for line in (*p.problems, *p.notes)]
    return lines


def nondeterminism_markdown(cells: Sequence[CellSummary]) -> list[str]:
    nondeterministic = [c for c in cells if c.nondeterministic]
    if not nondeterministic:
        return []
    lines = ["", "## Nondeterministic outputs", "",
             "Token ids that differ between repeats of one cell (not counted in the verdict).", ""]
    for c in nondeterministic:
        lines += _nondeterminism_lines(c)
    return lines


def environments_markdown(fingerprints: Sequence[Fingerprint]) -> list[str]:
    """Each image's fingerprint: what every repeat of its cells ran."""
    if not fingerprints:
        return []
    pinned = any(f.image_ref for f in fingerprints)  # containers: which build every repeat ran
    # The packages where FP8/NVFP4 regressions live: a column only where some image has one.
    extra = [(k, label) for k, label in _PACKAGE_COLUMNS if any(getattr(f, k) for f in fingerprints)]
    lines = ["", "## Environments", "", "| image |" + (" ref → pinned to |" if pinned else "")
             + " vLLM | runai-model-streamer | torch | CUDA |" + "".join(f" {label} |" for _, label in extra)
             + " Python | arch | CPU | GPU |",
             "|---|" + ("---|" if pinned else "") + "---|---|---|---|" + "---|" * len(extra)
             + "---|---|---|---|"]
    for f in fingerprints:
        lines.append(
            f"| {f.image} |" + (f" {_pin(f)} |" if pinned else "")
            + f" {f.vllm} | {f.runai_model_streamer} | {f.torch} | {f.cuda or '-'} |"
            + "".join(f" {getattr(f, k) or '-'} |" for k, _ in extra)
            + f" {f.python} | {f.arch} | {f.cpu} | {f.gpu or '-'} |"
            + (f" fingerprint error: {f.error}" if f.error else "")
        )
    return lines


_PACKAGE_COLUMNS = (("transformers", "transformers"), ("flashinfer", "FlashInfer"), ("triton", "Triton"),
                    ("nccl", "NCCL"), ("modelopt", "ModelOpt"), ("cudnn", "cuDNN"))


def _pin(f: Fingerprint) -> str:
    """`ref → pin` of a container image: the tag asked for and the digest (or, for an image that
    exists only on that host, the image id) every container of the run was created from."""
    if not f.image_ref:
        return "-"
    pin = f.image_pin or f.image_digest or f.image_id
    return f"`{f.image_ref}` → `{pin}`" if pin and pin != f.image_ref else f"`{f.image_ref}`"


def render_all(report: Report) -> dict[str, str]:
    """Every derived file of a results folder, by file name: one place for the runner and
    `regbench report` both."""
    files = {
        "summary.json": report.summary.model_dump_json(indent=2) + "\n",
        "summary.md": markdown(report.summary, report.fingerprints, report.diagnosis, report.jobs),
        "junit.xml": junit_xml(report.summary, report.all_runs),
        "report.html": html_report(report),
    }
    if report.diagnosis is not None:
        files["diagnosis.json"] = report.diagnosis.model_dump_json(indent=2) + "\n"
    return files


_STYLE = {Verdict.PASS: "green", Verdict.FAIL: "bold red", Verdict.FLAKY: "yellow", Verdict.NOT_RUN: "dim",
          Verdict.NOT_RUNNABLE: "dim"}


def table(summary: Summary) -> Table:
    t = Table(title=f"regbench {summary.config_name} — {summary.run_id}")
    for col in ("model", "load format", "platform", "image", "verdict", "fail/runs", "failure rate", "reasons"):
        t.add_column(col, overflow="fold")
    for c in summary.cells:
        t.add_row(c.model, c.load_format, c.platform, c.image, f"[{_STYLE[c.verdict]}]{_MARK[c.verdict]}[/]",
                  f"{c.failures}/{c.runs}", _interval(c), _reasons(c))
    return t
