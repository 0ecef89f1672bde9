"""The findings taxonomy as data: every `Reason`, where the judge finds it and what it means,
written once. docs/judged.md's findings table is made from it (scripts/judged_reference.py), and
tests/test_probe_registry.py holds it to the enum. A contract probe's entry is the probe's own
(bench.core.probes: `description`). Pure."""

from __future__ import annotations

from typing import NamedTuple

from bench.core.probes import PROBES, ContractProbe
from bench.core.verdicts import Reason


class Section(NamedTuple):
    found: str  # where in a run the judge looks
    function: str  # the function that finds them
    entries: list[tuple[Reason, str]]


class Entry(NamedTuple):
    reason: Reason
    found: str
    function: str
    text: str


# The judge's own findings, in the order of a run's data.
_SECTIONS: list[Section] = [
    Section('Per request', 'bench.core.judge.requests.judge_request', [
        (Reason.HTTP_ERROR,
            'the server answered with a non-2xx status'),
        (Reason.TIMEOUT,
            'no complete answer within the request time-out'),
        (Reason.CONNECTION_ERROR,
            'the connection failed or dropped (the server is gone or not listening)'),
        (Reason.PROTOCOL_ERROR,
            "2xx, but the body or stream broke the API's promises (no choices, ...)"),
        (Reason.NON_FINITE_OUTPUT,
            'the server computed NaN or infinite values and could not even encode its answer: an HTTP error '
            'whose body says so ("Out of range float values are not JSON compliant" when logprobs are asked '
            'for); the evidence has it'),
        (Reason.EMPTY_TEXT,
            'the completion\'s text is "", or absent (null) altogether: the evidence says which'),
        (Reason.ONE_TOKEN,
            'exactly one completion token although min_tokens asked for more'),
        (Reason.SHORT_OUTPUT,
            "fewer completion tokens than min_tokens (the prompt's own where it gives one), not counting the "
            'EOS or stop token id that ended the answer'),
        (Reason.OVER_MAX_TOKENS,
            'more completion tokens than max_tokens, by usage or by the returned ids (vllm#28172: an '
            'off-by-one in the length check)'),
        (Reason.USAGE_TEXT_MISMATCH,
            'usage counts tokens that the text does not show (tokens > 0, text ""), or the returned token '
            'ids disagree with usage.completion_tokens'),
        (Reason.STREAM_TEXT_MISMATCH,
            "a streamed answer's text is not the text of its own tokens: the tokens' own bytes, which a chat "
            "answer's logprobs carry token by token, spell another text than the deltas did (a stream that "
            "lost its tail, or a delta told twice). Compared where every token's text is known and whole (no "
            'token ends inside a multi-byte character); the evidence has the first differing character and '
            'both texts from there'),
        (Reason.DEGENERATE,
            'every generated token id is the same one (a model without weights typically repeats one id '
            'forever)'),
        (Reason.EXPECTATION_FAILED,
            "the answer does not hold what the prompt's `expect` says a healthy model's answer holds "
            '(contains / regex / one of): no baseline needed, and it catches a model that lost part of its '
            'weights and talks fluently. Not counted when the baseline cell misses the same answer too and '
            'nothing corroborates it (see "Absolute checks" below)'),
    ]),
    Section('Per run: requests of the same content', 'bench.core.judge.twins.judge_twins', [
        (Reason.INCONSISTENT_OUTPUT,
            'two requests of one run with the same content (kind, prompt or messages; streamed or not) got '
            "different token ids, as the cell's comparator sees it: the same server answered one question "
            'two ways. Greedy decoding must not depend on streaming (vllm#48853), on a prefix-cache hit for '
            'the second of them (vllm#5543) or on what else was in the batch (vllm#27034). The evidence '
            'names both prompts and the first differing token; the same tokens told otherwise count too (other '
            'text: a detokenizer, or a stream that repeats the prompt; other tool calls; another '
            'finish_reason), with both tellings there'),
    ]),
    Section('Per run: the reference text', 'bench.core.judge.server.judge_reference', [
        (Reason.REFERENCE_NLL,
            "the server found the config's fixed passage unlikely: its mean negative log-likelihood per "
            'token is above the ceiling (`max_mean_nll`), or not a number, or could not be measured; or '
            "(against the baseline cell's first clean run) it rose by more than the tolerance. The evidence "
            "has the score, the ceiling or the baseline's score and the tolerance"),
    ]),
    Section("Per run: the server's own counters", 'bench.core.judge.server.judge_server_counters', [
        (Reason.TOKEN_COUNT_MISMATCH,
            "the server's /metrics counted a different number of generated tokens over the workload than the "
            'token ids the client received (every request answered): the engine and what reached users '
            'disagree. The evidence has both counts'),
    ]),
    Section('Per run: one fresh server', 'bench.core.judge.server.judge_server', [
        (Reason.BOOT_FAILED,
            'the server could not be started, or exited before /health answered 200; the evidence has the '
            'log tail'),
        (Reason.NOT_RUNNABLE,
            "the cell cannot run on this host, said before or instead of a boot: the image's architecture is "
            "not the host's (`docker image inspect`), its NVIDIA_REQUIRE_* cannot be met by the host's "
            "driver, or NVIDIA's container toolkit refused it in its own words; its tag is not published or "
            "has no build for the host's platform; the GPUs it is placed on are absent; the cell's knob "
            "needs a CPU flag the host lacks (a profile knob's `cpu_flags`). The evidence says which. It "
            'says nothing of vLLM: the run is not a failing one, the cell is NOT RUNNABLE, and it fails no '
            'exit code'),
        (Reason.BOOT_TIMEOUT,
            '/health did not answer 200 before the boot deadline'),
        (Reason.PORT_TAKEN,
            "another program held the server's port and answered in its place; no request was sent to it "
            '(the evidence names the process)'),
        (Reason.SERVER_DIED,
            'the server exited while serving, before the bench asked it to stop'),
        (Reason.EXIT_EXCEPTION,
            'a traceback, "Exception ignored", UnicodeDecodeError or fatal error was printed after the stop '
            'was requested, other than the allow-listed noise of a normal vLLM shutdown '
            '(bench.core.judge.BENIGN_SHUTDOWN_NOISE)'),
        (Reason.EXIT_CODE,
            "the server's exit code after SIGTERM was not 0, or it had to be killed"),
    ]),
    Section('Per cell, before and across its runs', 'bench.core.judge.cells.apply_cell_checks', [
        (Reason.WEIGHTS_LOST,
            "the pre-flight audit streamed the cell's checkpoint through the cell's environment and tensors "
            'went missing: the cell fails even if no request was sent'),
        (Reason.FINGERPRINT_CHANGED,
            'its repeats ran different images (container image ids differ): the runs are not repeats of one '
            'thing; a passing cell becomes flaky'),
    ]),
    Section('Per cell, against its baseline cell', 'bench.core.judge.cells.divergence', [
        (Reason.DIVERGENCE,
            "token ids differ from the baseline cell's for the same prompt, as the comparator "
            "(bench.core.tokens: `exact`, or `logprobs` where a token in the other side's top k is no "
            'difference) sees it; the evidence has the first differing position (0 = the very first token), '
            "both tokens there (id, text where known, logprob) and each one's rank in the other side's top k"),
        (Reason.NEVER_STOPS,
            "the baseline's answer to a prompt ended by itself (EOS, a stop token or string) and this one "
            'ran to max_tokens: only for prompts that may end (`ignore_eos: false`; every other prompt runs '
            'to max_tokens by design). vllm#51456: corrupt output that never reaches EOS, which ignore_eos '
            'hides. The evidence has both lengths'),
        (Reason.INVARIANCE_BROKEN,
            "a knob's cell (an `invariance` block: serial, no prefix caching, ...) answers otherwise than "
            'the same cell without the knob, as that cell answered, right or wrong; the evidence is a '
            "divergence's, with the knob"),
    ]),
]


def _twins(probe: ContractProbe) -> bool:
    return type(probe).check_twins is not ContractProbe.check_twins


def taxonomy() -> list[Entry]:
    """Every finding, in order: each section's, the contract probes' after the requests and the
    twins they judge."""
    out: list[Entry] = []
    for section in _SECTIONS:
        out += [Entry(reason, section.found, section.function, text) for reason, text in section.entries]
        if section.function.endswith(".judge_request"):
            out += [Entry(p.reason, "Per request: contract probes", type(p).__module__, p.description)
                    for p in PROBES if not _twins(p)]
        if section.function.endswith(".judge_twins"):
            out += [Entry(p.reason, "Per run: requests of the same content, a contract probe", type(p).__module__,
                          p.description) for p in PROBES if _twins(p)]
    return out


def description(reason: Reason) -> str:
    return next(e.text for e in taxonomy() if e.reason == reason)
