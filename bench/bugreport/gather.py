"""The I/O edge of `regbench report-bug`: one failing cell of a results folder gathered into a
bench.bugreport.render.BugReport (the verdict from bench.core.judge.judge, the diagnosis from
bench.store.evidence, the environment from its fingerprint, the commands from the records and the
matrix as run), rendered, redacted and written beside the records with a one-cell matrix.

vLLM's form asks for the output of its collect_env; that is run (bench.bugreport.collect_env), in the
cell's environment where this host has it: the image's Python with its overlay and variables (local launcher), or a
container of the image the run was pinned to (docker launcher; nothing is pulled for a report).
When it cannot run, the report says why and gives the command instead: a report is not refused
for want of it."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bench.bugreport.collect_env import COLLECT_ENV, SECRET_LOOKING, CollectEnvError, run_collect_env_local
from bench.bugreport.render import BugReport, render
from bench.core.config import CellFilter, Config, ConfigError, Invariance, Prompt, parse_config
from bench.core.evidence import ExitEpisode, TokenDivergence
from bench.core.judge import judge
from bench.core.matrix import Cell, matrix_image
from bench.core.records import CellSummary, Fingerprint, RunRecord, Summary
from bench.core.redact import Redactor, redactor_for
from bench.core.request import endpoint, request_body
from bench.serve.launch import HOST, OVERLAY_ROOT, image_env, serve_args, server_env
from bench.serve.launchers import needs
from bench.store.evidence import diagnose_results
from bench.store.publish import open_results
from bench.store.results import write_config

DEFAULT_PORT = 8000  # for a cell with no run record to take its port from


@dataclass(frozen=True)
class WrittenBugReport:
    report: Path
    matrix: Path
    warnings: list[str] = field(default_factory=list)  # redacted, for stderr


def report_redactor(config: Config, env: Mapping[str, str]) -> Redactor:
    """The run's redaction (the matrix's passed-through names, variables that say they are
    secrets, credential shapes), plus the values of every variable whose name looks like a secret:
    those of the environment now, and those the matrix itself sets for its servers."""
    secrets = {n: v for n, v in env.items() if SECRET_LOOKING.search(n)}
    blocks = [("server", config.server.env), *((f"image.{i.name}", i.env) for i in config.images),
              *((f"load_format.{f.name}", f.env) for f in config.load_formats),
              *((f"profile.{p.name}", p.env) for p in config.profiles),
              *((f"knob.{k.name}", k.env) for b in config.invariance for k in b.knobs)]
    for where, block in blocks:
        # Keyed apart from the environment's: the matrix may set another value under the same name.
        secrets.update({f"{where}.{n}": v for n, v in block.items() if SECRET_LOOKING.search(n)})
    return redactor_for([*config.server.env_passthrough, *secrets], {**env, **secrets})


def one_cell_config(config: Config, cells: Mapping[str, Cell], cell: Cell) -> Config:
    """The matrix as run, reduced to one cell and what it is compared with (its baseline cell; for
    an invariance knob's cell, the cell without the knob and that one's baseline)."""
    wanted = [cell]
    while wanted[-1].baseline_id in cells and len(wanted) < 3:
        wanted.append(cells[str(wanted[-1].baseline_id)])
    plain = [c for c in wanted if c.knob is None]
    axes = {"model": {c.model.name for c in plain}, "load_format": {c.load_format.name for c in plain},
            "platform": {c.platform for c in plain}, "image": {c.image.name for c in plain}}
    invariance = []
    if cell.knob is not None and cell.baseline_id in cells:
        block = next((b for b in config.invariance if any(k.name == cell.knob.name for k in b.knobs)), None)
        invariance = [Invariance(knobs=[cell.knob], cells=[_filter(cells[str(cell.baseline_id)])],
                                 comparison=block.comparison if block else None)]
    baseline = config.baseline
    if baseline is not None and any(v not in axes[k] for k, v in baseline.axes().items()):
        baseline = None  # its baseline cell is not in this matrix: the cell was run without one
    reduced = config.model_copy(update={
        "models": [m for m in config.models if m.name in axes["model"]],
        "load_formats": [f for f in config.load_formats if f.name in axes["load_format"]],
        "platforms": [p for p in config.platforms if p in axes["platform"]],
        "images": [i for i in config.images if i.name in axes["image"]],
        "profiles": [p for p in config.profiles if p.name in axes["platform"]],
        "include": [_filter(c) for c in plain], "exclude": [], "invariance": invariance, "baseline": baseline,
    })
    return parse_config(reduced.model_dump(mode="json"), f"the one-cell matrix of {cell.id}")


def _filter(cell: Cell) -> CellFilter:
    return CellFilter(model=cell.model.name, load_format=cell.load_format.name, platform=cell.platform,
                      image=cell.image.name)


def _assignments(env: Mapping[str, str]) -> str:
    """NAME=value words for a shell; a secret-looking variable is referred to, never written."""
    return " ".join(f'{k}="${k}"' if SECRET_LOOKING.search(k) else f"{k}={shlex.quote(v)}" for k, v in env.items())


def _port(argv: list[str]) -> int:
    if "--port" in argv[:-1]:
        value = argv[argv.index("--port") + 1]
        if value.isdigit():
            return int(value)
    return DEFAULT_PORT


def serve_command(cell: Cell, boxed: bool, run: RunRecord | None, pin: str | None) -> tuple[str, str, list[str]]:
    """(the command line, where it runs, its argv): the run's own, with the variables the bench
    set for the cell's servers in front of it."""
    env = {**server_env(cell, cell.server, cell.profile), **image_env(cell.image, {})}
    if boxed:
        # Recorded as [image ref, serve, ...]: the image's entrypoint runs vLLM's CLI.
        args = run.server.command[1:] if run else serve_args(cell, cell.server, DEFAULT_PORT, cell.model.path)
        env.pop("PYTHONPATH", None)  # folders inside the container, mounted by the bench
        where = f"inside a container of `{pin or cell.image.ref}` (the model mounted at `{args[1]}`)"
        return " ".join(filter(None, (_assignments(env), "vllm", shlex.join(args)))), where, args
    argv = run.server.command if run else [cell.image.python, "-m", "vllm.entrypoints.cli.main",
                                           *serve_args(cell, cell.server, DEFAULT_PORT, cell.model.path)]
    return " ".join(filter(None, (_assignments(env), shlex.join(argv)))), "on the host", argv


