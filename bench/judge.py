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
    port_taken           another program held the server's port and answered in its place; no
                         request was sent to it (the detail names the process)
    server_died          the server exited while serving, before the bench asked it to stop
    exit_exception       a traceback, "Exception ignored", UnicodeDecodeError or fatal error was
                         printed after the stop was requested, other than the allow-listed noise
                         of a normal vLLM shutdown (BENIGN_SHUTDOWN_NOISE)
    exit_code            the server's exit code after SIGTERM was not 0, or it had to be killed

Per cell, before and across its runs (apply_cell_checks)
    weights_lost         the pre-flight audit streamed the cell's checkpoint through the cell's
                         environment and tensors went missing (counts in the detail): the cell
                         fails even if no request was sent
    fingerprint_changed  its repeats ran different images (container image ids differ): the
                         runs are not repeats of one thing; a passing cell becomes flaky

Per cell, against its baseline cell (divergence)
    divergence           token ids differ from the baseline cell's for the same prompt; the
                         detail names the first differing position (0 = the very first token)

Per cell over its repeats (judge_cell)
    Each repeat is a fresh server, because the failures this bench exists for happen at
    weight-loading time and a warm server would hide them. Interrupted runs are not judged.
    A run *failed* when it has a finding of its own or diverges from the baseline.
    verdict              ``pass`` when no judged run failed, ``fail`` when every judged run
                         failed, ``flaky`` in between, ``not run`` with no judged run
                         (bench.stats.verdict; verdict_settled says when more repeats can no
                         longer change it)
    failures/runs        with the Wilson 95 % interval of the failure rate: "0/20 (0–16 %)"
    nondeterminism       token ids of a prompt differ between repeats of the same cell (each
                         repeat against the cell's first clean run, or its first run if none is
                         clean), with the first differing position. Flagged on its own: it does
                         not change the verdict, since a failing run differs anyway and a
                         passing one may legitimately vary (temperature > 0, batch effects).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from enum import StrEnum

from bench.config import Workload
from bench.matrix import Cell
from bench.records import (
    CellSummary, ErrorKind, Finding, RequestRecord, RunRecord, RunResult, ServerOutcome, TokenDiff,
)
from bench.stats import verdict, wilson_interval


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
    PORT_TAKEN = "port_taken"
    SERVER_DIED = "server_died"
    EXIT_EXCEPTION = "exit_exception"
    EXIT_CODE = "exit_code"
    DIVERGENCE = "divergence"
    WEIGHTS_LOST = "weights_lost"
    FINGERPRINT_CHANGED = "fingerprint_changed"


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
        if outcome.port_taken_by is not None:
            return [Finding(reason=Reason.PORT_TAKEN, detail=f"{outcome.boot_error}\nlog tail:\n{log_tail}")]
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
    judged = sorted((r for r in runs if not r.interrupted), key=lambda r: r.repeat)
    per_run: dict[int, list[Finding]] = {r.repeat: list(r.findings) for r in judged}
    judged_requests = sorted((q for q in requests if q.repeat in per_run), key=lambda q: q.repeat)
    positions: list[int] = []
    diverged: dict[int, list[TokenDiff]] = {}
    if reference:
        # Equal token lists compare in C; only the differing ones need the position worked out.
        differing = (
            q for q in judged_requests
            if q.token_ids is not None and q.prompt_id in reference and q.token_ids != reference[q.prompt_id]
        )
        for repeat, pos, f in divergence(differing, reference):
            per_run[repeat].append(f)
            positions.append(pos)
            diverged.setdefault(repeat, []).append(TokenDiff(prompt_id=f.prompt_id, repeat=repeat, position=pos))
    run_reasons = {repeat: sorted({f.reason for f in fs}) for repeat, fs in per_run.items()}
    failures = sum(1 for rs in run_reasons.values() if rs)
    reasons = Counter(reason for rs in run_reasons.values() for reason in rs)
    example = next((fs[0].detail for fs in per_run.values() if fs), None)

    # Within-cell reference per prompt: the first clean run's output, else the first run's.
    clean = {repeat for repeat, rs in run_reasons.items() if not rs}
    own_ref: dict[str, RequestRecord] = {}
    with_ids = [q for q in judged_requests if q.token_ids is not None]
    for q in with_ids:
        if q.repeat in clean:
            own_ref.setdefault(q.prompt_id, q)
    for q in with_ids:
        own_ref.setdefault(q.prompt_id, q)
    nondeterminism = []
    for q in with_ids:
        ref = own_ref[q.prompt_id]
        # List equality runs in C; the position is only worked out for the rare unequal pair.
        if ref.repeat != q.repeat and q.token_ids != ref.token_ids:
            pos = first_divergence(q.token_ids, ref.token_ids)
            nondeterminism.append(
                TokenDiff(prompt_id=q.prompt_id, repeat=q.repeat, position=pos, reference_repeat=ref.repeat)
            )

    return CellSummary(
        cell_id=cell.id,
        model=cell.model.name,
        load_format=cell.load_format.name,
        platform=cell.platform,
        image=cell.image.name,
        baseline_id=cell.baseline_id,
        runs=len(judged),
        failures=failures,
        verdict=verdict(failures, len(judged)),
        reasons=dict(sorted(reasons.items())),
        divergence_positions=positions,
        example=example.splitlines()[0][:200] if example else None,
        failure_rate_interval=wilson_interval(failures, len(judged)) if judged else None,
        nondeterminism=nondeterminism,
        run_results=[
            RunResult(repeat=repeat, reasons=rs, divergence=diverged.get(repeat, []))
            for repeat, rs in run_reasons.items()
        ],
    )


def apply_cell_checks(summary: CellSummary, runs: list[RunRecord], audit: PreflightRecord | None) -> CellSummary:
    """Adds the cell-level findings that are not about one run: lost weights and image drift."""
    reasons = dict(summary.reasons)
    verdict = summary.verdict
    example = summary.example
    if audit is not None and not audit.ok:
        reasons[Reason.WEIGHTS_LOST] = max(1, summary.runs)
        verdict = "fail"
        lost = f"pre-flight audit: {audit.lost} tensor deliveries lost"
        example = f"{lost}: {audit.problems[0]}" if audit.problems else lost
    images = {r.server.image_id for r in runs if r.server.image_id is not None and not r.interrupted}
    if len(images) > 1:
        reasons[Reason.FINGERPRINT_CHANGED] = len(images)
        if verdict == "pass":
            verdict = "flaky"
        example = example or f"repeats ran {len(images)} different images: {sorted(images)}"
    return summary.model_copy(update={"reasons": dict(sorted(reasons.items())), "verdict": verdict, "example": example})
