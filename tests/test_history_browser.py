"""The history's trend page (`regbench history --html`) in a real browser, as report.html is
checked: headless Chromium loads it from disk, runs its script, and must log no console error;
what it rendered is read back from the DOM."""

from __future__ import annotations

import re

from bench.cli import main as regbench
from tests import synth

from .support import needs_program
from .test_history import STREAMER_CELL, started
from .test_report_browser import chromium, console_errors, png_size

RUNS = ["n1", "n2", "n3", "n4", "n5"]


def _plot(dom: str, cell_id: str, cls: str, title: str = "") -> str:
    """The SVG of one plot of one cell's section."""
    section = re.search(rf'<details class="cell trend" id="cell-{re.escape(cell_id)}".*?</details>', dom, re.S).group(0)
    found = [svg for svg in re.findall(r"<svg .*?</svg>", section, re.S)
             if f'class="plot {cls}"' in svg and title in svg]
    assert len(found) == 1, (cls, title, len(found))
    return found[0]


@needs_program("chromium")
def test_trend_page_marks_the_break_and_the_slowdown(tmp_path, capsys):
    root = tmp_path / "results"
    # Two good nights, the streamer bug, a night slowed by half, a good night: n1..n5 by start time.
    started(synth.timed(root, "n1"), 1_000_000)
    started(synth.timed(root, "n2"), 1_086_400)
    started(synth.streamer_bug(root, "n3"), 1_172_800)
    started(synth.timed(root, "n4", slower=1.5), 1_259_200)
    started(synth.timed(root, "n5"), 1_345_600)
    assert regbench(["history", "ingest", *(str(root / r) for r in RUNS)]) == 0
    page = tmp_path / "out" / "trend.html"
    assert regbench(["history", "--results", str(root), "--html", str(page)]) == 0
    assert page.is_file() and "trend page:" in capsys.readouterr().err

    dom, log, png = chromium(page.as_uri() + f"#cell-{STREAMER_CELL}", tmp_path)
    assert console_errors(log) == []
    assert re.search(r'<body[^>]* data-ready="1"', dom), "the page script did not run to its end"
    assert png_size(png) == (1400, 1000)

    # One verdict dot per run ingested, in start order, coloured by the cell's verdict.
    verdicts = _plot(dom, STREAMER_CELL, "verdicts")
    assert re.findall(r'class="v v-(\w+)" data-run="([^"]+)"', verdicts) == [
        ("pass", "n1"), ("pass", "n2"), ("fail", "n3"), ("pass", "n4"), ("pass", "n5")]
    # The break where it broke and where it passed again, on the verdicts and on every metric plot.
    assert re.findall(r'class="break" data-run="([^"]+)"', verdicts) == ["n3"]
    assert re.findall(r'class="fixed" data-run="([^"]+)"', verdicts) == ["n4"]

    # Latency: every run measured it (synth.streamer_bug's servers too), one point each.
    latency = _plot(dom, STREAMER_CELL, "metric", "latency (s)")
    assert re.findall(r'class="m v-\w+(?: slow)?" data-run="([^"]+)"', latency) == RUNS
    assert re.findall(r'class="m v-\w+ slow" data-run="([^"]+)"', latency) == ["n4"]
    assert latency.count('class="ring"') == 1 and 'class="break" data-run="n3"' in latency
    # Boot time: only the timed runs carry a RunPerf (the streamer-bug night has none).
    boot = _plot(dom, STREAMER_CELL, "metric", "boot (s)")
    assert re.findall(r'class="m v-\w+(?: slow)?" data-run="([^"]+)"', boot) == ["n1", "n2", "n4", "n5"]

    # The break's bisect and the slowdowns are listed under the verdicts.
    assert re.search(r'<li class="break-line" data-run="n3">first FAIL in n3, last good n2', dom)
    assert "--streamer 0.16.0..0.17.0 --good 0.17.0 --bad 0.16.0" in dom
    slow = re.findall(r'<li class="slow-line" data-run="(\w+)" data-metric="(\w+)"', dom)
    assert {run for run, _ in slow} == {"n4"}
    assert {"boot_s", "latency_s", "throughput_tok_s"} <= {m for _, m in slow}
    # The cell named in the URL is open (it has a break anyway).
    assert re.search(rf'<details class="cell trend" id="cell-{STREAMER_CELL}" open="">', dom)


def test_trend_page_escapes_what_comes_from_the_folders(tmp_path):
    """Run ids are folder names: text on the page, never markup."""
    from bench.core.verdicts import Verdict
    from bench.history.model import CellHistory, CellPoint
    from bench.history.trend import Trend, render_trend

    bad = '<script>alert(1)</script>'
    point = CellPoint(run_id=bad, started_at=1.0, image="img", vllm=None, runai_model_streamer=None, torch=None,
                      image_digest=None, verdict=Verdict.PASS, failures=0, runs=1, interval=None, reasons={},
                      signature=None, perf={"boot_s": 1.0})
    page = render_trend(Trend(database="sqlite:///x", schema_version=2, window=5, generated_at=0.0,
                              cells=[CellHistory(cell_id=f"c{bad}", points=[point], regressions=[])]))
    assert bad not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


@needs_program("chromium")
def test_trend_page_by_vllm_shows_the_points_in_release_order(tmp_path, capsys):
    """--by vllm: one series per cell without its image, its points in the order of their vLLM
    versions (neither the image names' order nor the matrix's), left to right, each named by run
    and image; the header says so, and the break sits on the release that broke."""
    root = tmp_path / "results"
    # Image names that sort unlike their releases: only the fingerprints' versions give the order.
    images = {"b-img": "0.31.0", "c-img": "0.9.0", "a-img": "0.32.0", "d-img": "0.10.0"}
    started(synth.releases(root, "rel", images, failing=("a-img",)), 1_000_000)
    assert regbench(["history", "ingest", str(root / "rel")]) == 0
    page = tmp_path / "trend.html"
    assert regbench(["history", "--results", str(root), "--by", "vllm", "--html", str(page)]) == 0

    series = "m__runai_streamer__cpu__*"
    dom, log, _ = chromium(page.as_uri(), tmp_path)
    assert console_errors(log) == []
    assert re.search(r'<body[^>]* data-ready="1"', dom), "the page script did not run to its end"
    assert re.search(r'<span class="order" data-by="vllm">ordered by vLLM version', dom)
    verdicts = _plot(dom, series, "verdicts")
    dots = re.findall(r'<circle cx="([\d.]+)"[^>]*class="v v-(\w+)" data-run="rel" data-image="([^"]+)"', verdicts)
    assert [(verdict, image) for _, verdict, image in dots] == [
        ("pass", "c-img"), ("pass", "d-img"), ("pass", "b-img"), ("fail", "a-img")]
    xs = [float(x) for x, _, _ in dots]
    assert xs == sorted(xs) and len(set(xs)) == 4
    assert re.findall(r'class="break" data-run="rel" data-image="([^"]+)"', verdicts) == ["a-img"]
    assert re.search(r"<title>image a-img · run rel · ", verdicts)
    latency = _plot(dom, series, "metric", "latency (s)")
    assert re.findall(r'class="m v-\w+" data-run="rel" data-image="([^"]+)"', latency) == ["c-img", "d-img", "b-img", "a-img"]
    assert re.search(r'<li class="break-line" data-run="rel" data-image="a-img">first FAIL in vLLM 0.32.0 \(image a-img, '
                     r'run rel\), last good vLLM 0.31.0 \(image b-img, run rel\)', dom)
