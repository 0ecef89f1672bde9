"""JUnit XML of a summary, for CI test-report parsers (GitHub, GitLab, Jenkins). Pure.

Shape: one <testsuite>; one <testcase> per run, classname = the model, name = "<cell id> #<repeat>"
(flat run-level testcases are what every parser reads; nested testcases are not portable).
A failed run has one <failure> whose message names its reasons and its cell's counts; an
interrupted run is <skipped>; a cell without any run gets one skipped testcase named by its id.
Everything judged is a <failure>, never an <error>: the bench itself did not break.
"""

from __future__ import annotations

import re
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict

from bench.core.records import CellSummary, Finding, Reason, RunRecord, RunResult, Summary, TokenDiff
from bench.core.stats import rate_text

# XML 1.0 cannot carry these at all, escaped or not; server logs and model outputs contain them.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
DETAIL_MAX_CHARS = 4000


def xml_text(value: object) -> str:
    return _NOT_XML.sub("\ufffd", str(value))


def _el(parent: ET.Element, tag: str, text: str | None = None, **attrs: object) -> ET.Element:
    el = ET.SubElement(parent, tag, {k: xml_text(v) for k, v in attrs.items()})
    if text is not None:
        el.text = xml_text(text)
    return el


def _seconds(run: RunRecord) -> float:
    s = run.server
    return sum(x for x in (s.boot_s, run.requests_s, s.shutdown_s) if x is not None)


def _cell_line(cell: CellSummary) -> str:
    return f"cell {cell.verdict.upper()}: {rate_text(cell.failures, cell.runs)} runs failed"


def _failure_text(result: RunResult, findings: list[Finding]) -> str:
    lines = [f"{f.reason}: {f.detail}" for f in findings]
    lines += [
        f"divergence: {d.prompt_id}: differs from baseline at token {d.position}" for d in result.divergence
    ]
    text = "\n".join(lines)
    return text if len(text) <= DETAIL_MAX_CHARS else text[:DETAIL_MAX_CHARS] + "\n… (truncated; see runs.jsonl)"


def _judged(case: ET.Element, cell: CellSummary, run: RunRecord, result: RunResult | None) -> str | None:
    """The testcase's <skipped> or <failure>, if it has one: returns which count it adds to."""
    if run.interrupted or result is None:
        _el(case, "skipped", message="interrupted: not judged")
        return "skipped"
    if result.not_runnable:
        why = next((f.detail for f in result.findings if f.reason == Reason.NOT_RUNNABLE), "")
        _el(case, "skipped", message=f"not runnable on this host: no server was started ({why})")
        return "skipped"
    if result.failed:
        message = f"{', '.join(result.reasons)} ({_cell_line(cell)})"
        # type: the run's own first finding; divergence is only its comparison with the baseline.
        own = result.beside_divergence
        kind = own[0].reason if own else result.reasons[0]
        _el(case, "failure", _failure_text(result, own), message=message, type=kind)
        return "failures"
    return None


def _system_out(case: ET.Element, run: RunRecord, nondet: dict[int, TokenDiff]) -> None:
    out = [f"server log: {run.server.log_path}"]
    if run.server.boot_s is not None:
        out.append(f"boot: {run.server.boot_s:.1f} s")
    if run.repeat in nondet:
        d = nondet[run.repeat]
        out.append(f"nondeterministic: prompt {d.prompt_id} differs from repeat {d.reference_repeat} "
                   f"at token {d.position}")
    _el(case, "system-out", "\n".join(out))


def _cell_cases(suite: ET.Element, cell: CellSummary, cell_runs: list[RunRecord], counts: Counter[str]) -> list[float]:
    """One testcase per run of the cell (one skipped testcase when it has none); returns each one's seconds."""
    if not cell_runs:
        case = _el(suite, "testcase", classname=cell.model, name=cell.cell_id, time="0")
        _el(case, "skipped", message="not run: the cell has no run record")
        counts.update(("tests", "skipped"))
        return []
    results = {r.repeat: r for r in cell.run_results}
    nondet = {d.repeat: d for d in reversed(cell.nondeterminism)}  # first per repeat wins
    times = []
    for run in cell_runs:
        seconds = _seconds(run)
        times.append(seconds)
        counts["tests"] += 1
        case = _el(suite, "testcase", classname=cell.model, name=f"{cell.cell_id} #{run.repeat}",
                   time=f"{seconds:.3f}")
        if (counted := _judged(case, cell, run, results.get(run.repeat))) is not None:
            counts[counted] += 1
        _system_out(case, run, nondet)
    return times


def junit_xml(summary: Summary, runs: list[RunRecord]) -> str:
    runs_of: dict[str, list[RunRecord]] = defaultdict(list)
    for r in runs:
        runs_of[r.cell_id].append(r)

    suite_name = f"regbench {summary.config_name}"
    root = ET.Element("testsuites", name=xml_text(suite_name))
    suite = _el(root, "testsuite", name=suite_name)
    props = _el(suite, "properties")
    _el(props, "property", name="run_id", value=summary.run_id)
    _el(props, "property", name="config", value=summary.config_name)
    counts: Counter[str] = Counter()
    total_time = 0.0
    for cell in summary.cells:
        for seconds in _cell_cases(suite, cell, sorted(runs_of.get(cell.cell_id, []), key=lambda r: r.repeat), counts):
            total_time += seconds

    totals = dict(tests=counts["tests"], failures=counts["failures"], errors=0, skipped=counts["skipped"],
                  time=f"{total_time:.3f}")
    for el in (root, suite):
        for k, v in totals.items():
            el.set(k, str(v))
    suite.set("timestamp", time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(summary.started_at)))
    suite.set("hostname", "regbench")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
