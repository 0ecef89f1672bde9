"""report.html: one self-contained page of a run. Pure: records in, text out.

A heatmap of the matrix (rows model × load format, columns platform × image; green pass, amber
flaky, red fail) whose cells open to their runs, reasons, sample outputs, log excerpts, the
image's fingerprint and a small SVG plot of boot time and request latency per run.

Self-contained because it is opened from CI artifacts, often offline: inline CSS and JS, no
fonts, no CDN, and a Content-Security-Policy that would block any network fetch anyway.
Everything from the records goes through html.escape: server logs and model outputs are
untrusted text, and a model without weights emits arbitrary bytes.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from html import escape

from bench.core.diagnosis import Diagnosis
from bench.core.perf import METRICS
from bench.core.records import CellSummary, Fingerprint, JobRecord, LogExcerpt, RequestRecord, RunRecord, Summary
from bench.core.stats import percent_range, rate_text
from bench.core.verdicts import Verdict
from bench.report.perf import PLOTS, strip_svg

RUNS_SHOWN = 200  # rows per cell's runs table; the JSONL has the rest
PLOT_RUNS = 500
SAMPLE_PROMPTS = 8
TEXT_CHARS = 400
TOKEN_IDS = 48
DETAIL_CHARS = 3000
NONDET_SHOWN = 50

_LABEL = {Verdict.PASS: "PASS", Verdict.FLAKY: "FLAKY", Verdict.FAIL: "FAIL", Verdict.NOT_RUN: "NOT RUN"}
# CSS classes (a class name cannot hold the space of "not run").
_CLASS = {Verdict.PASS: "pass", Verdict.FLAKY: "flaky", Verdict.FAIL: "fail", Verdict.NOT_RUN: "notrun"}


# C0 controls (ANSI colour codes, NULs from a model without weights) are parse errors in HTML;
# a lone surrogate (half an emoji from a stream) cannot even be written as UTF-8.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


def e(value: object) -> str:
    return escape(_CONTROL.sub("\ufffd", str(value)), quote=True)


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit} more chars)"


def _anchor(cell_id: str) -> str:
    return "cell-" + cell_id


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


# --- the heatmap --------------------------------------------------------------------------------


def heatmap(cells: list[CellSummary]) -> str:
    rows = list(dict.fromkeys((c.model, c.load_format) for c in cells))
    cols = list(dict.fromkeys((c.platform, c.image) for c in cells))
    at = {(c.model, c.load_format, c.platform, c.image): c for c in cells}
    out = ['<table id="heatmap" class="heatmap"><thead><tr><th>model</th><th>load format</th>']
    out += [f'<th class="col"><span class="platform">{e(p)}</span><br>{e(i)}</th>' for p, i in cols]
    out.append("</tr></thead><tbody>")
    for model, fmt in rows:
        out.append(f'<tr><th class="row">{e(model)}</th><th class="row">{e(fmt)}</th>')
        for platform, image in cols:
            c = at.get((model, fmt, platform, image))
            if c is None:
                out.append('<td class="hm empty" title="not in the matrix">–</td>')
                continue
            pass_rate = (c.runs - c.failures) / c.runs if c.runs else 0.0
            interval = (
                f"failure rate {percent_range(*c.failure_rate_interval)}" if c.failure_rate_interval else "no run"
            )
            reasons = ", ".join(f"{r} ({n}/{c.runs})" for r, n in c.reasons.items()) or "no finding"
            badge = '<span class="badge" title="outputs differ between repeats">≠ nondeterministic</span>' \
                if c.nondeterministic else ""
            # Flaky cells shade from orange (mostly failing) to yellow-amber (mostly passing).
            shade = f' style="background:hsl({20 + 30 * pass_rate:.0f},90%,86%)"' if c.verdict == Verdict.FLAKY else ""
            out.append(
                f'<td class="hm {_CLASS[c.verdict]}"{shade} title="{e(c.cell_id)}: {e(reasons)}">'
                f'<a class="hm-link" href="#{e(_anchor(c.cell_id))}" data-target="{e(_anchor(c.cell_id))}">'
                f'<span class="verdict">{_LABEL[c.verdict]}</span>'
                f'<span class="count">{c.failures}/{c.runs} failed</span>'
                f'<span class="bar"><span style="width:{pass_rate * 100:.0f}%"></span></span>'
                f'<span class="rate">{e(interval)}</span>{badge}</a></td>'
            )
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


# --- the plot ---------------------------------------------------------------------------------


def _plot_head(title: str, unit: str, vmax: float, w: int, h: int, left: int, bottom: int, top: int) -> list[str]:
    """The frame both per-run plots share: title, x axis, y range labels."""
    return [
        f'<svg class="plot" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{e(title)}">',
        f'<text x="6" y="14" class="pt">{e(title)}</text>',
        f'<line x1="{left}" y1="{h - bottom}" x2="{w - 4}" y2="{h - bottom}" class="axis"/>',
        f'<text x="{left - 4}" y="{top + 4}" class="yl">{vmax:.3g}{e(unit)}</text>',
        f'<text x="{left - 4}" y="{h - bottom}" class="yl">0</text>',
    ]


def _plot_close(parts: list[str], points: list, w: int, h: int, left: int) -> str:
    """The first and last repeat under the x axis, and the end of the SVG."""
    if points:
        parts.append(f'<text x="{left}" y="{h - 4}" class="xl">#{points[0][0]}</text>')
        parts.append(f'<text x="{w - 4}" y="{h - 4}" class="xl end">#{points[-1][0]}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _bars_svg(title: str, points: list[tuple[int, float | None]], failed: set[int], unit: str) -> str:
    w, h, left, bottom, top = 360, 140, 40, 18, 26
    vals = [v for _, v in points if v is not None]
    vmax = max(vals) if vals else 0.0
    vmax = vmax if vmax > 0 else 1.0
    n = max(len(points), 1)
    step = (w - left - 6) / n
    bw = max(step * 0.7, 1.0)
    parts = _plot_head(title, unit, vmax, w, h, left, bottom, top)
    for i, (repeat, v) in enumerate(points):
        x = left + i * step + (step - bw) / 2
        cls = "b-fail" if repeat in failed else "b-pass"
        if v is None:
            parts.append(f'<text x="{x + bw / 2:.1f}" y="{h - bottom - 3}" class="na">×</text>')
            continue
        bh = (h - bottom - top) * v / vmax
        parts.append(
            f'<rect x="{x:.1f}" y="{h - bottom - bh:.1f}" width="{bw:.1f}" height="{bh:.1f}" class="{cls}">'
            f"<title>#{repeat}: {v:.2f}{e(unit)}</title></rect>"
        )
    return _plot_close(parts, points, w, h, left)


def _latency_svg(points: list[tuple[int, list[float]]], failed: set[int]) -> str:
    """Per run: a whisker from the fastest to the slowest request, a dot at the median."""
    w, h, left, bottom, top = 360, 140, 40, 18, 26
    vals = [v for _, lat in points for v in lat]
    vmax = max(vals) if vals else 0.0
    vmax = vmax if vmax > 0 else 1.0
    n = max(len(points), 1)
    step = (w - left - 6) / n
    scale = (h - bottom - top) / vmax
    parts = _plot_head("request latency per run (min–median–max)", "s", vmax, w, h, left, bottom, top)
    for i, (repeat, lat) in enumerate(points):
        x = left + i * step + step / 2
        if not lat:
            parts.append(f'<text x="{x:.1f}" y="{h - bottom - 3}" class="na">×</text>')
            continue
        lo, med, hi = min(lat), statistics.median(lat), max(lat)
        cls = "d-fail" if repeat in failed else "d-pass"
        parts.append(
            f'<g class="{cls}"><title>#{repeat}: {len(lat)} requests, min {lo:.2f} s, median {med:.2f} s, '
            f'max {hi:.2f} s</title>'
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{h - bottom - lo * scale:.1f}" y2="{h - bottom - hi * scale:.1f}"/>'
            f'<circle cx="{x:.1f}" cy="{h - bottom - med * scale:.1f}" r="{min(3.0, max(step / 3, 1.0)):.1f}"/></g>'
        )
    return _plot_close(parts, points, w, h, left)


# --- one cell's details -----------------------------------------------------------------------


def _ids(ids: list[int] | None) -> str:
    if ids is None:
        return "(none)"
    shown = ", ".join(str(i) for i in ids[:TOKEN_IDS])
    return f"[{shown}{', …' if len(ids) > TOKEN_IDS else ''}] ({len(ids)} ids)"


def _sample(req: RequestRecord, label: str) -> str:
    if req.error_kind is not None:
        body = f'<div class="err">{e(req.error_kind)}: {e(_truncate(req.error or "", TEXT_CHARS))}</div>'
    else:
        text = req.text or ""
        shown = f'<pre class="out">{e(_truncate(text, TEXT_CHARS))}</pre>' if text else \
            '<div class="err">empty text</div>'
        body = (f'{shown}<div class="ids">token ids {e(_ids(req.token_ids))}</div>')
    return (
        f'<div class="sample"><div class="sh"><b>{e(req.prompt_id)}</b> · repeat {req.repeat} ({e(label)}) · '
        f'{e(req.api)}{" stream" if req.stream else ""} · HTTP {e(req.status)} · '
        f'{e(req.completion_tokens)} tokens · finish {e(req.finish_reason)} · {req.latency_s:.2f} s</div>{body}</div>'
    )


def _samples(cell: CellSummary, reqs_of: dict[int, list[RequestRecord]]) -> str:
    results = sorted(cell.run_results, key=lambda r: r.repeat)
    clean = next((r.repeat for r in results if not r.failed), None)
    bad = next((r.repeat for r in results if r.failed), None)
    picks = [(repeat, label) for repeat, label in ((clean, "first clean run"), (bad, "first failing run"))
             if repeat is not None and reqs_of.get(repeat)]
    if not picks:
        return '<p class="muted">No request was recorded for this cell.</p>'
    out = []
    for repeat, label in picks:
        reqs = sorted(reqs_of[repeat], key=lambda q: q.prompt_id)
        more = len(reqs) - SAMPLE_PROMPTS
        out += [_sample(q, label) for q in reqs[:SAMPLE_PROMPTS]]
        if more > 0:
            out.append(f'<p class="muted">… {more} more prompts of repeat {repeat} in requests.jsonl</p>')
    return "".join(out)


def _unconfirmed(cell: CellSummary) -> str:
    if not cell.unconfirmed_probes:
        return ""
    items = "".join(
        f"<li><b>{e(n.prompt_id or 'reference text')}</b> ({n.runs}/{cell.runs} runs): {e(n.detail[:200])}. "
        f"{e(n.why)}</li>" for n in cell.unconfirmed_probes)
    return f"<p>Probes missed with the baseline, not counted:</p><ul>{items}</ul>"


def _nondeterminism(cell: CellSummary) -> str:
    if not cell.nondeterminism:
        return ""
    by_prompt: dict[str, list] = defaultdict(list)
    for d in cell.nondeterminism:
        by_prompt[d.prompt_id].append(d)
    items = []
    for prompt, diffs in list(by_prompt.items())[:NONDET_SHOWN]:
        first = min(diffs, key=lambda d: d.position)
        repeats = ", ".join(f"#{d.repeat}" for d in diffs[:20]) + (" …" if len(diffs) > 20 else "")
        items.append(
            f"<li>prompt <b>{e(prompt)}</b> differs between repeats at token {first.position} "
            f"(repeat {first.repeat} vs {first.reference_repeat}; differing: {e(repeats)})</li>"
        )
    more = len(by_prompt) - NONDET_SHOWN
    if more > 0:
        items.append(f"<li>… {more} more prompts</li>")
    return (f'<div class="nondet"><b>Nondeterministic</b> (reported on its own; the verdict does not count it):'
            f'<ul>{"".join(items)}</ul></div>')


def _log_text(ex: LogExcerpt) -> str:
    if ex.focus is None:
        return e(ex.text)
    # Context before the finding is dimmed; the marker is what the page scrolls the box to.
    return (f'<span class="ctx">{e(ex.text[: ex.focus])}</span><span class="focus"></span>'
            f"{e(ex.text[ex.focus :])}")


def _run_rows(
    cell: CellSummary,
    runs: dict[int, RunRecord],
    reqs_of: dict[int, list[RequestRecord]],
    excerpts: dict[int, LogExcerpt],
) -> str:
    results = {r.repeat: r for r in cell.run_results}
    repeats = sorted(runs)
    rows = []
    for repeat in repeats[:RUNS_SHOWN]:
        run = runs[repeat]
        result = results.get(repeat)
        if run.interrupted or result is None:
            status, cls, reasons = "interrupted", _CLASS[Verdict.NOT_RUN], "not judged"
        elif result.failed:
            status, cls, reasons = Verdict.FAIL.value, _CLASS[Verdict.FAIL], ", ".join(result.reasons)
        else:
            status, cls, reasons = Verdict.PASS.value, _CLASS[Verdict.PASS], "–"
        lat = [q.latency_s for q in reqs_of.get(repeat, [])]
        lat_text = f"{statistics.median(lat):.2f} / {max(lat):.2f}" if lat else "–"
        details = []
        for f in run.findings:
            details.append(f'<pre class="finding"><b>{e(f.reason)}</b>: {e(_truncate(f.detail, DETAIL_CHARS))}</pre>')
        if result is not None and result.divergence:
            first = min(result.divergence, key=lambda d: d.position)
            details.append(
                f'<div class="finding"><b>divergence</b>: {len(result.divergence)} prompt(s) differ from the '
                f"baseline; first: {e(first.prompt_id)} at token {first.position}</div>"
            )
        ex = excerpts.get(repeat)
        if ex is not None:
            details.append(
                f'<details class="log"><summary>server.log around the finding ({e(ex.why)}, bytes '
                f"{ex.start_byte}–{ex.end_byte})</summary>"
                f'<pre class="logtext">{_log_text(ex)}</pre></details>'
            )
        rows.append(
            f'<tr class="r-{cls}"><td>#{repeat}</td><td><span class="pill {cls}">{status}</span></td>'
            f"<td>{_seconds(run.server.boot_s)}</td><td>{_seconds(run.requests_s)}</td><td>{lat_text}</td>"
            f"<td>{e(reasons)}</td><td>{''.join(details)}<div class='path'>{e(run.server.log_path)}</div></td></tr>"
        )
    more = len(repeats) - RUNS_SHOWN
    tail = f'<p class="muted">… {more} more runs in runs.jsonl</p>' if more > 0 else ""
    return (
        '<table class="runs"><thead><tr><th>run</th><th>result</th><th>boot s</th><th>requests s</th>'
        "<th>latency median / max s</th><th>reasons</th><th>findings, log</th></tr></thead><tbody>"
        + "".join(rows) + "</tbody></table>" + tail
    )


def _jobs_html(jobs: Sequence[JobRecord]) -> str:
    """The Slurm jobs behind the cells, under the matrix: a job that did not complete is why its
    cell has fewer runs (or none), and the reader should not have to find that in a file."""
    if not jobs:
        return ""
    failed = [j for j in jobs if j.state != "COMPLETED"]
    note = (f"<p><strong>{len(failed)} of {len(jobs)} job(s) did not complete</strong>: their cells have the runs "
            "made before; <code>regbench run --resume DIR --executor slurm</code> submits them again.</p>"
            if failed else f'<p class="muted">All {len(jobs)} job(s) completed.</p>')
    head = "".join(f"<th>{h}</th>" for h in ("cell", "job", "attempt", "requeued", "node", "state", "reason", "exit",
                                             "CUDA_VISIBLE_DEVICES"))
    rows = []
    for j in jobs:
        cls = ' class="r-fail"' if j.state != "COMPLETED" else ""
        state = e(j.state) if j.state == "COMPLETED" else f"<strong>{e(j.state)}</strong>"
        cells = [f'<a href="#{e(_anchor(j.cell_id))}"><code>{e(j.cell_id)}</code></a>', e(j.job_id), e(j.attempt),
                 e(j.restarts), e(j.node or "–"), state, e(j.reason or "–"), e(j.exit_code or "–"),
                 e(j.cuda_visible_devices or "–")]
        rows.append(f"<tr{cls}>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return (f"<h2>Slurm jobs</h2>{note}"
            f'<table class="runs jobs"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>')


def _fingerprint_table(fps: list[Fingerprint]) -> str:
    if not fps:
        return '<p class="muted">No fingerprint recorded.</p>'
    fields = [f for f in Fingerprint.model_fields if any(getattr(fp, f) is not None for fp in fps)]
    head = "".join(f"<th>{e(f)}</th>" for f in fields)
    body = "".join(
        "<tr>" + "".join(f"<td>{e(getattr(fp, f) if getattr(fp, f) is not None else '–')}</td>" for f in fields)
        + "</tr>" for fp in fps
    )
    return f'<table class="fp"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def cell_details(
    cell: CellSummary,
    runs: dict[int, RunRecord],
    reqs_of: dict[int, list[RequestRecord]],
    excerpts: dict[int, LogExcerpt],
    fingerprints: list[Fingerprint],
) -> str:
    failed = {r.repeat for r in cell.run_results if r.failed}
    repeats = sorted(runs)[:PLOT_RUNS]
    boot = [(r, runs[r].server.boot_s) for r in repeats]
    latency = [(r, [q.latency_s for q in reqs_of.get(r, [])]) for r in repeats]
    plot_note = f" (first {PLOT_RUNS} of {len(runs)} runs)" if len(runs) > PLOT_RUNS else ""
    reasons = ", ".join(f"{e(r)} ({n}/{cell.runs})" for r, n in cell.reasons.items()) or "no finding"
    if cell.divergence_positions:
        reasons += f"; first divergence from the baseline at token {min(cell.divergence_positions)}"
    baseline = f"compared with <code>{e(cell.baseline_id)}</code>" if cell.baseline_id else "no baseline cell"
    badge = ' <span class="badge">≠ nondeterministic</span>' if cell.nondeterministic else ""
    return (
        f'<details class="cell" id="{e(_anchor(cell.cell_id))}">'
        f'<summary><span class="pill {_CLASS[cell.verdict]}">{_LABEL[cell.verdict]}</span> '
        f"<code>{e(cell.cell_id)}</code> <span class=\"muted\">{e(rate_text(cell.failures, cell.runs))} "
        f"runs failed</span>{badge}"
        f"</summary>"
        f'<div class="body"><p><b>{e(rate_text(cell.failures, cell.runs))}</b> runs failed (failure rate with '
        f"its Wilson 95 % interval); {baseline}.</p><p>Reasons: {reasons}</p>"
        f"{_unconfirmed(cell)}"
        f"{_nondeterminism(cell)}"
        f'<div class="plots">{_bars_svg("boot time per run", boot, failed, "s")}'
        f"{_latency_svg(latency, failed)}</div>"
        f'<p class="muted">Bars and whiskers in red are failed runs; × = no value{e(plot_note)}.</p>'
        f"<h4>Runs</h4>{_run_rows(cell, runs, reqs_of, excerpts)}"
        f"<h4>Sample outputs</h4>{_samples(cell, reqs_of)}"
        f"<h4>Environment ({e(cell.image)})</h4>"
        f"{_fingerprint_table([fp for fp in fingerprints if fp.image == cell.image])}"
        f"</div></details>"
    )


# --- the page ---------------------------------------------------------------------------------

_CSS = """
:root{--pass:#1f9d55;--pass-bg:#d7f5e3;--flaky:#b7791f;--flaky-bg:#fdebc8;--fail:#c53030;--fail-bg:#fcdada;
--notrun:#718096;--notrun-bg:#edf2f7;--line:#d9dee5;--muted:#5a6472}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1a202c;background:#f7f8fa}
header{background:#1a202c;color:#fff;padding:16px 28px}
header h1{margin:0 0 4px;font-size:20px}
header .meta{color:#cbd5e0;font-size:13px}header code{background:#2d3748;color:#e2e8f0}
header .overall{display:inline-block;padding:2px 10px;border-radius:4px;margin-left:8px;font-size:14px}
header .overall.pass{background:var(--pass)}header .overall.fail{background:var(--fail)}
header .overall.notrun{background:var(--notrun)}
main{padding:18px 28px;max-width:1600px}
h2{font-size:16px;margin:22px 0 8px}h4{margin:16px 0 6px;font-size:14px}
.muted{color:var(--muted)}code{font-size:12.5px;background:#edf0f4;padding:1px 4px;border-radius:3px}
.heatmap{border-collapse:separate;border-spacing:4px}
.heatmap th{font-weight:600;text-align:left;padding:4px 8px;white-space:nowrap}
.heatmap th.col{text-align:center;font-weight:600}.heatmap .platform{color:var(--muted);font-weight:400;font-size:12px}
.heatmap td.hm{width:190px;height:92px;border-radius:6px;padding:0;vertical-align:middle;text-align:center;
border:2px solid transparent}
.heatmap td.hm a{display:flex;flex-direction:column;align-items:center;justify-content:center;height:100%;
padding:8px;color:inherit;text-decoration:none}
.heatmap td.hm:hover{border-color:#1a202c}
.hm .verdict{font-weight:700;font-size:16px;letter-spacing:.04em}
.hm .count{font-size:13px}.hm .rate{font-size:11.5px;opacity:.85}
.hm .bar{display:block;width:80%;height:5px;background:rgba(0,0,0,.12);border-radius:3px;margin:4px 0}
.hm .bar span{display:block;height:100%;background:currentColor;border-radius:3px}
td.pass{background:var(--pass-bg);color:#12633a}td.flaky{background:var(--flaky-bg);color:#7a4d0b}
td.fail{background:var(--fail-bg);color:#8f1d1d}td.notrun{background:var(--notrun-bg);color:var(--notrun)}
td.empty{background:transparent;color:#a0aec0}
.badge{display:inline-block;font-size:11px;background:#553c9a;color:#fff;border-radius:3px;padding:0 5px;margin-top:3px}
.legend{display:flex;gap:16px;font-size:13px;margin:6px 0 0;flex-wrap:wrap}
.legend span.sw{display:inline-block;width:14px;height:14px;border-radius:3px;vertical-align:-2px;margin-right:4px}
.pill{display:inline-block;font-size:12px;font-weight:700;border-radius:3px;padding:0 6px;color:#fff}
.pill.pass{background:var(--pass)}.pill.flaky{background:var(--flaky)}.pill.fail{background:var(--fail)}
.pill.notrun{background:var(--notrun)}
details.cell{background:#fff;border:1px solid var(--line);border-radius:6px;margin:8px 0}
details.cell>summary{cursor:pointer;padding:8px 12px;font-size:14px}
details.cell[open]>summary{border-bottom:1px solid var(--line)}
details.cell .body{padding:4px 14px 14px}
.plots{display:flex;gap:18px;flex-wrap:wrap;margin:8px 0}
svg.plot{background:#fbfcfd;border:1px solid var(--line);border-radius:4px}
svg .pt{font-size:11px;fill:#2d3748}svg .yl{font-size:10px;fill:var(--muted);text-anchor:end}
svg .xl{font-size:10px;fill:var(--muted)}svg .xl.end{text-anchor:end}svg .axis{stroke:#a0aec0}
svg .b-pass{fill:#48bb78}svg .b-fail{fill:#e53e3e}svg .na{font-size:10px;fill:#a0aec0;text-anchor:middle}
svg .d-pass{stroke:#2b6cb0;fill:#2b6cb0}
svg.strip .d-pass{fill-opacity:.35;stroke:none}svg .med{stroke:#1a202c;stroke-width:2}
svg .d-fail{stroke:#e53e3e;fill:#e53e3e}
table.runs,table.fp,table.env{border-collapse:collapse;width:100%;font-size:13px;background:#fff}
table.runs th,table.runs td,table.fp th,table.fp td{border:1px solid var(--line);padding:4px 6px;text-align:left;
vertical-align:top}
table.runs th,table.fp th{background:#f0f2f5}
tr.r-fail td:first-child{border-left:3px solid var(--fail)}
pre{white-space:pre-wrap;word-break:break-word;margin:4px 0;font-size:12px}
pre.finding{background:#fff5f5;padding:4px 6px;border-radius:3px;max-height:220px;overflow:auto}
pre.logtext{position:relative;background:#1a202c;color:#e2e8f0;padding:6px 8px;border-radius:3px;max-height:320px;overflow:auto}
.path{font-size:11px;color:var(--muted)}
pre.logtext .ctx{color:#8792a2}pre.logtext .focus{display:block;border-top:1px dashed #f6ad55;margin-top:2px}
.sample{border:1px solid var(--line);border-radius:4px;margin:6px 0;padding:6px 8px;background:#fff}
.sample .sh{font-size:12px;color:var(--muted)}.sample pre.out{background:#f7fafc;padding:4px 6px}
.sample .ids{font:11.5px ui-monospace,monospace;color:#4a5568;word-break:break-all}
.err{color:var(--fail);font-weight:600}
.nondet{background:#faf5ff;border:1px solid #d6bcfa;border-radius:4px;padding:6px 10px;margin:6px 0}
.nondet ul{margin:4px 0;padding-left:20px}
button{font:inherit;padding:3px 10px;border:1px solid var(--line);background:#fff;border-radius:4px;cursor:pointer}
"""

# Opens the cell a heatmap link points at; without JS the links still jump to the (closed) cell.
_JS = """
(function () {
  function openCell(id) {
    var el = document.getElementById(id);
    if (el && el.tagName === 'DETAILS') { el.open = true; el.scrollIntoView({block: 'start'}); }
  }
  var links = document.querySelectorAll('#heatmap a.hm-link');
  for (var i = 0; i < links.length; i++) {
    links[i].addEventListener('click', function (ev) {
      var id = this.getAttribute('data-target');
      ev.preventDefault();
      if (history.replaceState) { history.replaceState(null, '', '#' + encodeURIComponent(id)); }
      openCell(id);
    });
  }
  function fromHash() { if (location.hash.length > 1) { openCell(decodeURIComponent(location.hash.slice(1))); } }
  window.addEventListener('hashchange', fromHash);
  fromHash();
  var toggle = document.getElementById('toggle-all');
  toggle.addEventListener('click', function () {
    var cells = document.querySelectorAll('details.cell');
    var open = toggle.getAttribute('data-open') !== '1';
    for (var j = 0; j < cells.length; j++) { cells[j].open = open; }
    toggle.setAttribute('data-open', open ? '1' : '0');
    toggle.textContent = open ? 'collapse all' : 'expand all';
  });
  // Opening a log excerpt scrolls its box to the finding rather than the context before it.
  document.addEventListener('toggle', function (ev) {
    var d = ev.target;
    if (!d.open || !d.classList || !d.classList.contains('log')) { return; }
    var pre = d.querySelector('pre.logtext'), mark = d.querySelector('.focus');
    if (pre && mark) { pre.scrollTop = Math.max(0, mark.offsetTop - 40); }  // pre is its offsetParent
  }, true);
  document.body.setAttribute('data-ready', '1');
})();
"""

_CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"


def _diagnosis_html(diagnosis: Diagnosis | None) -> str:
    if diagnosis is None or not diagnosis.cells:
        return ""
    parts = ["<h2>Diagnosis</h2>"]
    for d in diagnosis.cells:
        facts = [f"Contrast: {d.contrast}", *(f"Server log: {x}" for x in d.log_evidence),
                 *(f"Pre-flight: {x}" for x in d.preflight), *([f"Environment: {d.fingerprint}"] if d.fingerprint else [])]
        parts.append(f'<section class="diagnosis"><h3><code>{e(d.cell_id)}</code> {e(d.verdict.upper())}</h3><ul>'
                     + "".join(f"<li>{e(x)}</li>" for x in facts) + "</ul>")
        if not d.matches:
            parts.append("<p><strong>No known signature.</strong> The evidence above is all there is.</p>")
        for i, m in enumerate(d.matches):
            head = "Symptom, not the cause" if m.symptom_only else "Likely cause" if i == 0 else "Also matches"
            items = ([f"for: {x.says}" for x in m.supports] + [f"against: {x.says}" for x in m.contradicts]
                     + [f"not known: {x.says}" for x in m.unknown] + [f"why: {m.explanation}"]
                     + [f"fix {n}: {f}" for n, f in enumerate(m.fixes, 1)]
                     + ([f"confirm: {m.confirm}"] if m.confirm else [])
                     + ([f"references: {'; '.join(m.references)}"] if m.references else []))
            parts.append(f"<p><strong>{e(head)}: {e(m.title)}</strong> <code>{e(m.signature)}</code></p><ul>"
                         + "".join(f"<li>{e(x)}</li>" for x in items) + "</ul>")
        parts.append("</section>")
    return "".join(parts)


def _perf_html(summary: Summary, runs_of: dict[str, dict[int, RunRecord]],
               reqs_of: dict[str, dict[int, list[RequestRecord]]]) -> str:
    """Distributions per cell, where a reader would rather look than read: boot, weight loading,
    time to first token, inter-token latency (every sample of every run)."""
    plots = []
    for name in PLOTS:
        metric = METRICS[name]
        rows = [(c.cell_id, [v for repeat, run in sorted(runs_of.get(c.cell_id, {}).items()) if not run.interrupted
                             for v in metric.per_run(run, reqs_of.get(c.cell_id, {}).get(repeat, []))])
                for c in summary.cells]
        svg = strip_svg(f"{metric.label} ({metric.unit}), one dot per sample, tick at the median", metric.unit,
                        [(label, vs) for label, vs in rows if vs])
        if svg:
            plots.append(svg)
    if not plots:
        return ""
    return "<h2>Performance</h2>" + "".join(f"<div>{p}</div>" for p in plots)


def html_report(
    summary: Summary,
    runs: list[RunRecord],
    requests: list[RequestRecord],
    fingerprints: list[Fingerprint],
    excerpts: list[LogExcerpt],
    diagnosis: Diagnosis | None = None,
    jobs: Sequence[JobRecord] = (),
) -> str:
    runs_of: dict[str, dict[int, RunRecord]] = defaultdict(dict)
    for r in runs:
        runs_of[r.cell_id][r.repeat] = r
    reqs_of: dict[str, dict[int, list[RequestRecord]]] = defaultdict(lambda: defaultdict(list))
    for q in requests:
        reqs_of[q.cell_id][q.repeat].append(q)
    excerpts_of: dict[str, dict[int, LogExcerpt]] = defaultdict(dict)
    for x in excerpts:
        excerpts_of[x.cell_id][x.repeat] = x

    counts = {v: sum(1 for c in summary.cells if c.verdict == v) for v in _LABEL}
    overall = {0: ("all cells pass", _CLASS[Verdict.PASS]), 130: ("INTERRUPTED", _CLASS[Verdict.NOT_RUN])}.get(
        summary.exit_code, ("FAILURES", _CLASS[Verdict.FAIL]))
    duration = summary.finished_at - summary.started_at
    tally = " · ".join(f"{n} {_LABEL[v].lower()}" for v, n in counts.items() if n)
    meaning = {Verdict.PASS: "pass: no run failed", Verdict.FLAKY: "flaky: some runs failed",
               Verdict.FAIL: "fail: every run failed", Verdict.NOT_RUN: "not run"}
    legend = "".join(
        f'<span><span class="sw" style="background:var(--{_CLASS[v]}-bg);border:1px solid var(--{_CLASS[v]})"></span>'
        f"{e(t)}</span>"
        for v, t in meaning.items()
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>regbench {e(summary.config_name)} — {e(summary.run_id)}</title><style>{_CSS}</style></head><body>"
        f'<header><h1>regbench {e(summary.config_name)}<span class="overall {overall[1]}">{e(overall[0])}</span></h1>'
        f'<div class="meta">run <code>{e(summary.run_id)}</code> · {len(summary.cells)} cells: {e(tally)}'
        f"{f' · {duration:.0f} s' if duration > 0 else ''} · derived from runs.jsonl and requests.jsonl</div></header>"
        "<main><h2>Matrix</h2>"
        '<p class="muted">Each cell: verdict, failed runs of fresh servers, pass rate bar, and the Wilson 95 % '
        "interval of the failure rate. Click a cell for its runs.</p>"
        f'{heatmap(summary.cells)}<div class="legend">{legend}'
        '<span><span class="badge">≠ nondeterministic</span> outputs differ between repeats</span></div>'
        + _jobs_html(jobs)
        + '<h2>Cells <button id="toggle-all" type="button">expand all</button></h2>'
        + "".join(
            cell_details(c, runs_of.get(c.cell_id, {}), reqs_of.get(c.cell_id, {}), excerpts_of.get(c.cell_id, {}),
                         fingerprints)
            for c in summary.cells
        )
        + _perf_html(summary, runs_of, reqs_of)
        + _diagnosis_html(diagnosis)
        + f"<h2>Environments</h2>{_fingerprint_table(fingerprints)}</main>"
        f"<script>{_JS}</script></body></html>\n"
    )
