"""The history's trend page (`regbench history --html FILE`): one self-contained page, per cell its
verdict in every run and, per performance metric, its median in every run, one point a run by
start time (or, with --by image|vllm, one point per run and image of a series, evenly spaced in
release order); the breaks and the slowdowns marked. Pure: a `Trend` in, text out.

It is report.html's kin, made the same way: the same Jinja environment (autoescaped), stylesheet
and script, inlined; the same element builder for the SVG (bench.report.svg.el), which escapes
every value. Run ids, image names and versions come from results folders: untrusted text.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from markupsafe import Markup

from bench.core.perf import METRICS, fmt
from bench.core.records import Record
from bench.core.verdicts import Verdict
from bench.history.model import ORDER_TEXT, CellHistory, CellPoint

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
    by: str = "time"  # the order of each cell's points (bench.history.model.ORDERS)


W, LEFT, RIGHT = 760, 72, 24
VERDICT_H, METRIC_H, TOP, BOTTOM = 64, 150, 24, 20


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def _f(value: float) -> str:
    return f"{value:.1f}"


def _key(p: CellPoint) -> tuple[str, str]:
    # A run holds one point per image of a series: the run id alone does not name a point.
    return (p.run_id, p.image)


@dataclass(frozen=True)
class Axis:
    """A point to x, shared by a cell's plots so that one point sits at one x in each: by start
    time in time order; out of it, by rank, since releases have no distance between them."""

    t0: float
    t1: float
    ranks: dict[tuple[str, str], int] | None = None  # out of time order: each point's place
    first: str = ""  # the axis's end labels out of time order
    last: str = ""

    def at(self, t: float) -> float:
        if self.t1 <= self.t0:
            return LEFT + (W - LEFT - RIGHT) / 2
        return LEFT + (W - LEFT - RIGHT) * (t - self.t0) / (self.t1 - self.t0)

    def x(self, p: CellPoint) -> float:
        return self.at(self.ranks[_key(p)] if self.ranks is not None else p.started_at)

    def labels(self) -> tuple[str, str]:
        if self.ranks is not None:
            return self.first, self.last
        return _when(self.t0), _when(self.t1)


def _axis(h: CellHistory) -> Axis:
    if h.by != "time":
        ranks = {_key(p): i for i, p in enumerate(h.points)}
        ends = [_short(h.points[0], h.by), _short(h.points[-1], h.by)] if h.points else ["", ""]
        return Axis(0.0, float(max(len(h.points) - 1, 0)), ranks, *ends)
    times = [p.started_at for p in h.points]
    return Axis(min(times, default=0.0), max(times, default=0.0))


def _short(p: CellPoint, by: str) -> str:
    """An axis end out of time order: what the order is by."""
    return f"vLLM {p.vllm or '?'}" if by == "vllm" else p.image


def _frame(title: str, height: int, axis: Axis, marks: list[Markup], *, cls: str, y_labels: list[Markup]) -> Markup:
    parts = [el("text", title, x=6, y=14, class_="pt"),
             el("line", x1=LEFT, y1=height - BOTTOM, x2=W - RIGHT, y2=height - BOTTOM, class_="axis"),
             *y_labels,
             el("text", axis.labels()[0], x=LEFT, y=height - 5, class_="xl"),
             *([el("text", axis.labels()[1], x=W - RIGHT, y=height - 5, class_="xl end")] if axis.t1 > axis.t0 else []),
             *marks]
    return el("svg", *parts, class_=f"plot {cls}", viewBox=f"0 0 {W} {height}", width=W, height=height, role="img",
              aria_label=title)


def _break_marks(h: CellHistory, axis: Axis, height: int) -> list[Markup]:
    """A dashed red line where the cell broke, a green one where it passed again."""
    at = {_key(p): p for p in h.points}
    image = h.points[0].image if h.points else ""  # in time order every point's
    marks = []
    for r in h.regressions:
        bad = at[(r.first_bad, r.first_bad_image or image)]
        x = _f(axis.x(bad))
        marks.append(el("line", el("title", f"broke in {h.name(bad)}: {r.text()}"), x1=x, x2=x, y1=TOP - 6,
                        y2=height - BOTTOM, class_="break", data_run=r.first_bad, **_image_attr(h, bad)))
        if r.fixed_in is not None:
            fixed = at[(r.fixed_in, r.fixed_in_image or image)]
            x = _f(axis.x(fixed))
            marks.append(el("line", el("title", f"passes again from {h.name(fixed)}"), x1=x, x2=x, y1=TOP - 6,
                            y2=height - BOTTOM, class_="fixed", data_run=r.fixed_in, **_image_attr(h, fixed)))
    return marks


def _image_attr(h: CellHistory, p: CellPoint) -> dict[str, str]:
    """Out of time order a mark names its point's image beside its run (data-image)."""
    return {"data_image": p.image} if h.by != "time" else {}


