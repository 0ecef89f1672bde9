"""report.html in a real browser: headless Chromium (Debian package `chromium`, installed by
scripts/setup.sh) loads it from disk, runs its script, and must log no console error."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import pytest

from bench.store.publish import regenerate
from tests import synth

from .support import needs_program

IMAGES = ("streamer-0.16.0", "streamer-0.17.0")
FLAKY = "m__runai_streamer__cpu__streamer-0.16.0"


def chromium(url: str, out_dir: Path) -> tuple[str, str, bytes]:
    """(DOM after scripts ran, Chromium's log, PNG screenshot) of one page load."""
    exe = shutil.which("chromium")
    assert exe, "chromium is not installed: run scripts/setup.sh (apt-get install -y chromium)"
    png = out_dir / "shot.png"
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
             "--dump-dom", f"--screenshot={png}", "--window-size=1400,1000", url],
            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, proc.stderr, png.read_bytes()


def console_errors(log: str) -> list[str]:
    # Chromium logs every console message and uncaught exception of the page as INFO:CONSOLE.
    return [line for line in log.splitlines() if "CONSOLE" in line or "Uncaught" in line]


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def report(tmp_path) -> Path:
    """The seed bug as 8 fresh starts: 7 fail, 1 passes, under streamer 0.16.0; all pass under 0.17.0."""
    results = synth.create(tmp_path, "run", synth.matrix(images=IMAGES, repeats=8))
    for image in IMAGES:
        synth.fingerprint(results, image, runai_model_streamer=image.split("-")[1])
        for repeat in range(1, 9):
            synth.add_run(results, f"m__safetensors__cpu__{image}", repeat)
            cell = f"m__runai_streamer__cpu__{image}"
            if image == IMAGES[0] and repeat != 5:
                log = "INFO up\nINFO stop\nTraceback (most recent call last):\nRuntimeError: <b>boom</b>\n"
                synth.add_run(results, cell, repeat, ids=[0] * 128, text="</pre><script>alert(1)</script>",
                              log=log, stop_at=8)  # a degenerate answer, an exception at exit
            else:
                synth.add_run(results, cell, repeat)
    regenerate(results.path)
    return results.path / "report.html"


@needs_program("chromium")
def test_report_renders_the_heatmap_without_console_errors(report, tmp_path):
    dom, log, png = chromium(report.as_uri() + f"#cell-{FLAKY}", tmp_path)
    assert console_errors(log) == []
    assert re.search(r'<body[^>]* data-ready="1"', dom), "the page script did not run to its end"
    heatmap = re.search(r'<table id="heatmap".*?</table>', dom, re.S).group(0)
    cells = re.findall(r'<td class="hm (\w+)"', heatmap)
    assert sorted(cells) == ["flaky", "pass", "pass", "pass"]
    assert '<span class="count">7/8 failed</span>' in heatmap
    # The link in the URL opened that cell's details; the others stay closed.
    assert re.search(rf'<details class="cell" id="cell-{FLAKY}" open="">', dom)
    assert len(re.findall(r'<details class="cell"[^>]* open=""', dom)) == 1
    # The model's output stayed text: no element was injected by it.
    assert "alert(1)" in dom and "<script>alert(1)" not in dom
    assert png_size(png) == (1400, 1000)


@needs_program("chromium")
def test_the_console_check_catches_errors(tmp_path):
    page = tmp_path / "bad.html"
    page.write_text('<!DOCTYPE html><html><body><script>console.error("x"); nope();</script></body></html>')
    _, log, _ = chromium(page.as_uri(), tmp_path)
    assert len(console_errors(log)) == 2