def curl_command(cell: Cell, prompt: Prompt, port: int, api_key: bool) -> str:
    """The request bench.serve.client._send makes for a prompt, as curl: the same body, the
    bench's extra sampling fields included."""
    body = request_body(prompt, cell.workload, cell.model.served, cell.logprobs_k)
    url = f"http://{HOST}:{port}/v1/{endpoint(prompt)}"
    auth = ' -H "Authorization: Bearer $VLLM_API_KEY"' if api_key else ""
    return f"{shlex.join(['curl', '-sS', url, '-H', 'Content-Type: application/json'])}{auth} -d " \
        + shlex.quote(json.dumps(body, ensure_ascii=False))


def _collect_env(cell: Cell, boxed: bool, pin: str | None) -> str:
    """The command that runs collect_env as run_collect_env_local / run_collect_env_docker do."""
    if not boxed:
        return " ".join(filter(None, (_assignments(image_env(cell.image, {})), shlex.join([cell.image.python,
                                                                                            *COLLECT_ENV]))))
    d = cell.profile.docker
    words = ["docker", "run", "--rm", "--network", "host"]
    if d.runtime:
        words += ["--runtime", d.runtime]
    elif d.gpus != "none":  # what collect_env reports of the GPUs is what the container is given
        words += ["--gpus", str(d.gpus)]
    for i, path in enumerate(cell.image.pythonpath):
        words += ["-v", f"{path}:{OVERLAY_ROOT}/{i}:ro"]
    overlays = [f"{OVERLAY_ROOT}/{i}" for i in range(len(cell.image.pythonpath))]
    for name, value in image_env(cell.image.model_copy(update={"pythonpath": overlays}), {}).items():
        # A secret-looking variable is passed from the shell's environment by name, never written.
        words += ["-e", name if SECRET_LOOKING.search(name) else f"{name}={value}"]
    return shlex.join([*words, "--entrypoint", cell.image.python, pin or cell.image.ref or "", *COLLECT_ENV])


def _first_divergence(judged: CellSummary) -> TokenDivergence | None:
    """Both tokens at the first divergence from the baseline cell (a knob's cell: from the cell
    without the knob), read from the verdict's own findings."""
    evidence = [(f.evidence.position, r.repeat, f.evidence) for r in judged.run_results for f in r.findings
                if isinstance(f.evidence, TokenDivergence)]
    return min(evidence, key=lambda x: (x[0], x[1]))[2] if evidence else None


def _failing_cell(summary: Summary, cell_id: str, path: Path) -> CellSummary:
    """The judged cell a report is for; a ConfigError for one the run lacks or one that did not fail."""
    judged = next((c for c in summary.cells if c.cell_id == cell_id), None)
    if judged is None:
        known = ", ".join(c.cell_id for c in summary.cells)
        raise ConfigError(f"--cell {cell_id}: no such cell in {path} (its cells: {known})")
    if not judged.verdict.failing:
        raise ConfigError(f"--cell {cell_id}: {str(judged.verdict).upper()} in {path}; "
                          "a bug report is for a cell that failed or was flaky")
    return judged


def _fingerprint(fingerprints: list[Fingerprint], cell: Cell) -> Fingerprint | None:
    """The cell's image's fingerprint: the last fingerprint of an image wins, as in the diagnosis."""
    fingerprint = None
    for f in fingerprints:
        if f.image == matrix_image(cell.image.name):
            fingerprint = f
    return fingerprint


