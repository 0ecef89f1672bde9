"""Version maps and bisect: runs one trial per version and keeps every trial as a folder.

matrix/checkpoint → trial per version (audit, or one cell) → outcome → map or bisect → report.

A map's folder holds versions.json and summary.md (rewritten after every trial: an interrupted
map loses nothing) and one folder per version under trials/ (probes/ in a map written before the
trials had that name, which a continued map keeps using): the audits' JSON reports, or a
regular results folder of the one cell (`regbench report` reads it). Running again with the same
folder continues: a version whose outcome.json is there is not tried again, a cell's results
folder that a kill cut short is resumed like `regbench run --resume`.

A cell trial judges the cell alone: the matrix's baseline is not booted per version, so
divergence from it is not among its findings; empty text, short outputs, known answers, the
reference-text score, boot and exit failures and the pre-flight audit are.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.core.config import CellFilter, Config, Image
from bench.core.errors import RegbenchError
from bench.core.matrix import Cell, expand
from bench.core.stop import StopToken
from bench.core.verdicts import Verdict
from bench.runner import NoProgress, Progress, run_matrix
from bench.serve.errors import ImageUnavailable
from bench.store.publish import open_results
from bench.store.results import ResultsDir, ResultsError
from bench.versions.model import (
    BisectState,
    Kind,
    Outcome,
    Plan,
    VersionMap,
    bisect_state,
    cell_kind,
    mostly_empty,
    settled,
)
from bench.versions.releases import DEFAULT_IMAGE, ReleaseError, ensure_venv, image_ref, own_venv
from bench.versions.render import markdown
from bench.weights.audit import audit_checkpoint
from bench.weights.errors import ReaderError
from bench.weights.model import AuditReport
from bench.weights.overlays import OverlayError, ensure_overlay

# A trial runs one version into its folder and returns the settled outcome, or None when it was
# interrupted before it settled.
TrialFn = Callable[[str, Path, Plan], Outcome | None]


class VersionsError(RegbenchError, ValueError):
    """A map or bisect that cannot run as asked: a folder holding another map, a cell not in the matrix."""


def audit_kind(report: AuditReport) -> tuple[Kind, str]:
    """Silent loss first: it is what the audit is for, and what a user would not see."""
    silent = [r for r in report.runs if r.missing and not r.error and not r.unsupported]
    loud = [r for r in report.runs if r.error]
    altered = [r for r in report.runs if r.problem and not r.missing and not r.error]
    for kind, runs in ((Kind.LOSES_WEIGHTS, silent), (Kind.FAILS_AT_LOAD, loud), (Kind.ALTERS_WEIGHTS, altered)):
        if runs:
            return kind, runs[0].line()
    if report.unsupported:
        return Kind.UNSUPPORTED, "; ".join(report.unsupported)
    return Kind.PASSES, f"{report.baseline_tensors}/{report.baseline_tensors} tensors in every order"


@dataclass(frozen=True)
class AuditTrial:
    """The weight audit of one checkpoint, with each runai-model-streamer release as an overlay."""

    checkpoint: Path
    python: str
    cache: Path  # where overlays are installed (bench.weights.overlays)
    pythonpath: tuple[str, ...] = ()  # after the overlay
    env: tuple[tuple[str, str], ...] = ()
    orders: tuple[str, ...] = ("sorted", "listing")
    loaders: tuple[str, ...] = ("streamer",)
    timeout_s: float = 600.0

    def describe(self) -> str:
        return (f"weight audit of {self.checkpoint} (orders {', '.join(self.orders)}; loaders "
                f"{', '.join(self.loaders)}) with {self.python}")

    def __call__(self, version: str, folder: Path, plan: Plan) -> Outcome | None:
        folder.mkdir(parents=True, exist_ok=True)
        rel = _relative(folder)
        try:
            overlay = ensure_overlay(self.python, self.cache, version)
        except OverlayError as exc:
            return Outcome(version=version, kind=Kind.NOT_INSTALLED, detail=str(exc), folder=rel)
        reports = [AuditReport.model_validate_json(p.read_text()) for p in sorted(folder.glob("audit-*.json"))]
        kinds = [audit_kind(r) for r in reports]
        while not settled(sum(k != Kind.PASSES for k, _ in kinds), len(kinds), plan):
            try:
                report = audit_checkpoint(self.checkpoint, self.python, [str(overlay), *self.pythonpath],
                                          dict(self.env), orders=self.orders, loaders=self.loaders,
                                          timeout_s=self.timeout_s)
            except ReaderError as exc:
                return Outcome(version=version, kind=Kind.NOT_INSTALLED, detail=f"the reader cannot run: {exc}",
                               folder=rel)
            _write(folder / f"audit-{len(kinds) + 1}.json", report.model_dump_json(indent=1))
            kinds.append(audit_kind(report))
            if kinds[-1][0] == Kind.UNSUPPORTED:
                break  # the same API every time: repeating cannot tell more
        failing = [(k, d) for k, d in kinds if k != Kind.PASSES]
        kind, detail = failing[0] if failing else kinds[-1]
        return Outcome(version=version, kind=kind, detail=detail, runs=len(kinds), failures=len(failing), folder=rel)


@dataclass(frozen=True)
class CellTrial:
    """One cell of a matrix, booted fresh per repeat, with one axis set to each version in turn:
    a runai-model-streamer overlay first on the cell's image's PYTHONPATH (local images), one
    of the matrix's images by name (vLLM releases as venvs, container image tags), or a vLLM
    release (`vllm`): the cell's image with its Python swapped for that release's cached venv
    (local), or its reference for the template's tag (docker); the rest of the image kept."""

    config: Config
    cell: Cell
    axis: str  # "runai-model-streamer", "image" or "vllm"
    cache: Path
    progress: Progress | None = None
    stop: StopToken | None = None
    vllm_cache: Path | None = None  # axis vllm, local: where release venvs are (bench.versions.releases)
    vllm_image: str = DEFAULT_IMAGE  # axis vllm, docker: the tag template
    installer: tuple[str, ...] | None = None  # axis vllm: the install command (default setup-vllm.sh --venv)
    say: Callable[[str], None] | None = None  # what a long install tells while it runs

    def describe(self) -> str:
        return f"cell {self.cell.id} of {self.config.name} ({self.cell.model.name}, {self.cell.load_format.name})"

    def image_for(self, version: str) -> Image:
        if self.axis == "image":
            found = [i for i in self.config.images if i.name == version]
            if not found:
                raise VersionsError(f"no image {version!r} in {self.config.name}: "
                                    f"{', '.join(i.name for i in self.config.images)}")
            return found[0]
        if self.axis == "vllm":
            return self.release_image(version)
        if self.cell.image.ref is not None:
            raise VersionsError(f"{self.cell.image.name} is a container image: streamer overlays are for local "
                                "images; map container images by tag (--image) instead")
        overlay = ensure_overlay(self.cell.image.python, self.cache, version)
        return self.cell.image.model_copy(update={
            "name": f"streamer-{version}", "pythonpath": [str(overlay), *self.cell.image.pythonpath]})

    def release_image(self, version: str) -> Image:
        """The cell's image serving vLLM `version`: a setup-vllm.sh venv the image already is, else
        the release's venv in the cache (installed now if need be); in a container, the tag."""
        base = self.cell.image
        name = f"vllm-{version}"
        if base.ref is not None:
            return base.model_copy(update={"name": name, "ref": image_ref(self.vllm_image, version)})
        if self.vllm_cache is None:
            raise VersionsError("a vLLM release map needs a cache folder for the releases' venvs")
        venv = own_venv(base.python, version) or ensure_venv(self.vllm_cache, version, self.installer,
                                                             self.say or (lambda s: None))
        return base.model_copy(update={"name": name, "python": str(venv / "bin" / "python")})

    def trial_config(self, image: Image, plan: Plan) -> Config:
        only = CellFilter(model=self.cell.model.name, load_format=self.cell.load_format.name,
                          platform=self.cell.platform, image=image.name)
        return self.config.model_copy(update={
            # No invariance knobs: a trial is the one cell, and its outcome that cell's alone.
            "images": [image], "include": [only], "exclude": [], "baseline": None, "invariance": [],
            "repeats": plan.repeats, "detect": None, "early_stop": False,
        })

    def __call__(self, version: str, folder: Path, plan: Plan) -> Outcome | None:
        rel = _relative(folder)
        try:
            image = self.image_for(version)
        except (OverlayError, ReleaseError) as exc:
            return Outcome(version=version, kind=Kind.NOT_INSTALLED, detail=str(exc), folder=rel)
        done: frozenset[tuple[str, int]] = frozenset()
        if (folder / "config.yaml").is_file():
            results = open_results(folder)
            try:
                done = frozenset(results.prepare_resume())
            except (ResultsError, OSError, ValueError) as exc:
                raise VersionsError(f"cannot resume the trial in {folder}: {exc}") from None
            config = results.config()
        else:
            config = self.trial_config(image, plan)
            folder.parent.mkdir(parents=True, exist_ok=True)
            results = ResultsDir.create(folder.parent, folder.name, config)
        cells = expand(config)
        try:
            summary = run_matrix(config, cells, results, progress=self.progress or NoProgress(), done=done,
                                 stop=self.stop, settled=lambda f, n, planned: settled(f, n, plan)).summary
        except ImageUnavailable as exc:
            if self.axis != "vllm":
                raise
            # A release's tag the registry would not give: nothing said of that release.
            return Outcome(version=version, kind=Kind.NOT_INSTALLED, detail=str(exc), folder=rel)
        [cell] = summary.cells
        if cell.verdict == Verdict.NOT_RUNNABLE:  # no server could start here: nothing said of vLLM
            return Outcome(version=version, kind=Kind.NOT_INSTALLED, detail=cell.example or "not runnable here",
                           folder=rel)
        if cell.runs == 0 or (summary.interrupted and not settled(cell.failures, cell.runs, plan)):
            return None
        empty = mostly_empty(cell, len(config.workload.prompts))
        kind = cell_kind(set(cell.reasons), empty) if cell.failures else Kind.PASSES
        detail = cell.example or ", ".join(sorted(cell.reasons))
        return Outcome(version=version, kind=kind, detail=detail if cell.failures else "", runs=cell.runs,
                       failures=cell.failures, folder=rel)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _trial_folder(root: Path, version: str) -> Path:
    """A map written before its trials had that name keeps them, and adds new ones, in probes/."""
    old = root / "probes"
    return (old if old.is_dir() else root / "trials") / version


