"""The history's trend page (`regbench history --html FILE`): one self-contained page, per cell its
verdict in every run and, per performance metric, its median in every run, one point a run by
start time; the breaks and the slowdowns marked. Pure: a `Trend` in, text out.

It is report.html's kin, made the same way: the same Jinja environment (autoescaped), stylesheet
and script, inlined; the same element builder for the SVG (bench.report.svg.el), which escapes
every value. Run ids, image names and versions come from results folders: untrusted text.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from markupsafe import Markup

from bench.core.history import CellHistory, CellPoint
from bench.core.perf import METRICS, fmt
from bench.core.records import Record
from bench.core.verdicts import Verdict

# report.html's environment, stylesheet, script and cleaner: one setup for both pages.
from bench.report.html import CLASS, LABEL, MEANING, PAGE_CSS, PAGE_JS, TEMPLATES, tidy_html
from bench.report.svg import el


class Trend(Record):
    """What the page shows: the cells of a history as `regbench history` reads them."""

    database: str  # the URL, password masked
    schema_version: int
    window: int  # good runs each run's performance was compared with
    # Every metric's slowdown threshold in effect, when --threshold changed one; None: the defaults.
    thresholds: dict[str, float] | None = None
    cells: list[CellHistory]
    generated_at: float


W, LEFT, RIGHT = 760, 72, 24
VERDICT_H, METRIC_H, TOP, BOTTOM = 64, 150, 24, 20


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def _f(value: float) -> str:
    return f"{value:.1f}"


@dataclass(frozen=True)
class Axis:
    """Start time to x, shared by a cell's plots so that one run sits at one x in each."""

    t0: float
    t1: float

    def x(self, t: float) -> float:
        if self.t1 <= self.t0:
            return LEFT + (W - LEFT - RIGHT) / 2
        return LEFT + (W - LEFT - RIGHT) * (t - self.t0) / (self.t1 - self.t0)


def _axis(h: CellHistory) -> Axis:
    times = [p.started_at for p in h.points]
    return Axis(min(times, default=0.0), max(times, default=0.0))


def _frame(title: str, height: int, axis: Axis, marks: list[Markup], *, cls: str, y_labels: list[Markup]) -> Markup:
    parts = [el("text", title, x=6, y=14, class_="pt"),
             el("line", x1=LEFT, y1=height - BOTTOM, x2=W - RIGHT, y2=height - BOTTOM, class_="axis"),
             *y_labels,
             el("text", _when(axis.t0), x=LEFT, y=height - 5, class_="xl"),
             *([el("text", _when(axis.t1), x=W - RIGHT, y=height - 5, class_="xl end")] if axis.t1 > axis.t0 else []),
             *marks]
    return el("svg", *parts, class_=f"plot {cls}", viewBox=f"0 0 {W} {height}", width=W, height=height, role="img",
              aria_label=title)


def _break_marks(h: CellHistory, axis: Axis, height: int) -> list[Markup]:
    """A dashed red line where the cell broke, a green one where it passed again."""
    at = {p.run_id: p for p in h.points}
    marks = []
    for r in h.regressions:
        x = _f(axis.x(at[r.first_bad].started_at))
        marks.append(el("line", el("title", f"broke in {r.first_bad}: {r.text()}"), x1=x, x2=x, y1=TOP - 6,
                        y2=height - BOTTOM, class_="break", data_run=r.first_bad))
        if r.fixed_in is not None:
            x = _f(axis.x(at[r.fixed_in].started_at))
            marks.append(el("line", el("title", f"passes again from {r.fixed_in}"), x1=x, x2=x, y1=TOP - 6,
                            y2=height - BOTTOM, class_="fixed", data_run=r.fixed_in))
    return marks


def _describe(p: CellPoint) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in (("vLLM", p.vllm), ("streamer", p.runai_model_streamer),
                                                  ("torch", p.torch)) if v)
    return f"{p.run_id} · {_when(p.started_at)} · {LABEL[p.verdict]} {p.rate()}" + (f" · {versions}" if versions else "")


def verdict_plot(h: CellHistory) -> Markup:
    """One dot per run, coloured by the cell's verdict in it."""
    axis = _axis(h)
    y = _f(TOP + (VERDICT_H - TOP - BOTTOM) / 2)
    dots = [el("circle", el("title", _describe(p)), cx=_f(axis.x(p.started_at)), cy=y, r=5,
               class_=f"v v-{CLASS[p.verdict]}", data_run=p.run_id) for p in h.points]
    return _frame("verdict per run", VERDICT_H, axis, [*_break_marks(h, axis, VERDICT_H), *dots], cls="verdicts",
                  y_labels=[])


def metric_plot(h: CellHistory, metric: str) -> Markup:
    """One dot per run that measured the metric: the cell's median over its fresh servers that
    run, joined by a line; a run flagged slower than its window is ringed."""
    m = METRICS[metric]
    axis = _axis(h)
    slow = {s.run_id: s for s in h.slowdowns if s.check.metric == metric}
    points = [(p, p.perf[metric]) for p in h.points if metric in p.perf]
    vmax = max((v for _, v in points), default=0.0) or 1.0
    scale = (METRIC_H - TOP - BOTTOM) / vmax

    def xy(p: CellPoint, v: float) -> tuple[str, str]:
        return _f(axis.x(p.started_at)), _f(METRIC_H - BOTTOM - v * scale)

    marks = _break_marks(h, axis, METRIC_H)
    if len(points) > 1:
        marks.append(el("polyline", points=" ".join(",".join(xy(p, v)) for p, v in points), class_="trendline"))
    for p, v in points:
        x, y = xy(p, v)
        servers = len(p.values.get(metric, [])) or None
        title = f"{p.run_id} · {_when(p.started_at)}: median {fmt(v, m.unit)}" + (
            f" over {servers} fresh servers" if servers else "")
        if p.run_id in slow:
            title += f" · {slow[p.run_id].check.text()}"
            marks.append(el("circle", cx=x, cy=y, r=8, class_="ring"))
        marks.append(el("circle", el("title", title), cx=x, cy=y, r=4,
                        class_=f"m v-{CLASS[p.verdict]}" + (" slow" if p.run_id in slow else ""), data_run=p.run_id))
    y_labels = [el("text", fmt(vmax, m.unit), x=LEFT - 4, y=TOP + 4, class_="yl"),
                el("text", "0", x=LEFT - 4, y=METRIC_H - BOTTOM, class_="yl")]
    return _frame(f"{m.label} ({m.unit}): median per run", METRIC_H, axis, marks, cls="metric",
                  y_labels=y_labels)


def metrics_of(h: CellHistory) -> list[str]:
    """The metrics some run of the cell measured, in METRICS' order."""
    return [name for name in METRICS if any(name in p.perf for p in h.points)]


def _open(h: CellHistory) -> bool:
    return bool(h.regressions or h.slowdowns)


def render_trend(trend: Trend) -> str:
    """The page: markup only; every figure comes from the trend and the plots above."""
    page = TEMPLATES.get_template("trend.html.j2").render(
        t=trend, css=PAGE_CSS, js=PAGE_JS, when=_when, verdict_plot=verdict_plot, metric_plot=metric_plot,
        metrics_of=metrics_of, is_open=_open, CLASS=CLASS, LABEL=LABEL, MEANING=MEANING, Verdict=Verdict, METRICS=METRICS,
        runs=len({p.run_id for h in trend.cells for p in h.points}),
        breaks=sum(len(h.regressions) for h in trend.cells), slowed=sum(len(h.slowdowns) for h in trend.cells))
    return tidy_html(page) + "\n"