def _describe(p: CellPoint, by: str = "time") -> str:
    versions = ", ".join(f"{k} {v}" for k, v in (("vLLM", p.vllm), ("streamer", p.runai_model_streamer),
                                                  ("torch", p.torch)) if v)
    run = p.run_id if by == "time" else f"image {p.image} · run {p.run_id}"
    return f"{run} · {_when(p.started_at)} · {LABEL[p.verdict]} {p.rate()}" + (f" · {versions}" if versions else "")


def verdict_plot(h: CellHistory) -> Markup:
    """One dot per run, coloured by the cell's verdict in it."""
    axis = _axis(h)
    y = _f(TOP + (VERDICT_H - TOP - BOTTOM) / 2)
    dots = [el("circle", el("title", _describe(p, h.by)), cx=_f(axis.x(p)), cy=y, r=5,
               class_=f"v v-{CLASS[p.verdict]}", data_run=p.run_id, **_image_attr(h, p)) for p in h.points]
    title = "verdict per run" if h.by == "time" else "verdict per run and image"
    return _frame(title, VERDICT_H, axis, [*_break_marks(h, axis, VERDICT_H), *dots], cls="verdicts", y_labels=[])


def metric_plot(h: CellHistory, metric: str) -> Markup:
    """One dot per run that measured the metric: the cell's median over its fresh servers that
    run, joined by a line; a run flagged slower than its window is ringed."""
    m = METRICS[metric]
    axis = _axis(h)
    image = h.points[0].image if h.points else ""
    slow = {(s.run_id, s.image or image): s for s in h.slowdowns if s.check.metric == metric}
    points = [(p, p.perf[metric]) for p in h.points if metric in p.perf]
    vmax = max((v for _, v in points), default=0.0) or 1.0
    scale = (METRIC_H - TOP - BOTTOM) / vmax

    def xy(p: CellPoint, v: float) -> tuple[str, str]:
        return _f(axis.x(p)), _f(METRIC_H - BOTTOM - v * scale)

    marks = _break_marks(h, axis, METRIC_H)
    if len(points) > 1:
        marks.append(el("polyline", points=" ".join(",".join(xy(p, v)) for p, v in points), class_="trendline"))
    for p, v in points:
        x, y = xy(p, v)
        servers = len(p.values.get(metric, [])) or None
        run = p.run_id if h.by == "time" else f"image {p.image} · run {p.run_id}"
        title = f"{run} · {_when(p.started_at)}: median {fmt(v, m.unit)}" + (
            f" over {servers} fresh servers" if servers else "")
        flagged = slow.get(_key(p))
        if flagged is not None:
            title += f" · {flagged.check.text()}"
            marks.append(el("circle", cx=x, cy=y, r=8, class_="ring"))
        marks.append(el("circle", el("title", title), cx=x, cy=y, r=4,
                        class_=f"m v-{CLASS[p.verdict]}" + (" slow" if flagged is not None else ""), data_run=p.run_id,
                        **_image_attr(h, p)))
    y_labels = [el("text", fmt(vmax, m.unit), x=LEFT - 4, y=TOP + 4, class_="yl"),
                el("text", "0", x=LEFT - 4, y=METRIC_H - BOTTOM, class_="yl")]
    per = "run" if h.by == "time" else "run and image"
    return _frame(f"{m.label} ({m.unit}): median per {per}", METRIC_H, axis, marks, cls="metric",
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
        order=ORDER_TEXT[trend.by],
        runs=len({p.run_id for h in trend.cells for p in h.points}),
        breaks=sum(len(h.regressions) for h in trend.cells), slowed=sum(len(h.slowdowns) for h in trend.cells))
    return tidy_html(page) + "\n"