def _relative(folder: Path) -> str:
    """A trial's folder as its outcome names it: relative to the map's folder."""
    return str(Path(folder.parent.name) / folder.name)


def _cached(root: Path, version: str) -> Outcome | None:
    path = _trial_folder(root, version) / "outcome.json"
    return Outcome.model_validate_json(path.read_text()) if path.is_file() else None


def open_map(root: Path, fresh: VersionMap) -> VersionMap:
    """The map to continue in `root`: the one there if it asks the same question, else a new one."""
    path = root / "versions.json"
    if not path.is_file():
        root.mkdir(parents=True, exist_ok=True)
        return fresh
    old = VersionMap.model_validate_json(path.read_text())
    same = ("mode", "axis", "trial", "versions", "plan", "good", "bad")
    differs = [k for k in same if getattr(old, k) != getattr(fresh, k)]
    if differs:
        raise VersionsError(f"{root} holds another {old.mode} ({', '.join(differs)} differ): use another folder")
    return old.model_copy(update={"interrupted": False})


def _trial(trial: TrialFn, root: Path, version: str, plan: Plan) -> Outcome | None:
    cached = _cached(root, version)
    if cached is not None:
        return cached
    folder = _trial_folder(root, version)
    outcome = trial(version, folder, plan)
    if outcome is not None:
        folder.mkdir(parents=True, exist_ok=True)
        _write(folder / "outcome.json", outcome.model_dump_json(indent=1))
    return outcome


