"""The judge: pure functions from records to findings and verdicts. No I/O here.

Verdict taxonomy. A *finding* is one reason a run failed; a run with no finding passed.

Per request (judge_request)
    http_error           the server answered with a non-2xx status
    timeout              no complete answer within the request time-out
    connection_error     the connection failed or dropped (the server is gone or not listening)
    protocol_error       2xx, but the body or stream broke the API's promises (no choices, ...)
    empty_text           the completion's text is ""
    one_token            exactly one completion token although min_tokens asked for more
    short_output         fewer completion tokens than min_tokens
    usage_text_mismatch  usage counts tokens that the text does not show (tokens > 0, text ""),
                         or the returned token ids disagree with usage.completion_tokens
    degenerate           every generated token id is the same one (a model without weights
                         typically repeats one id forever)

Per run: one fresh server (judge_server)
    boot_failed          the server could not be started, or exited before /health answered 200;
                         the detail has the log tail
    boot_timeout         /health did not answer 200 before the boot deadline
    server_died          the server exited while serving, before the bench asked it to stop
    exit_exception       a traceback, "Exception ignored", UnicodeDecodeError or fatal error was
                         printed after the stop was requested, other than the allow-listed noise
                         of a normal vLLM shutdown (BENIGN_SHUTDOWN_NOISE)
    exit_code            the server's exit code after SIGTERM was not 0, or it had to be killed

Per cell, against its baseline cell (divergence)
    divergence           token ids differ from the baseline cell's for the same prompt; the
                         detail names the first differing position (0 = the very first token)

Per cell over its repeats (judge_cell): ``pass`` when no run has a finding, ``fail`` when every
run has one, ``flaky`` in between. Each repeat is a fresh server, because the failures this
bench exists for happen at weight-loading time and a warm server would hide them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from enum import StrEnum

from bench.config import Workload
from bench.matrix import Cell
from bench.records import CellSummary, ErrorKind, Finding, RequestRecord, RunRecord, ServerOutcome


class Reason(StrEnum):
    HTTP_ERROR = "http_error"
    TIMEOUT = "timeout"
    CONNECTION_ERROR = "connection_error"
    PROTOCOL_ERROR = "protocol_error"
    EMPTY_TEXT = "empty_text"
    ONE_TOKEN = "one_token"
    SHORT_OUTPUT = "short_output"
    USAGE_TEXT_MISMATCH = "usage_text_mismatch"
    DEGENERATE = "degenerate"
    BOOT_FAILED = "boot_failed"
    BOOT_TIMEOUT = "boot_timeout"
    SERVER_DIED = "server_died"
    EXIT_EXCEPTION = "exit_exception"
    EXIT_CODE = "exit_code"
    DIVERGENCE = "divergence"


_ERROR_REASON = {
    ErrorKind.HTTP: Reason.HTTP_ERROR,
    ErrorKind.TIMEOUT: Reason.TIMEOUT,
    ErrorKind.CONNECTION: Reason.CONNECTION_ERROR,
    ErrorKind.PROTOCOL: Reason.PROTOCOL_ERROR,
}

# Fewer tokens than this can repeat one id by chance; 128 identical ids cannot.
DEGENERATE_MIN_TOKENS = 8


def judge_request(req: RequestRecord, workload: Workload) -> list[Finding]:
    def finding(reason: Reason, detail: str) -> Finding:
        return Finding(reason=reason, detail=f"{req.prompt_id}: {detail}", prompt_id=req.prompt_id)

    if req.error_kind is not None:
        status = f"HTTP {req.status}: " if req.status else ""
        return [finding(_ERROR_REASON[req.error_kind], f"{status}{req.error}")]

    out: list[Finding] = []
    tokens = req.completion_tokens
    text = req.text or ""
    if text == "":
        out.append(finding(Reason.EMPTY_TEXT, f"empty text ({tokens} tokens, finish_reason {req.finish_reason})"))
    if tokens is not None:
        if tokens == 1 and workload.min_tokens > 1:
            out.append(finding(Reason.ONE_TOKEN, "1 completion token"))
        elif tokens < workload.min_tokens:
            out.append(finding(Reason.SHORT_OUTPUT, f"{tokens} < min_tokens {workload.min_tokens}"))
        if tokens > 0 and text == "":
            out.append(finding(Reason.USAGE_TEXT_MISMATCH, f"usage counts {tokens} tokens, text is empty"))
        elif req.token_ids is not None and len(req.token_ids) != tokens:
            out.append(
                finding(Reason.USAGE_TEXT_MISMATCH, f"{len(req.token_ids)} token ids, usage says {tokens}")
            )
    ids = req.token_ids or []
    if len(ids) >= DEGENERATE_MIN_TOKENS and len(set(ids)) == 1:
        out.append(finding(Reason.DEGENERATE, f"all {len(ids)} token ids are {ids[0]}"))
    return out


# Lines that open an exit-time episode worth a look.
_OPEN = re.compile(
    r"Traceback \(most recent call last\)|Exception ignored in|Fatal Python error|"
    r"Segmentation fault|core dumped"
)
# Never benign, wherever it appears: the exit-time error of vLLM issue #38991.
_ALWAYS = re.compile(r"UnicodeDecodeError")
# A chained traceback belongs to the episode before it.
_CHAINED = re.compile(r"During handling of the above exception|The above exception was the direct cause")
# What vLLM 0.32 prints on a normal SIGTERM (measured; see README "Exit-time scan"). An episode
# is benign only if one of these matches it; anything else in the shutdown phase is a finding.
BENIGN_SHUTDOWN_NOISE: tuple[re.Pattern[str], ...] = (
    # The API server's output handler notices the engine going away first.
    re.compile(r"AsyncLLM output_handler failed[\s\S]*EngineDeadError"),
    re.compile(r"EngineDeadError: EngineCore encountered an issue"),
)
_EPISODE_MAX_LINES = 80


def exit_time_episodes(shutdown_log: str) -> list[str]:
    """Splits the log after the stop request into alarm episodes (each a block of lines)."""
    lines = shutdown_log.splitlines()
    episodes: list[list[str]] = []
    current: list[str] | None = None
    for i, line in enumerate(lines):
        opens = bool(_OPEN.search(line)) or (current is None and bool(_ALWAYS.search(line)))
        chained = current is not None and any(_CHAINED.search(p) for p in lines[max(0, i - 3) : i])
        if opens and not chained:
            # The line before a traceback is usually the log message that introduced it.
            current = lines[i - 1 : i] + [line]
            episodes.append(current)
        elif current is not None:
            current.append(line)
            if len(current) >= _EPISODE_MAX_LINES:
                current = None
    return ["\n".join(e) for e in episodes]


def is_benign(episode: str) -> bool:
    return not _ALWAYS.search(episode) and any(p.search(episode) for p in BENIGN_SHUTDOWN_NOISE)


def unexpected_exit_episodes(shutdown_log: str) -> list[str]:
    return [e for e in exit_time_episodes(shutdown_log) if not is_benign(e)]


def judge_server(outcome: ServerOutcome, shutdown_log: str, log_tail: str) -> list[Finding]:
    """Findings about the server process itself: boot, life, and exit."""
    last = next((line.strip() for line in reversed(log_tail.splitlines()) if line.strip()), "(empty log)")
    if outcome.boot_s is None:
        if outcome.start_error is not None:
            return [Finding(reason=Reason.BOOT_FAILED, detail=outcome.start_error)]
        if outcome.exited_early_code is not None:
            detail = f"exited with code {outcome.exited_early_code} during boot: {last}\nlog tail:\n{log_tail}"
            return [Finding(reason=Reason.BOOT_FAILED, detail=detail)]
        detail = f"{outcome.boot_error or 'not healthy before the deadline'}: {last}\nlog tail:\n{log_tail}"
        return [Finding(reason=Reason.BOOT_TIMEOUT, detail=detail)]

    out: list[Finding] = []
    if outcome.exited_early_code is not None:
        out.append(
            Finding(
                reason=Reason.SERVER_DIED,
                detail=f"exited with code {outcome.exited_early_code} while serving: {last}\nlog tail:\n{log_tail}",
            )
        )
    else:
        for episode in unexpected_exit_episodes(shutdown_log):
            out.append(Finding(reason=Reason.EXIT_EXCEPTION, detail=episode[-2000:]))
        if outcome.killed:
            out.append(Finding(reason=Reason.EXIT_CODE, detail="did not exit after SIGTERM; killed"))
        elif outcome.exit_code not in (0, None):
            out.append(Finding(reason=Reason.EXIT_CODE, detail=f"exit code {outcome.exit_code} after SIGTERM"))
    return out


def judge_run(
    outcome: ServerOutcome, requests: Iterable[RequestRecord], workload: Workload, shutdown_log: str, log_tail: str
) -> list[Finding]:
    findings = judge_server(outcome, shutdown_log, log_tail)
    for req in sorted(requests, key=lambda r: r.prompt_id):
        findings.extend(judge_request(req, workload))
    return findings


def first_divergence(ids: list[int], reference: list[int]) -> int | None:
    """Index of the first differing token, or None if equal (a length difference counts)."""
    for i, (a, b) in enumerate(zip(ids, reference)):
        if a != b:
            return i
    return None if len(ids) == len(reference) else min(len(ids), len(reference))


def reference_outputs(runs: list[RunRecord], requests: list[RequestRecord]) -> dict[str, list[int]]:
    """Per prompt, the token ids of the first clean run of a baseline cell."""
    clean = {r.repeat for r in runs if not r.failed and not r.interrupted}
    ref: dict[str, list[int]] = {}
    for req in sorted(requests, key=lambda r: r.repeat):
        if req.repeat in clean and req.token_ids is not None:
            ref.setdefault(req.prompt_id, req.token_ids)
    return ref


def divergence(
    requests: Iterable[RequestRecord], reference: dict[str, list[int]]
) -> list[tuple[int, int, Finding]]:
    """(repeat, position, finding) for every request whose token ids differ from the baseline's."""
    out = []
    for req in requests:
        ref = reference.get(req.prompt_id)
        if ref is None or req.token_ids is None:
            continue
        pos = first_divergence(req.token_ids, ref)
        if pos is not None:
            detail = f"{req.prompt_id}: differs from baseline at token {pos}"
            out.append((req.repeat, pos, Finding(reason=Reason.DIVERGENCE, detail=detail, prompt_id=req.prompt_id)))
    return out


