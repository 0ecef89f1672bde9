"""`regbench report-bug`: one failing cell as a Markdown issue for upstream. Pure: a BugReport in,
text out (bench.bugreport.gather gathers it from the results folder, redacts and writes).

The sections are those of vLLM's bug-report issue form (vllm-project/vllm,
.github/ISSUE_TEMPLATE/400-bug-report.yml: title "[Bug]: ", "Your current environment",
"🐛 Describe the bug", "Before submitting a new issue..."), which GitHub turns into `### label`
headings of the issue body. runai-model-streamer has no issue template (run-ai/runai-model-streamer
has no .github/ISSUE_TEMPLATE), so an issue for it gets the same sections.

Text from the records (server logs, model outputs, tracebacks) is untrusted: it goes into code
blocks whose fence is longer than any backtick run inside, so that it cannot close the block or
turn into Markdown (a mention, a link, an HTML tag) in the issue.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bench.core.diagnosis import CellDiagnosis, Match
from bench.core.evidence import ExitEpisode, TokenDivergence
from bench.core.records import CellSummary, Fingerprint
from bench.core.stats import percent_range

VLLM_TEMPLATE = "vllm-project/vllm .github/ISSUE_TEMPLATE/400-bug-report.yml"
STREAMER_PREFIX = "runai-"  # a signature id of runai-model-streamer's issues
EPISODE_LINES = 30  # of an exit-time exception: the end of it, where the raise is
# collect_env prints ~100 lines (~5,000 characters); more is a host with many GPUs (its topology
# matrix), packages or variables. Its head has the versions and its tail the variables: both are
# kept, the middle cut. GitHub takes 65,536 characters per issue body, the rest of the report too.
COLLECT_ENV_HEAD, COLLECT_ENV_TAIL = 200, 100
COLLECT_ENV_CHARS = 20_000
COLLECT_ENV_LINE_CHARS = 2_000  # lscpu's flags line is ~1,500


@dataclass(frozen=True)
class BugReport:
    """Everything one issue says of a failing cell, gathered by bench.bugreport.gather."""

    run_id: str
    cell: CellSummary  # the judge's (bench.core.judge.judge)
    diagnosis: CellDiagnosis  # bench.store.evidence.diagnose_results
    fingerprint: Fingerprint | None  # the environment that served the cell
    launcher: str  # "local" or "docker"
    matrix_file: str  # the one-cell matrix written beside the report
    serve_command: str  # the run's own command line of the first failing run, runnable in a shell
    serve_where: str  # where that command runs ("on the host", "inside a container of …")
    curl_command: str  # one request of the workload, as the client sent it
    prompt_id: str
    collect_env_command: str  # vLLM's collect_env in the cell's environment
    first_failing_repeat: int
    divergence: TokenDivergence | None = None  # the first one (lowest position) of the cells' runs
    exit_exception: ExitEpisode | None = None
    # What collect_env printed when bench.bugreport.gather ran it, or why it could not (both None:
    # it was not asked to, `--no-collect-env`).
    collect_env_output: str | None = None
    collect_env_error: str | None = None

    @property
    def cause(self) -> Match | None:
        return self.diagnosis.matches[0] if self.diagnosis.matches else None

    @property
    def upstream(self) -> str:
        """The repository the issue is for."""
        cause = self.cause
        if cause is not None and cause.signature.startswith(STREAMER_PREFIX):
            return "run-ai/runai-model-streamer"
        return "vllm-project/vllm"

    @property
    def audit_command(self) -> str | None:
        """The first matching signature's confirm command, as the diagnosis filled it in."""
        return next((m.confirm for m in self.diagnosis.matches if m.confirm), None)


