"""The files written into every results folder: summary.md, junit.xml, report.html (and log excerpts)."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pytest
from junitparser import Failure, JUnitXml, Skipped

from bench.cli import main
from bench.core.matrix import expand
from bench.core.records import Reason
from bench.core.results import plan_for
from bench.store.publish import log_excerpt, regenerate
from tests import synth

BAD = "m__runai_streamer__cpu__img"
BASE = "m__safetensors__cpu__img"
HOSTILE = "<script>alert(1)</script> & \x1b[31m\x00 \"quoted\""

SHUTDOWN_NOISE = "INFO shutting down\n" * 20
TRACEBACK = (
    "Exception ignored in: <function _ConnectionBase.__del__ at 0x7f>\n"
    "Traceback (most recent call last):\n"
    '  File "/usr/lib/python3.11/multiprocessing/connection.py", line 133, in __del__\n'
    "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte\n"
)


@pytest.fixture
def flaky_folder(tmp_path):
    """BASE passes; BAD fails on repeats 1 and 3 of 4: once the seed bug, once an exception at exit
    with hostile text in the output and the log."""
    results = synth.create(tmp_path, "run1", synth.matrix(repeats=4))
    synth.fingerprint(results, "img")
    for repeat in range(1, 5):
        synth.add_run(results, BASE, repeat)
    synth.add_run(results, BAD, 1, ids=[0] * 128, text="")
    synth.add_run(results, BAD, 2, text=HOSTILE)
    head = ("INFO booting\n" * 3000).encode()  # 39 KB before the stop request
    log = head + SHUTDOWN_NOISE.encode() + b"\xff\xfe " + HOSTILE.encode() + b"\n" + TRACEBACK.encode() + (
        b"INFO bye\n" * 2000)
    synth.add_run(results, BAD, 3, log=log, stop_at=len(head))
    synth.add_run(results, BAD, 4)
    return results


def test_summary_md_has_counts_and_intervals_per_cell(flaky_folder):
    assert main(["report", str(flaky_folder.path)]) == 1
    md = (flaky_folder.path / "summary.md").read_text()
    assert f"| `{BASE}` | **PASS** | 0/4 | 0–49 % |" in md
    assert (f"| `{BAD}` | **FLAKY** | 2/4 | 15–85 % | degenerate (1/4), divergence (1/4), empty_text (1/4), "
            "exit_exception (1/4), usage_text_mismatch (1/4), first divergence at token 0 |") in md
    summary = json.loads((flaky_folder.path / "summary.json").read_text())
    bad = next(c for c in summary["cells"] if c["cell_id"] == BAD)
    assert bad["failure_rate_interval"] == pytest.approx([0.15, 0.85], abs=0.01)
    # Repeat 1 returned other ids than the clean repeat 2: flagged, besides the verdict.
    assert [(d["repeat"], d["reference_repeat"], d["position"]) for d in bad["nondeterminism"]] == [
        (1, 2, 0), (1, 2, 0)]
    assert f"- `{BAD}`: prompt `code` differs between repeats at token 0 (1 of 4 runs)" in md


def _check_junit_schema(root: ET.Element) -> None:
    """The structure the JUnit XSD (Jenkins/windyroad, which GitHub and GitLab parsers follow)
    requires, beyond what junitparser checks itself."""
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    for attr in ("name", "tests", "failures", "errors", "skipped", "time", "timestamp", "hostname"):
        assert attr in suite.attrib, attr
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", suite.get("timestamp"))
    order = {"properties": 0, "testcase": 1, "system-out": 2, "system-err": 3}
    ranks = [order[child.tag] for child in suite]
    assert ranks == sorted(ranks)
    for case in suite.findall("testcase"):
        assert case.get("classname") and case.get("name")
        assert float(case.get("time")) >= 0
        ranks = [{"skipped": 0, "failure": 0, "error": 0, "system-out": 1, "system-err": 2}[c.tag] for c in case]
        assert ranks == sorted(ranks)
        for failure in case.findall("failure"):
            assert failure.get("message") and failure.get("type")


def test_junit_xml_parses_and_names_reasons_and_counts(flaky_folder):
    regenerate(flaky_folder.path)
    path = flaky_folder.path / "junit.xml"
    _check_junit_schema(ET.parse(path).getroot())

    xml = JUnitXml.fromfile(str(path))
    (suite,) = list(xml)
    cases = {c.name: c for c in suite}
    assert set(cases) == {f"{cell} #{n}" for cell in (BASE, BAD) for n in range(1, 5)}
    assert {c.classname for c in cases.values()} == {"m"}
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (8, 2, 0, 0)
    assert (xml.tests, xml.failures) == (8, 2)
    # The declared counts are what the testcases add up to (junitparser recounts them).
    declared = (suite.tests, suite.failures, suite.errors, suite.skipped, suite.time)
    suite.update_statistics()
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == declared[:4]
    assert suite.time == pytest.approx(declared[4], abs=0.01)

    (f1,) = cases[f"{BAD} #1"].result
    assert isinstance(f1, Failure) and f1.type == "empty_text"
    assert f1.message == "degenerate, divergence, empty_text, usage_text_mismatch (cell FLAKY: 2/4 (15–85 %) runs failed)"
    assert "code: empty text" in f1.text and "code: differs from baseline at token 0" in f1.text
    (f3,) = cases[f"{BAD} #3"].result
    assert f3.type == "exit_exception" and "UnicodeDecodeError" in f3.text
    assert "<script>alert(1)</script>" in f3.text  # escaped on the wire, intact once parsed
    assert cases[f"{BAD} #2"].is_passed and cases[f"{BASE} #1"].is_passed
    assert "nondeterministic: prompt code differs from repeat 2 at token 0" in cases[f"{BAD} #1"].system_out


def test_junit_marks_interrupted_runs_and_unrun_cells_skipped(tmp_path):
    results = synth.create(tmp_path, "r", synth.matrix(repeats=2))
    synth.add_run(results, BASE, 1)
    run = synth.add_run(results, BASE, 2)
    results.add_run(run.model_copy(update={"repeat": 3, "interrupted": True}))
    regenerate(results.path)
    xml = JUnitXml.fromfile(str(results.path / "junit.xml"))
    cases = {c.name: c for suite in xml for c in suite}
    assert isinstance(cases[f"{BASE} #3"].result[0], Skipped)
    assert isinstance(cases[BAD].result[0], Skipped)  # the cell never ran
    assert (xml.tests, xml.skipped, xml.failures) == (4, 2, 0)


def test_report_html_escapes_untrusted_text_and_embeds_the_log_excerpt(flaky_folder):
    regenerate(flaky_folder.path)
    html = (flaky_folder.path / "report.html").read_text()
    assert 'id="heatmap"' in html
    assert html.count("<script>") == 1  # ours; the model's and the log's are escaped
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "\x00" not in html and "\x1b" not in html  # control characters are parse errors in HTML
    # Self-contained: nothing is fetched when it is viewed.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "default-src 'none'" in html
    # The excerpt around the exit-time exception, not the whole 60 KB log.
    assert "UnicodeDecodeError: &#39;utf-8&#39; codec" in html
    assert "server.log around the finding (first unexpected exit-time episode, bytes" in html
    assert html.count("INFO booting") < 200
    # Per-cell details, verdicts in the heatmap, and the per-run plot.
    assert f'id="cell-{BAD}"' in html and '<span class="verdict">FLAKY</span>' in html
    assert '<span class="count">2/4 failed</span>' in html
    assert "boot time per run" in html and "request latency per run" in html
    assert "≠ nondeterministic" in html


def test_log_excerpt_is_a_few_kb_around_the_exit_episode(flaky_folder):
    run = next(r for r in flaky_folder.runs() if r.cell_id == BAD and r.repeat == 3)
    ex = log_excerpt(flaky_folder.path, run, {Reason.EXIT_EXCEPTION})
    assert ex is not None and ex.why == "first unexpected exit-time episode"
    assert len(ex.text.encode()) <= 4096
    assert "Traceback (most recent call last)" in ex.text and "UnicodeDecodeError" in ex.text
    # The focus is the episode's first line: the line before "Exception ignored in".
    assert ex.text[ex.focus :].splitlines()[1].startswith("Exception ignored in")
    assert "INFO shutting down" in ex.text[: ex.focus]
    log = (flaky_folder.path / run.server.log_path).read_bytes()
    # Offsets are exact and on line boundaries.
    assert log[ex.start_byte - 1 : ex.start_byte] == b"\n"
    assert log[ex.start_byte : ex.end_byte].decode("utf-8", errors="replace") == ex.text


def test_log_excerpt_of_a_boot_failure_is_the_end_of_the_log(tmp_path):
    results = synth.create(tmp_path, "r", synth.matrix(repeats=1))
    log = "".join(f"INFO line {i}\n" for i in range(2000)) + "OSError: no model at /models/m\n"
    run = synth.add_run(results, BASE, 1, boot_s=None, log=log, exited_early_code=1)
    ex = log_excerpt(results.path, run, {Reason.BOOT_FAILED})
    assert ex.why == "end of the log" and ex.text.endswith("OSError: no model at /models/m\n")
    assert len(ex.text) <= 4096 and ex.text.startswith("INFO line ")


def test_log_excerpt_never_reads_outside_the_results_folder(tmp_path):
    results = synth.create(tmp_path, "r", synth.matrix(repeats=1))
    (tmp_path / "secret.log").write_text("secret\n")
    run = synth.add_run(results, BASE, 1, exit_code=1)
    outside = run.model_copy(update={"server": run.server.model_copy(update={"log_path": "../secret.log"})})
    assert log_excerpt(results.path, outside, {Reason.EXIT_CODE}) is None
    assert log_excerpt(results.path, run, {Reason.EXIT_CODE}) is not None


def test_reports_are_regenerated_from_the_jsonl_alone(flaky_folder):
    regenerate(flaky_folder.path)
    first = {n: (flaky_folder.path / n).read_text() for n in ("summary.md", "junit.xml", "report.html")}
    for name in ("summary.json", "summary.md", "junit.xml", "report.html"):
        (flaky_folder.path / name).unlink()
    regenerate(flaky_folder.path)
    assert {n: (flaky_folder.path / n).read_text() for n in first} == first


def test_report_html_of_boot_failures_and_interrupted_runs(tmp_path):
    results = synth.create(tmp_path, "r", synth.matrix(repeats=2))
    synth.add_run(results, BASE, 1)
    synth.add_run(results, BASE, 2, boot_s=None, exited_early_code=1, log="INFO x\nOSError: no model <here>\n")
    run = synth.add_run(results, BAD, 1)
    results.add_run(run.model_copy(update={"repeat": 2, "interrupted": True}))
    summary = regenerate(results.path).summary
    assert [(c.verdict, c.failures, c.runs) for c in summary.cells] == [("flaky", 1, 2), ("pass", 0, 1)]
    html = (results.path / "report.html").read_text()
    assert "OSError: no model &lt;here&gt;" in html and "end of the log" in html
    assert '<span class="pill notrun">interrupted</span>' in html
    assert 'class="na">×</text>' in html  # no boot time, no latency for the failed boot


def test_a_slices_reports_judge_the_cells_it_planned_not_the_whole_matrix(tmp_path):
    results = synth.create(tmp_path, "r", synth.matrix(repeats=1))
    synth.add_run(results, BAD, 1)
    config = results.config()
    only = [c for c in expand(config) if c.id == BAD]  # as `regbench run --cell BAD` plans it
    results.write_plan(plan_for("r", config, only, 0.0))
    # The baseline cell is not in the slice: no divergence to judge, and no "not run" row for it.
    assert [c.cell_id for c in regenerate(results.path).summary.cells] == [BAD]