def judge_cell(
    cell: Cell,
    runs: list[RunRecord],
    requests: list[RequestRecord],
    reference: dict[str, list[int]] | None,
) -> CellSummary:
    judged = [r for r in runs if not r.interrupted]
    per_run: dict[int, list[Finding]] = {r.repeat: list(r.findings) for r in judged}
    positions: list[int] = []
    if reference:
        for repeat, pos, f in divergence((q for q in requests if q.repeat in per_run), reference):
            per_run[repeat].append(f)
            positions.append(pos)
    failures = sum(1 for fs in per_run.values() if fs)
    reasons = Counter(reason for fs in per_run.values() for reason in {f.reason for f in fs})
    if not judged:
        verdict = "not run"
    elif failures == 0:
        verdict = "pass"
    elif failures == len(judged):
        verdict = "fail"
    else:
        verdict = "flaky"
    example = next((fs[0].detail for fs in per_run.values() if fs), None)
    return CellSummary(
        cell_id=cell.id,
        model=cell.model.name,
        load_format=cell.load_format.name,
        platform=cell.platform,
        image=cell.image.name,
        baseline_id=cell.baseline_id,
        runs=len(judged),
        failures=failures,
        verdict=verdict,
        reasons=dict(sorted(reasons.items())),
        divergence_positions=positions,
        example=example.splitlines()[0][:200] if example else None,
    )
