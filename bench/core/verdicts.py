"""Verdicts: the vocabulary of what the judge can find, as types. Pure; no I/O.

A *finding* is one reason a run failed; a run with no finding passed. Each finding carries
structured *evidence* (bench.core.evidence) from which its human text is derived, so a program
never has to parse prose back.

What each `Reason` means and where the judge finds it is the taxonomy, written once as data in
bench.core.taxonomy (a contract probe's entry in its own module, bench.core.probes) and shown in
docs/judged.md. How a cell's verdict follows from its runs' findings: bench.core.judge.cells;
which misses are set aside where the baseline shares them: bench.core.judge.baseline.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from bench.core.evidence import PROMPT_PREFIXED, Evidence, Note

# How a launcher's start error begins when the image cannot run on this host at all (its
# architecture); the judge then says not_runnable rather than boot_failed.
NOT_RUNNABLE = "not runnable on this host"


class Reason(StrEnum):
    HTTP_ERROR = "http_error"
    TIMEOUT = "timeout"
    CONNECTION_ERROR = "connection_error"
    PROTOCOL_ERROR = "protocol_error"
    NON_FINITE_OUTPUT = "non_finite_output"
    EMPTY_TEXT = "empty_text"
    ONE_TOKEN = "one_token"
    SHORT_OUTPUT = "short_output"
    OVER_MAX_TOKENS = "over_max_tokens"
    USAGE_TEXT_MISMATCH = "usage_text_mismatch"
    STREAM_TEXT_MISMATCH = "stream_text_mismatch"
    CHUNK_UNPAIRED = "chunk_unpaired"
    DECODE_MISMATCH = "decode_mismatch"
    DEGENERATE = "degenerate"
    INCONSISTENT_OUTPUT = "inconsistent_output"
    SEED_NOT_REPRODUCIBLE = "seed_not_reproducible"
    LOGPROBS_VARY_WITH_K = "logprobs_vary_with_k"
    STOP_IGNORED = "stop_ignored"
    BANNED_TOKEN = "banned_token"
    WRONG_CHOICE_COUNT = "wrong_choice_count"
    SCHEMA_VIOLATED = "schema_violated"
    PROMPT_REPEATED = "prompt_repeated"
    TOOL_CALL_INVALID = "tool_call_invalid"
    FINISH_REASON_MISMATCH = "finish_reason_mismatch"
    STOP_TOKEN_IGNORED = "stop_token_ignored"
    SAMPLING_IGNORED = "sampling_ignored"
    TOKEN_NOT_ALLOWED = "token_not_allowed"
    BAD_WORD_GENERATED = "bad_word_generated"
    EXPECTATION_FAILED = "expectation_failed"
    REFERENCE_NLL = "reference_nll"
    TOKEN_COUNT_MISMATCH = "token_count_mismatch"
    BOOT_FAILED = "boot_failed"
    NOT_RUNNABLE = "not_runnable"  # the cell cannot run on this host: no server started, nothing said of vLLM
    BOOT_TIMEOUT = "boot_timeout"
    PORT_TAKEN = "port_taken"
    SERVER_DIED = "server_died"
    EXIT_EXCEPTION = "exit_exception"
    EXIT_CODE = "exit_code"
    DIVERGENCE = "divergence"
    NEVER_STOPS = "never_stops"
    INVARIANCE_BROKEN = "invariance_broken"  # a knob's cell differs from the same cell without the knob
    WEIGHTS_LOST = "weights_lost"
    FINGERPRINT_CHANGED = "fingerprint_changed"


class Verdict(StrEnum):
    PASS = "pass"
    FLAKY = "flaky"
    FAIL = "fail"
    NOT_RUN = "not run"
    # The cell cannot run on this host (its image, its devices, its knob's CPU): no server was
    # started, and nothing is said of vLLM. It fails no run and no exit code.
    NOT_RUNNABLE = "not runnable"

    @property
    def failing(self) -> bool:
        return self in (Verdict.FAIL, Verdict.FLAKY)


class Finding(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Reason
    evidence: Evidence
    prompt_id: str | None = None
    # The choice of an answer with n > 1 that it is about, past the first; None: the first choice,
    # or the answer as a whole.
    choice: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _legacy_detail(cls, data: Any) -> Any:
        # Records written before typed evidence kept only prose in "detail".
        if isinstance(data, dict) and "detail" in data and "evidence" not in data:
            data = dict(data)
            data["evidence"] = Note(note=str(data.pop("detail")))
        return data

    @property
    def detail(self) -> str:
        """The human text, derived from the evidence."""
        text = self.evidence.text()
        if self.choice is not None:
            text = f"choice {self.choice}: {text}"
        return f"{self.prompt_id}: {text}" if self.prompt_id and isinstance(self.evidence, PROMPT_PREFIXED) else text