def _run_collect_env(cell: Cell, boxed: bool, pin: str | None, run_id: str, env: Mapping[str, str] | None,
                     warnings: list[str]) -> tuple[str | None, str | None]:
    """(vLLM's collect_env output, why it could not be run): in a container of the image or on
    the host, as the cell's servers ran; why it could not also goes to `warnings`."""
    try:
        if boxed:
            # Here, not at the top: the docker SDK only for a report of a container's cell.
            from bench.bugreport.collect_env_docker import run_collect_env_docker

            return run_collect_env_docker(cell, pin or str(cell.image.ref), run_id, warnings), None
        return run_collect_env_local(cell, os.environ if env is None else env), None
    except CollectEnvError as exc:
        warnings.append(f"vLLM's collect_env could not be run here ({exc}); the report gives its command instead")
        return None, str(exc)


def gather_bug_report(path: Path, cell_id: str, matrix_file: str, env: Mapping[str, str] | None = None,
                      collect_env: bool = True, warnings: list[str] | None = None) -> tuple[BugReport, Config, Config]:
    """The report of one failing or flaky cell, its one-cell matrix, and the matrix as run; with
    `collect_env`, vLLM's collect_env run in the cell's environment (on `env`, by default this
    process's), why it could not be added to `warnings`. Raises ConfigError for a cell the run
    does not have, or one that did not fail."""
    results = open_results(path)
    data = results.load()
    summary = judge(data)
    judged = _failing_cell(summary, cell_id, results.path)
    cells = {c.id: c for c in data.cells()}
    cell = cells[cell_id]
    diagnosis = diagnose_results(results.path, data.config, summary, data.runs, data.requests, data.fingerprints)
    cell_diagnosis = next((d for d in diagnosis.cells if d.cell_id == cell_id), None)
    if cell_diagnosis is None:
        raise ConfigError(f"--cell {cell_id}: the diagnosis has no evidence of this cell")
    runs = sorted((r for r in data.runs_of(cell_id) if not r.interrupted), key=lambda r: r.repeat)
    failed = {r.repeat for r in judged.run_results if r.reasons}
    # A cell failed by its pre-flight audit alone has no failing run: its first run stands for it.
    run = next((r for r in runs if r.repeat in failed), runs[0] if runs else None)
    fingerprint = _fingerprint(data.fingerprints, cell)
    pin = fingerprint.image_pin if fingerprint else None
    # The back-end that runs an image by its reference runs it in a container (as the pre-flight says).
    boxed = "ref" in needs(data.config.launcher)
    command, where, argv = serve_command(cell, boxed, run, pin)
    findings = {r.repeat: r.findings for r in judged.run_results}
    prompt_ids = [f.prompt_id for f in (findings.get(run.repeat, []) if run else []) if f.prompt_id]
    prompt = next((p for p in cell.workload.prompts if p.id in prompt_ids[:1]), cell.workload.prompts[0])
    exit_exception = next((f.evidence for r in runs for f in findings.get(r.repeat, [])
                           if isinstance(f.evidence, ExitEpisode)), None)
    collected, collect_error = None, None
    if collect_env:
        collected, collect_error = _run_collect_env(cell, boxed, pin, results.path.name, env,
                                                    [] if warnings is None else warnings)
    report = BugReport(
        run_id=results.path.name, cell=judged, diagnosis=cell_diagnosis,
        fingerprint=fingerprint, launcher=data.config.launcher, matrix_file=matrix_file,
        serve_command=command, serve_where=where,
        curl_command=curl_command(cell, prompt, _port(argv), "--api-key" in argv), prompt_id=prompt.id,
        collect_env_command=_collect_env(cell, boxed, pin),
        first_failing_repeat=run.repeat if run else 0,
        divergence=_first_divergence(judged),
        exit_exception=exit_exception, collect_env_output=collected, collect_env_error=collect_error,
    )
    return report, one_cell_config(data.config, cells, cell), data.config


def write_bug_report(path: Path, cell_id: str, env: Mapping[str, str] | None = None,
                     collect_env: bool = True) -> WrittenBugReport:
    """DIR/bug-<cell>.md and the one-cell matrix DIR/bug-<cell>.yaml, both redacted; with
    `collect_env`, collect_env run with `env` (by default this process's environment)."""
    results_path = Path(os.path.abspath(path))
    report_path, matrix_path = results_path / f"bug-{cell_id}.md", results_path / f"bug-{cell_id}.yaml"
    env = os.environ if env is None else env
    warnings: list[str] = []
    report, matrix, config = gather_bug_report(results_path, cell_id, str(matrix_path), env, collect_env, warnings)
    # The same redactor over the whole text covers collect_env's output too: it prints the
    # variables it finds relevant (TORCH*, NCCL*, CUDA*, vLLM's own), and its own filter lets
    # through a name such as CUDA_..._KEY whose value this masks.
    redactor = report_redactor(config, env)
    write_config(matrix_path, matrix, redactor)
    report_path.write_text(redactor.text(render(report)), encoding="utf-8")
    return WrittenBugReport(report=report_path, matrix=matrix_path, warnings=[redactor.text(w) for w in warnings])