def _walk(trial: TrialFn, root: Path, vmap: VersionMap, save: Callable[[VersionMap], None],
          status: Callable[[str], None], choose: Callable[[dict[str, Outcome]], str | None]) -> VersionMap:
    """Tries what `choose` names next, given the outcomes so far, until it names nothing; the map
    is saved after every trial, and an interrupt ends it as interrupted."""
    outcomes = {o.version: o for o in vmap.outcomes}
    try:
        while (version := choose(outcomes)) is not None:
            status(f"{version}: trying")
            outcome = _trial(trial, root, version, vmap.plan)
            if outcome is None:
                vmap = vmap.model_copy(update={"interrupted": True})
                break
            outcomes[version] = outcome
            vmap = vmap.model_copy(update={"outcomes": [*vmap.outcomes, outcome]})
            status(f"{version}: {outcome.kind.words}")
            save(vmap)
    except KeyboardInterrupt:
        vmap = vmap.model_copy(update={"interrupted": True})
    save(vmap)
    return vmap


def run_map(trial: TrialFn, root: Path, vmap: VersionMap, save: Callable[[VersionMap], None],
            status: Callable[[str], None] = lambda s: None) -> VersionMap:
    """Every version, in order."""
    return _walk(trial, root, vmap, save, status, lambda have: next((v for v in vmap.versions if v not in have), None))


def run_bisect(trial: TrialFn, root: Path, vmap: VersionMap, save: Callable[[VersionMap], None],
               status: Callable[[str], None] = lambda s: None) -> VersionMap:
    """Tries the ends, then the middle of what is left, until the change point is found."""
    if vmap.good is None or vmap.bad is None:
        raise VersionsError("a bisect needs a good and a bad end")
    good, bad = vmap.good, vmap.bad

    def state(have: dict[str, Outcome]) -> BisectState:
        return bisect_state(vmap.versions, good, bad, have)

    walked = _walk(trial, root, vmap, save, status, lambda have: state(have).next)
    done = walked.model_copy(update={"bisect": state({o.version: o for o in walked.outcomes})})
    save(done)
    return done


def write_versions(root: Path, vmap: VersionMap) -> None:
    root.mkdir(parents=True, exist_ok=True)
    _write(root / "versions.json", vmap.model_dump_json(indent=1))
    _write(root / "summary.md", markdown(vmap))


def find_cell(config: Config, cell_id: str) -> Cell:
    cells = {c.id: c for c in expand(config)}
    if cell_id not in cells:
        raise VersionsError(f"--cell: no cell {cell_id!r} in {config.name}; `regbench plan` lists them")
    cell = cells[cell_id]
    if cell.knob is not None:
        # Its verdict is a comparison with another cell's servers: no one-cell trial can settle it.
        raise VersionsError(f"--cell {cell_id}: an invariance knob's cell is judged against {cell.baseline_id}, "
                            "so a trial of it alone settles nothing; bisect that cell, or run the matrix "
                            "once per version and compare")
    return cell
