"""Typed records: what the bench writes, one JSON line each, and reads back for reports."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from bench.core.tokens import Output, TokenLogprobs
from bench.core.verdicts import NOT_RUNNABLE, Finding, Reason, Verdict

__all__ = ["Finding", "Reason", "Verdict"]  # the verdict types, where every record type is


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorKind(StrEnum):
    HTTP = "http"
    TIMEOUT = "timeout"
    CONNECTION = "connection"
    PROTOCOL = "protocol"  # 2xx, but the body or stream was not what the API promises


class ToolCall(Record):
    """A function call an answer carried: streamed, its deltas put together by their index."""

    name: str | None = None
    arguments: str = ""


class Choice(Record):
    """One choice of an answer beyond the first (a prompt's `n`), recorded whole: each is held to
    the request as the first is."""

    index: int
    text: str | None = None
    token_ids: list[int] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    tool_calls: list[ToolCall] | None = None
    chunks: list[tuple[int, int]] | None = None  # as RequestRecord.chunks
    decoded: str | None = None  # as RequestRecord.decoded


class RequestRecord(Record):
    """One request as the client saw it. A failed request is a record with an error, not a raise."""

    type: Literal["request"] = "request"
    cell_id: str
    repeat: int
    prompt_id: str
    api: Literal["completion", "chat"]
    stream: bool
    started_at: float
    latency_s: float
    status: int | None = None
    text: str | None = None
    token_ids: list[int] | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    # vLLM's stop_reason: the stop string or stop token id that ended the answer (None: EOS or length).
    stop_reason: str | int | None = None
    # The server's context length (its /v1/models), which caps an answer's tokens with the prompt's;
    # None where it did not say, and in records written before it was asked.
    max_model_len: int | None = None
    # Token ids received per choice, one entry per choice that came back (a prompt's `n`; the first
    # choice is the one recorded above). None in records written before choices were counted.
    choice_tokens: list[int] | None = None
    # The first choice's tool calls, for a prompt with `tools` ([]: none came back); None otherwise.
    tool_calls: list[ToolCall] | None = None
    # The choices after the first, in index order, each whole (n > 1); None with one choice, and in
    # records written before they were kept.
    choices: list[Choice] | None = None
    # The token id sequences the server bans for each of the prompt's bad_words, as its own
    # tokenizer gives them (/tokenize); None where none were asked for or it did not say.
    bad_words_ids: dict[str, list[list[int]]] | None = None
    # A streamed answer of a prompt that asks `chunks_paired`: per chunk of the first choice, up to
    # the one that ended it, (the token ids it carried, the characters of text it carried). And for
    # it, or a prompt that asks `text_decoded` where a choice's text is not its decode as it stands,
    # each id's own text as the server's /detokenize tells it. None otherwise.
    chunks: list[tuple[int, int]] | None = None
    token_texts: dict[int, str] | None = None
    # A prompt that asks `text_decoded`: what the server's /detokenize makes of the first choice's
    # ids after the prompt's (the text the prompt's ids and the answer's decode to, less the
    # prompt's own); None otherwise, where the server would not say, and for a choice whose ids
    # were told outside its text (a reasoning parser's `reasoning_content`).
    decoded: str | None = None
    # Per generated token, its logprob and top-k alternatives (comparison mode `logprobs`).
    logprobs: list[TokenLogprobs] | None = None
    error_kind: ErrorKind | None = None
    error: str | None = None
    # Streamed answers: seconds from sending to the first token, and between the later chunks that
    # carried tokens (vLLM streams one token a chunk, now and then two).
    ttft_s: float | None = None
    itl_s: list[float] | None = None

    @property
    def output(self) -> Output | None:
        if self.token_ids is None:
            return None
        ended = None if self.finish_reason is None else self.finish_reason == "stop"
        return Output(ids=self.token_ids, logprobs=self.logprobs, ended=ended)

    def answers(self) -> list[tuple[int, RequestRecord]]:
        """Each choice as an answer of its own, with its index: the first is this record; a later
        one carries its own text, ids, finish and tool calls, and counts its ids as its usage (the
        usage of all of them is the first's to hold)."""
        later = [(c.index, self.model_copy(update={
            "text": c.text, "token_ids": c.token_ids, "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
            "tool_calls": c.tool_calls, "chunks": c.chunks, "decoded": c.decoded,
            "completion_tokens": len(c.token_ids) if c.token_ids is not None else None,
            "choice_tokens": None, "choices": None, "logprobs": None})) for c in self.choices or []]
        return [(0, self), *later]

    @property
    def tokens_per_s(self) -> float | None:
        """Output tokens per second of the whole request, as the client saw it."""
        if self.error_kind is not None or not self.completion_tokens or self.latency_s <= 0:
            return None
        return self.completion_tokens / self.latency_s


class ReferenceScore(Record):
    """The reference-text score of one run: how likely the server finds a fixed passage, as the
    mean negative log-likelihood per token of its prompt logprobs (nats; lower is likelier)."""

    mean_nll: float | None = None  # None: not measured (error), or a logprob was not a number
    tokens: int = 0  # passage tokens scored (all but the first, which has no context)
    error: str | None = None


class Devices(Record):
    """The devices one server was given (bench.serve.slots); the launcher binds it to exactly these."""

    kind: Literal["gpu", "cpu"]
    ids: tuple[str, ...]


class ServerOutcome(Record):
    """What the launcher observed of one server's life, from start to reaped."""

    command: list[str]
    port: int
    log_path: str
    started_at: float
    boot_s: float | None = None  # None: never became healthy
    start_error: str | None = None  # the process could not even be started
    not_runnable: bool = False  # not started: the cell cannot run on this host (bench.serve.errors.NotRunnable)
    boot_error: str | None = None
    port_taken_by: str | None = None  # another program answered on the server's port
    exited_early_code: int | None = None  # exit code if it died before we asked it to stop
    stop_requested_at_byte: int | None = None  # log offset where the shutdown phase begins
    exit_code: int | None = None
    image_id: str | None = None  # what actually ran, for containers
    killed: bool = False  # needed SIGKILL after the grace period
    shutdown_s: float | None = None
    devices: Devices | None = None  # None: not bound to devices (a platform without `devices`)
    ended_at: float | None = None  # wall clock once nothing of the server was left
    peak_memory_bytes: int | None = None  # sampled while it ran (bench.serve.memory), until the stop
    peak_gpu_bytes: int | None = None  # where nvidia-smi exists
    memory_source: str | None = None  # how peak_memory_bytes was counted

    @model_validator(mode="before")
    @classmethod
    def _said_only_in_its_message(cls, data: object) -> object:
        # Results folders written before `not_runnable` was a field said it only in start_error's
        # opening words: read so, they keep their verdicts.
        if (isinstance(data, dict) and "not_runnable" not in data
                and str(data.get("start_error") or "").startswith(NOT_RUNNABLE)):
            return {**data, "not_runnable": True}
        return data


class ServerMetrics(Record):
    """The server's own counters (its Prometheus /metrics), over the workload: scraped once the
    server is healthy and again after the last request, before the reference text is scored and the stop."""

    prompt_tokens: float | None = None  # vllm:prompt_tokens_total, after − before
    generation_tokens: float | None = None  # vllm:generation_tokens_total, after − before
    requests: float | None = None  # vllm:request_success_total (every finished_reason), after − before
    preemptions: float | None = None  # vllm:num_preemptions_total, after − before
    prefix_cache_hits: float | None = None  # vllm:prefix_cache_hits_total (tokens), after − before
    kv_cache_usage: float | None = None  # vllm:kv_cache_usage_perc after the workload (0–1)
    error: str | None = None  # the scrape failed: why


class RunPerf(Record):
    """How fast one fresh server started and served. Boot phases come from the clock and from the
    server's log (bench.core.logfacts); request figures are the client's."""

    boot_s: float | None = None  # process start → /health 200, by the bench's clock
    # Phase marks from the log's own timestamps (1 s resolution), seconds after its first line:
    # engine_start, load_start, kv_cache, engine_ready, server_ready (those the log shows).
    phases: dict[str, float] = {}
    weights_load_s: float | None = None  # vLLM's "Loading weights took"
    engine_init_s: float | None = None  # vLLM's "init engine (profile, create kv cache, warmup model) took"
    checkpoint_bytes: int | None = None  # the model's *.safetensors files, where the model is a local folder
    output_tokens: int = 0  # token ids the client received, over the workload
    throughput_tok_s: float | None = None  # output_tokens / the workload's wall time, at its concurrency
    metrics: ServerMetrics | None = None
    peak_rss_bytes: int | None = None  # the server's processes, sampled while it ran
    peak_gpu_bytes: int | None = None  # nvidia-smi's used memory of the server's processes (GPU hosts)
    memory_source: str | None = None  # how peak memory was measured ("process group RSS", "container stats")

    @property
    def load_gb_s(self) -> float | None:
        """Weight-loading throughput: checkpoint bytes over vLLM's own loading time."""
        if not self.checkpoint_bytes or not self.weights_load_s:
            return None
        return self.checkpoint_bytes / self.weights_load_s / 1e9


class RunRecord(Record):
    """One fresh server of one cell, as observed: how it booted, served and exited, its reference
    score and figures. What is wrong with it is the judge's to say, each time a folder is judged
    (bench.core.judge.judge), from this, the run's requests and its server log (ServerLog)."""

    type: Literal["run"] = "run"
    cell_id: str
    repeat: int
    server: ServerOutcome
    requests_s: float | None = None
    reference: ReferenceScore | None = None  # None: the reference text is off (or the run never served)
    perf: RunPerf | None = None  # None: written by a regbench without performance figures
    # Written by regbench before its findings were all made by the judge (the run's own findings,
    # judged when it ended). Never written now; read only for a run whose server log is gone,
    # for what only the log could tell (bench.core.judge.LOG_ONLY_REASONS).
    findings: list[Finding] = []
    interrupted: bool = False


class ServerLog(Record):
    """What the judge reads of one run's server.log: the part after the stop request (where
    exit-time exceptions show) and the last lines (why a boot failed or a server died). Read
    from the log in the results folder when the folder is loaded; never a file of its own."""

    shutdown: str = ""
    tail: str = ""


# Slurm job states that are over (scontrol's JobState).
JOB_DONE_STATES = frozenset({"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY",
                             "PREEMPTED", "BOOT_FAIL", "DEADLINE", "UNKNOWN"})


class JobRecord(Record):
    """One cell's job under a cluster executor (bench.slurm), as the scheduler last reported it;
    slurm.jsonl in the merged results folder."""

    cell_id: str
    job_id: str
    slice_dir: str
    state: str = "PENDING"  # Slurm's JobState; UNKNOWN: the scheduler forgot it before it was seen over
    node: str | None = None
    exit_code: str | None = None  # "0:0": the batch script's exit code and the signal that ended it
    reason: str | None = None  # Slurm's reason, for a job that did not complete
    cuda_visible_devices: str | None = None  # as the job saw it (its output's first line)
    submitted_at: float
    ended_at: float | None = None
    attempt: int = 1  # 2, 3, ...: resubmitted by `regbench run --resume`
    restarts: int = 0  # requeued by Slurm itself (a node failure with requeue on): same job id, run again

    @property
    def done(self) -> bool:
        return self.state in JOB_DONE_STATES


class Fingerprint(Record):
    """Versions inside the environment that served a cell, and the host it ran on."""

    image: str
    image_ref: str | None = None  # containers: the reference asked for, the image id and the
    image_id: str | None = None  # registry digest it resolved to (None for local builds)
    image_digest: str | None = None
    # What every container of the run was created from: image_digest (repo@sha256:...), or the
    # image id of an image with no digest of image_ref's repository. Resolved once per run.
    image_pin: str | None = None
    python: str | None = None
    vllm: str | None = None
    runai_model_streamer: str | None = None
    torch: str | None = None
    cuda: str | None = None
    # Where FP8/NVFP4 regressions live, whichever the environment has (None: not installed).
    transformers: str | None = None
    flashinfer: str | None = None  # flashinfer-python
    triton: str | None = None
    nccl: str | None = None  # torch's (CUDA builds), else the nvidia-nccl-cu* distribution's
    modelopt: str | None = None  # nvidia-modelopt
    cudnn: str | None = None  # torch.backends.cudnn.version() as major.minor.patch, else nvidia-cudnn-cu*
    arch: str | None = None
    cpu: str | None = None
    gpu: str | None = None
    error: str | None = None


class TokenDiff(Record):
    """Where one output's token ids first differ from a reference output for the same prompt."""

    prompt_id: str
    repeat: int  # the run whose output differs
    position: int  # first differing token, 0 = the very first; a length difference counts
    reference_repeat: int | None = None  # within-cell comparisons: the repeat compared with


class UnconfirmedNote(Record):
    """A finding set aside as unconfirmed, not counted against the cell
    (bench.core.judge.set_aside_unconfirmed), reported on its own: an absolute check (a known
    answer, the reference-text ceiling) that a cell's runs missed while the baseline cell missed it
    too and nothing else corroborated it, or a contract probe the server refuses as its baseline
    does (or under a knob)."""

    reason: Reason  # expectation_failed, reference_nll, or http_error (a contract probe the server refuses)
    prompt_id: str | None = None  # the known answer's prompt; None for the reference text
    runs: int  # how many judged runs of the cell missed it
    detail: str  # one missed run's evidence
    why: str  # why it is not evidence against this cell


class RunResult(Record):
    """One judged run of a cell: what counts against it (its own findings, its divergence from
    the baseline, an invariance broken, a reference score drifted; the findings set aside as
    unconfirmed are not here but in the cell's `unconfirmed`) and their reasons."""

    repeat: int
    reasons: list[Reason] = []  # sorted, one entry per reason; empty = the run passed
    findings: list[Finding] = []  # with their evidence, in the order the judge made them
    divergence: list[TokenDiff] = []  # against the baseline cell's first clean run
    # The cell has a baseline with no clean run yet: divergence is not known (the progress line
    # after each run; at the end of a run, a baseline without one compares nothing).
    baseline_pending: bool = False

    @property
    def not_runnable(self) -> bool:
        """No server could be started on this host: the run says nothing of vLLM."""
        return Reason.NOT_RUNNABLE in self.reasons

    @property
    def failed(self) -> bool:
        return bool(self.reasons) and not self.not_runnable

    @property
    def beside_divergence(self) -> list[Finding]:
        """Its findings but divergence, which reports show by prompt and position instead."""
        return [f for f in self.findings if f.reason != Reason.DIVERGENCE]


class LogExcerpt(Record):
    """A few KB of a run's server.log around a finding, read when reports are written."""

    cell_id: str
    repeat: int
    log_path: str  # relative to the results folder, as in ServerOutcome.log_path
    start_byte: int
    end_byte: int
    text: str
    why: str  # what the excerpt is around, e.g. "first unexpected exit-time episode"
    focus: int | None = None  # index in text where the finding starts, when it was located


class MetricSummary(Record):
    """One performance metric of one cell (bench.core.perf): percentiles over every sample, and
    the median of per-run values with its bootstrap 95 % interval (None with one run)."""

    samples: int
    runs: int
    p50: float
    p90: float
    run_median: float
    run_median_ci: tuple[float, float] | None = None


class CellSummary(Record):
    cell_id: str
    model: str
    load_format: str
    platform: str
    image: str
    baseline_id: str | None
    runs: int
    failures: int
    verdict: Verdict
    reasons: dict[Reason, int]  # reason -> number of runs showing it
    divergence_positions: list[int] = []  # first differing token position per diverging prompt/run
    example: str | None = None  # one finding's detail, for the table
    # Wilson 95 % interval of the failure rate failures/runs; None when no run was judged.
    failure_rate_interval: tuple[float, float] | None = None
    # Outputs that differ between repeats of this cell (each repeat against the cell's first
    # clean run). Reported on its own: it does not change the verdict.
    nondeterminism: list[TokenDiff] = []
    run_results: list[RunResult] = []
    comparator: str = "exact"  # the rule divergence and nondeterminism were judged by
    # A knob's cell (`invariance`): the knob, what it changes, and its first difference from the
    # same cell without it (both sides' tokens), if any.
    knob: str | None = None
    knob_changes: str | None = None
    invariance_broken: str | None = None
    # The reference-text score per judged run that made it (None: not a number or not measured).
    reference_nll: list[float | None] = []
    perf: dict[str, MetricSummary] = {}  # metric name (bench.core.perf.METRICS) -> figures
    # Set aside, not counted: absolute checks missed here and by the baseline alike with nothing
    # else against this cell, and contract probes the server refuses. Read under its old name,
    # `unconfirmed_probes`, from a summary.json written before.
    unconfirmed: list[UnconfirmedNote] = Field(
        default=[], validation_alias=AliasChoices("unconfirmed", "unconfirmed_probes"))

    @property
    def nondeterministic(self) -> bool:
        return bool(self.nondeterminism)


class Summary(Record):
    run_id: str
    config_name: str
    started_at: float
    finished_at: float
    interrupted: bool
    cells: list[CellSummary]
    exit_code: int
    preflight: list[PreflightRecord] = []


class PreflightRecord(Record):
    """A check made before any server starts: a checkpoint's headers (inspect), or every tensor
    streamed through an environment's loader and compared with the files (audit); or where a hub
    id was resolved to (fetch: the commit and the snapshot folder in the notes)."""

    type: Literal["preflight"] = "preflight"
    kind: Literal["inspect", "audit", "fetch"]
    model: str
    image: str | None = None
    load_format: str | None = None
    ok: bool
    skipped: bool = False  # the check could not be made here; notes say why
    lost: int = 0  # tensors missing, summed over the orders audited
    problems: list[str] = []
    notes: list[str] = []
    # inspect: the empty shards that end runai-model-streamer's stream (#157) in an order read;
    # None in a record made before this field.
    stream_stop_shards: list[str] | None = None
    # fetch: the hub id, the revision asked and the commit it resolved to (None before these fields).
    hub_id: str | None = None
    revision: str | None = None
    commit: str | None = None


Summary.model_rebuild()