def fence(text: str, lang: str = "") -> list[str]:
    """A fenced code block that no backtick run in `text` can close."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    bar = "`" * max(3, longest + 1)
    return [f"{bar}{lang}", text.rstrip("\n"), bar]


def _code(text: str) -> str:
    """An inline code span for a short untrusted string."""
    text = text.replace("\n", " ")
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    bar = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{bar}{pad}{text}{pad}{bar}"


def rate(cell: CellSummary) -> str:
    """"2/2 runs failed (failure rate 34–100 %, Wilson 95 % interval)"."""
    interval = f"failure rate {percent_range(*cell.failure_rate_interval)}, Wilson 95 % interval" \
        if cell.failure_rate_interval else "no run judged"
    return f"{cell.failures}/{cell.runs} runs failed ({interval})"


def title(r: BugReport) -> str:
    fp, cell = r.fingerprint, r.cell
    cause = r.cause
    what = cause.title if cause is not None and not cause.symptom_only else \
        f"{', '.join(sorted(cell.reasons))} with --load-format {cell.load_format}"
    if r.upstream == "vllm-project/vllm":
        version = f" (vLLM {fp.vllm})" if fp and fp.vllm else ""
        return f"[Bug]: {what}{version}"
    version = f" {fp.runai_model_streamer}" if fp and fp.runai_model_streamer else ""
    return f"runai-model-streamer{version}: {what}"


def environment_lines(fp: Fingerprint | None, launcher: str, platform: str) -> list[str]:
    if fp is None:
        return ["(no fingerprint of this image was recorded)"]
    rows = [("vLLM", fp.vllm), ("runai-model-streamer", fp.runai_model_streamer), ("torch", fp.torch),
            ("CUDA", fp.cuda), ("Python", fp.python), ("transformers", fp.transformers), ("triton", fp.triton),
            ("flashinfer", fp.flashinfer), ("NCCL", fp.nccl), ("cuDNN", fp.cudnn), ("nvidia-modelopt", fp.modelopt),
            ("arch", fp.arch), ("CPU", fp.cpu), ("GPU", fp.gpu), ("launcher", launcher), ("platform", platform),
            ("image", fp.image)]
    if fp.image_ref:
        pin = fp.image_pin or fp.image_digest or fp.image_id
        rows.append(("image ref", f"{fp.image_ref} → {pin}" if pin else fp.image_ref))
    if fp.error:
        rows.append(("fingerprint error", fp.error))
    width = max(len(k) for k, _ in rows)
    return [f"{k:<{width}} : {v}" for k, v in rows if v]


def trim_lines(text: str, head: int = COLLECT_ENV_HEAD, tail: int = COLLECT_ENV_TAIL,
               chars: int = COLLECT_ENV_CHARS, width: int = COLLECT_ENV_LINE_CHARS) -> tuple[str, int]:
    """`text` with each line cut at `width`, and its middle lines cut when it has more than
    head + tail lines or `chars` characters (the head gets two thirds of them); and how many lines
    were cut (0: none)."""
    lines = [line if len(line) <= width else line[:width] + " […]" for line in text.rstrip("\n").splitlines()]
    if len(lines) <= head + tail and sum(len(line) + 1 for line in lines) <= chars:
        return "\n".join(lines), 0

    def take(seq: list[str], most: int, budget: int) -> list[str]:
        kept: list[str] = []
        for line in seq[:most]:
            budget -= len(line) + 1
            if budget < 0:
                break
            kept.append(line)
        return kept

    first = take(lines, head, chars * 2 // 3)
    last = take(lines[len(first):][::-1], tail, chars - chars * 2 // 3)[::-1]
    cut = len(lines) - len(first) - len(last)
    return "\n".join([*first, f"[… {cut} lines cut by regbench …]", *last]), cut


def _collect_env(r: BugReport) -> list[str]:
    """The output the form asks for, in its own <details> block, or why there is none."""
    ask = "Its output is what this section asks for; in the failing cell's environment:"
    if r.collect_env_output is None:
        why = f"could not be run here: {_code(r.collect_env_error)}" if r.collect_env_error is not None \
            else "was not run (`--no-collect-env`)"
        return [f"vLLM's `collect_env` {why}. {ask}", "", *fence(r.collect_env_command, "sh")]
    output, cut = trim_lines(r.collect_env_output)
    note = f" ({cut} lines cut from its middle)" if cut else ""
    return ["<details>",
            f"<summary>The output of <code>python -m vllm.collect_env</code>, run by regbench in the failing "
            f"cell's environment{note}</summary>", "", *fence(output, "text"), "", "</details>", "",
            "It was run as:", "", *fence(r.collect_env_command, "sh")]


def _reproduction(r: BugReport) -> list[str]:
    lines = ["#### Minimal reproduction", ""]
    step = 1
    if r.audit_command:
        lines += [f"{step}. Without a server: stream every tensor of the checkpoint through the loader, in the "
                  "environment of the failing cell, and compare with the files (regbench's audit; exit 1 = "
                  "tensors lost, which is what this cell shows):", "", *fence(r.audit_command, "sh"), ""]
        step += 1
    lines += [f"{step}. The server exactly as the failing run started it ({r.serve_where}; run "
              f"{r.first_failing_repeat} of the cell):", "", *fence(r.serve_command, "sh"), "",
              f"{step + 1}. One request of the workload (prompt `{r.prompt_id}`), with the sampling settings the "
              "bench sends:", "", *fence(r.curl_command, "sh"), "",
              f"{step + 2}. The whole cell again, fresh servers and judgement included, from the one-cell matrix "
              "written beside this report:", "", *fence(f"regbench run {r.matrix_file}", "sh"), ""]
    return lines


def _divergence(d: TokenDivergence) -> str:
    """The divergence finding's text, with both tokens where that text names the position only."""
    text = d.text()
    if d.comparator != "exact" or d.token_logprob is not None:
        return text

    def side(token: int | None, token_text: str | None) -> str:
        if token is None:
            return "(its output ended)"
        return f"id {token}" + (f" {token_text!r}" if token_text is not None else "")

    return f"{text}: {side(d.token, d.token_text)} vs baseline {side(d.baseline_token, d.baseline_text)}"


