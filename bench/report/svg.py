"""The SVG plots of report.html, every one drawn with the same kit: one element builder, one
frame, one escaper (markupsafe's, the one the page templates autoescape with). Pure: numbers
in, markup out; the templates place the result as it is.

Per run of a cell: boot time as bars, request latency as whiskers (min–median–max). Per cell
of the run: strip plots of a metric's samples, one row per cell, a tick at the median.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from markupsafe import Markup, escape

from bench.core.perf import fmt


def el(name: str, *children: object, **attrs: object) -> Markup:
    """<name attrs>children</name>, or <name attrs/> with no children. Text children and
    attribute values are escaped, Markup children (other elements) are not. Attribute names
    are Python keywords: a trailing _ is dropped (class_), other _ become - (aria_label)."""
    head = Markup("").join(
        Markup(' {}="{}"').format(Markup(k.rstrip("_").replace("_", "-")), v) for k, v in attrs.items())
    if not children:
        return Markup("<{}{}/>").format(Markup(name), head)
    return Markup("<{0}{1}>{2}</{0}>").format(Markup(name), head, Markup("").join(escape(c) for c in children))


def _f(value: float) -> str:
    return f"{value:.1f}"


def _svg(cls: str, w: int, h: int, title: str, parts: Iterable[Markup]) -> Markup:
    return el("svg", el("text", title, x=6, y=14, class_="pt"), *parts,
              class_=cls, viewBox=f"0 0 {w} {h}", width=w, height=h, role="img", aria_label=title)


def _top(values: Iterable[float]) -> float:
    """The top of a y axis from 0: the largest value, or 1 when there is nothing above 0 to show."""
    vmax = max(values, default=0.0)
    return vmax if vmax > 0 else 1.0


# --- per run of one cell ----------------------------------------------------------------------

W, H, LEFT, BOTTOM, TOP = 360, 140, 40, 18, 26


def _per_run(title: str, unit: str, vmax: float, repeats: list[int], marks: list[Markup]) -> Markup:
    """The frame both per-run plots share: x axis, y range, the first and last repeat under the axis."""
    parts = [el("line", x1=LEFT, y1=H - BOTTOM, x2=W - 4, y2=H - BOTTOM, class_="axis"),
             el("text", f"{vmax:.3g}{unit}", x=LEFT - 4, y=TOP + 4, class_="yl"),
             el("text", "0", x=LEFT - 4, y=H - BOTTOM, class_="yl"), *marks]
    if repeats:
        parts += [el("text", f"#{repeats[0]}", x=LEFT, y=H - 4, class_="xl"),
                  el("text", f"#{repeats[-1]}", x=W - 4, y=H - 4, class_="xl end")]
    return _svg("plot", W, H, title, parts)


def _no_value(x: float) -> Markup:
    return el("text", "×", x=_f(x), y=H - BOTTOM - 3, class_="na")


def run_bars(title: str, points: list[tuple[int, float | None]], failed: set[int], unit: str) -> Markup:
    """A bar per run (red when the run failed), × where the run has no value."""
    vmax = _top(v for _, v in points if v is not None)
    step = (W - LEFT - 6) / max(len(points), 1)
    bw = max(step * 0.7, 1.0)
    marks = []
    for i, (repeat, v) in enumerate(points):
        x = LEFT + i * step + (step - bw) / 2
        if v is None:
            marks.append(_no_value(x + bw / 2))
            continue
        bh = (H - BOTTOM - TOP) * v / vmax
        marks.append(el("rect", el("title", f"#{repeat}: {v:.2f}{unit}"), x=_f(x), y=_f(H - BOTTOM - bh),
                        width=_f(bw), height=_f(bh), class_="b-fail" if repeat in failed else "b-pass"))
    return _per_run(title, unit, vmax, [r for r, _ in points], marks)


def run_whiskers(title: str, points: list[tuple[int, list[float]]], failed: set[int], unit: str) -> Markup:
    """Per run: a whisker from the smallest to the largest sample, a dot at the median."""
    vmax = _top(v for _, vs in points for v in vs)
    step = (W - LEFT - 6) / max(len(points), 1)
    scale = (H - BOTTOM - TOP) / vmax
    marks = []
    for i, (repeat, vs) in enumerate(points):
        x = LEFT + i * step + step / 2
        if not vs:
            marks.append(_no_value(x))
            continue
        lo, med, hi = min(vs), statistics.median(vs), max(vs)
        marks.append(el(
            "g",
            el("title", f"#{repeat}: {len(vs)} requests, min {lo:.2f} {unit}, median {med:.2f} {unit}, "
                        f"max {hi:.2f} {unit}"),
            el("line", x1=_f(x), x2=_f(x), y1=_f(H - BOTTOM - lo * scale), y2=_f(H - BOTTOM - hi * scale)),
            el("circle", cx=_f(x), cy=_f(H - BOTTOM - med * scale), r=_f(min(3.0, max(step / 3, 1.0)))),
            class_="d-fail" if repeat in failed else "d-pass"))
    return _per_run(title, unit, vmax, [r for r, _ in points], marks)


# --- per cell of a run ------------------------------------------------------------------------


def strip(title: str, unit: str, rows: list[tuple[str, list[float]]], labels: list[str]) -> Markup:
    """One row per cell (its label shown, its full name as the label's tooltip), a dot per sample
    on a shared axis from 0 to the largest value, and a tick at each row's median. Empty: no sample."""
    values = [v for _, vs in rows for v in vs]
    if not values:
        return Markup("")
    vmax = max(values) or 1.0
    w, left, right, row_h, top = 760, 300, 16, 18, 24
    h = top + row_h * len(rows) + 18
    span = w - left - right
    parts = [el("line", x1=left, y1=h - 16, x2=w - right, y2=h - 16, class_="axis"),
             el("text", "0", x=left, y=h - 3, class_="xl"),
             el("text", fmt(vmax, unit), x=w - right, y=h - 3, class_="xl end")]
    for i, ((label, vs), short) in enumerate(zip(rows, labels, strict=True)):
        y = top + i * row_h + row_h / 2
        parts.append(el("text", el("title", label), short, x=left - 6, y=_f(y + 4), class_="yl"))
        step = max(1, len(vs) // 400)  # a few hundred dots per row is enough to see a distribution
        parts += [el("circle", cx=_f(left + span * v / vmax), cy=_f(y), r=2, class_="d-pass") for v in sorted(vs)[::step]]
        if vs:
            med = sorted(vs)[len(vs) // 2]
            x = left + span * med / vmax
            parts.append(el("line", el("title", f"{label}: median {fmt(med, unit)}, {len(vs)} samples"),
                            x1=_f(x), x2=_f(x), y1=_f(y - 6), y2=_f(y + 6), class_="med"))
    return _svg("plot strip", w, h, title, parts)