def _observed(r: BugReport) -> list[str]:
    cell, d = r.cell, r.diagnosis
    lines = ["#### What the bench saw", "",
             f"- Verdict **{str(cell.verdict).upper()}**: {rate(cell)}, each on a fresh server.",
             "- Findings (runs showing each): "
             + ", ".join(f"`{reason}` ({n}/{cell.runs})" for reason, n in sorted(cell.reasons.items()))]
    if cell.example:
        lines.append(f"- First finding: {_code(cell.example)}")
    if r.divergence is not None:
        lines.append(f"- First divergence from the baseline cell `{cell.baseline_id}`: {_code(_divergence(r.divergence))}")
    if cell.invariance_broken:
        lines.append(f"- Invariance ({cell.knob_changes}): {_code(cell.invariance_broken)}")
    lines.append(f"- Contrast over the matrix: {d.contrast}")
    lines += [f"- Pre-flight {_code(p)}" for p in d.preflight]
    lines.append("")
    if d.log_evidence:
        lines += ["Server log (weight loaders, load time, warnings, errors, tracebacks):", "",
                  *fence("\n".join(d.log_evidence), "text"), ""]
    if d.log_context:
        lines += ["Context, not evidence (the passing cells' server logs say it too):", "",
                  *fence("\n".join(d.log_context), "text"), ""]
    if r.exit_exception is not None:
        episode = "\n".join(r.exit_exception.episode.splitlines()[-EPISODE_LINES:])
        head = f": {_code(r.exit_exception.exception)}" if r.exit_exception.exception else ""
        lines += [f"Exception printed at exit{head}", "", *fence(episode, "text"), ""]
    return lines


def _cause(r: BugReport) -> list[str]:
    cause = r.cause
    if cause is None:
        return ["#### Known issue", "", "No known signature matches; the evidence above is all there is.", ""]
    lines = ["#### Known issue this matches", "",
             f"**{cause.title}** (regbench signature `{cause.signature}`: {len(cause.supports)} facts for, "
             f"{len(cause.contradicts)} against, {len(cause.unknown)} not known)", ""]
    if cause.symptom_only:
        lines += ["This signature names a symptom that accompanies failures, not their cause.", ""]
    lines += [cause.explanation, ""]
    lines += [f"- for: {e.says}" for e in cause.supports]
    lines += [f"- against: {e.says}" for e in cause.contradicts]
    lines += [f"- references: {ref}" for ref in cause.references]
    lines += [f"- fix {n}: {fix}" for n, fix in enumerate(cause.fixes, 1)]
    others = r.diagnosis.matches[1:]
    if others:
        lines.append("- also matches: " + ", ".join(f"`{m.signature}` ({m.title})" for m in others))
    return [*lines, ""]


def render(r: BugReport) -> str:
    cell = r.cell
    lines = [
        f"<!-- An issue for {r.upstream}, in the sections of vLLM's bug-report form ({VLLM_TEMPLATE})."
        + (" runai-model-streamer has no issue template of its own." if r.upstream != "vllm-project/vllm" else "")
        + f" Written by `regbench report-bug` from results {r.run_id}, cell {cell.cell_id}. -->",
        "",
        f"# {title(r)}",
        "",
        "### Your current environment",
        "",
        "<details>",
        "<summary>The environment of the failing cell, as regbench fingerprinted it</summary>",
        "",
        *fence("\n".join(environment_lines(r.fingerprint, r.launcher, cell.platform)), "text"),
        "",
        "</details>",
        "",
        *_collect_env(r),
        "",
        "### 🐛 Describe the bug",
        "",
        f"Serving `{cell.model}` with `--load-format {cell.load_format}` returns HTTP 200 and wrong output: "
        f"{rate(cell)}." + (f" The baseline cell `{cell.baseline_id}` (the same model otherwise served the same "
                            "way) shows what the answers should be." if cell.baseline_id else ""),
        "",
        *_reproduction(r),
        *_observed(r),
        *_cause(r),
        "### Before submitting a new issue...",
        "",
        "- [ ] Make sure you already searched for relevant issues" + (
            ", and asked the chatbot living at the bottom right corner of vLLM's documentation page, "
            "which can answer lots of frequently asked questions."
            if r.upstream == "vllm-project/vllm" else "."),
    ]
    return "\n".join(lines) + "\n"
