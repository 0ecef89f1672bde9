"""Hub ids resolved once, before the cells: the model fetched into the hub cache, then read there.

A model whose `path` is a hub id (org/name) is resolved by ``huggingface_hub.snapshot_download``
into the hub cache before the pre-flight and before any server: the files vLLM reads
(``ALLOW``: safetensors weights and their index, the JSON configs, tokenizer files, the chat
template, remote code), at the model's `revision` (default: the main branch). Every cell then
names the snapshot folder (``<cache>/models--org--name/snapshots/<commit>/``) as its model path:
inspect and audit read it, the local launcher's servers serve it, the docker launcher mounts it
with the blobs its links point to (bench.serve.launch_docker.checkpoint_mounts). So eight fresh
servers do not race one download, and the run records which commit it ran (a `fetch` pre-flight
record: commit, snapshot folder, files, bytes, seconds).

The cache is `server.hub_cache` when set (`~` expanded and made absolute by the config loader; the
folder the docker launcher mounts read-only in its containers: snapshots go to its `hub/`), else
huggingface_hub's own (HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub). HF_HUB_OFFLINE in
the bench's environment means the cache alone (local_files_only); HF_TOKEN is read by
huggingface_hub from the environment, by name: the bench never holds or writes its value.
Anything that stops a hub id from resolving is a HubError, a ConfigError (exit 2) naming the
model's key and the hub id, raised before any cell.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HFValidationError,
    IncompleteSnapshotError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from bench.core.config import Config, ConfigError, Model
from bench.core.matrix import Cell
from bench.core.records import PreflightRecord

# What vLLM reads from a model repository; not the other weight formats a repository may also
# hold (*.bin, *.pt, *.gguf, *.onnx, *.msgpack, *.h5), which would multiply the download.
ALLOW = [
    "*.safetensors", "*.json", "*.jinja",  # weights, their index, configs, chat template
    "tokenizer*", "*.model", "*.tiktoken", "*.txt",  # tokenizers: sentencepiece, tiktoken, merges/vocab
    "*.py",  # --trust-remote-code
]
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
_TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's own reading of a boolean variable


class HubError(ConfigError):
    """A hub id that cannot be resolved; the message names the model's key and the hub id."""


def is_hub_id(path: str) -> bool:
    """A model path that names a hub repository: what bench.store.matrixfile.resolve_paths kept as it was
    (local paths are made absolute there; object-store URIs have a scheme)."""
    return not os.path.isabs(path) and "://" not in path


def offline(env: Mapping[str, str]) -> bool:
    return env.get("HF_HUB_OFFLINE", "").strip().upper() in _TRUE


def cache_folder(hub_cache: str | None, env: Mapping[str, str]) -> str:
    """The hub cache (huggingface_hub's `cache_dir`) the bench fetches into; read at call time,
    so that the environment the bench runs with decides, not the one it was imported in."""
    if hub_cache:
        # The matrix's folder as the schema and the loader made it (`~` expanded, absolute): the one
        # the docker launcher mounts, never a folder that depends on where the bench was started.
        if not os.path.isabs(hub_cache):
            raise ConfigError(f"server.hub_cache: {hub_cache!r} is not an absolute path (a matrix read from a file "
                              "has it made absolute against the file's folder)")
        return os.path.join(hub_cache, "hub")
    if env.get("HF_HUB_CACHE"):
        return os.path.expanduser(env["HF_HUB_CACHE"])
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return os.path.join(os.path.expanduser(home), "hub")


@dataclass(frozen=True)
class Resolved:
    model: str  # the matrix's model name
    repo: str
    revision: str  # as asked ("main" by default)
    commit: str
    snapshot: str
    files: int
    size: int  # bytes of the files, links followed
    seconds: float
    offline: bool

    def record(self) -> PreflightRecord:
        how = "from the cache (HF_HUB_OFFLINE)" if self.offline else "checked against the hub, fetched what was missing"
        notes = [
            f"hub id {self.repo} at {self.revision}: commit {self.commit}",
            f"snapshot {self.snapshot}",
            f"{self.files} files, {self.size / 1e6:.1f} MB, {self.seconds:.1f} s, {how}",
        ]
        return PreflightRecord(kind="fetch", model=self.model, ok=True, hub_id=self.repo, revision=self.revision,
                               commit=self.commit, notes=notes)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _what(key: str, model: Model, revision: str) -> str:
    return f"{key}: model {model.name!r}, hub id {model.path!r} at revision {revision!r}"


def resolve(model: Model, key: str, cache_dir: str, env: Mapping[str, str],
            say: Callable[[str], None] = _say) -> Resolved:
    """Resolves one hub-id model into `cache_dir`; `key` names it in errors (models.N)."""
    revision = model.revision or "main"
    what = _what(f"{key}.path", model, revision)
    if not HUB_ID.fullmatch(model.path):
        raise HubError(f"{key}.path: {model.path!r} is neither a local folder nor a hub id (org/name)")
    local_only = offline(env)
    say(f"hub: {model.path} at {revision} into {cache_dir}" + (" (offline: the cache only)" if local_only else ""))
    t0 = time.monotonic()
    try:
        snapshot = snapshot_download(model.path, revision=revision, cache_dir=cache_dir, allow_patterns=ALLOW,
                                     local_files_only=local_only)
    except IncompleteSnapshotError as exc:
        raise HubError(f"{what}: the cached snapshot is incomplete ({exc})") from None
    except LocalEntryNotFoundError as exc:
        if local_only:
            raise HubError(f"{what}: not in the hub cache {cache_dir}, and HF_HUB_OFFLINE is set: fetch it once "
                           f"with the network (HF_HUB_OFFLINE unset), or give {key}.path a local folder") from None
        raise HubError(f"{what}: not in the hub cache {cache_dir} and the hub cannot be reached: {exc}") from None
    except RevisionNotFoundError:
        raise HubError(f"{_what(f'{key}.revision', model, revision)}: the repository has no such revision") from None
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise HubError(f"{what}: no such repository, or it needs a token this environment's HF_TOKEN "
                       f"does not give ({type(exc).__name__})") from None
    except HFValidationError as exc:
        raise HubError(f"{what}: {exc}") from None
    except Exception as exc:  # the network, the disk, the hub: an edge whose every failure ends the same way
        raise HubError(f"{what}: cannot fetch it: {type(exc).__name__}: {exc}") from None
    folder = Path(snapshot)
    files = [f for f in folder.rglob("*") if f.is_file()]
    resolved = Resolved(
        model=model.name, repo=model.path, revision=revision, commit=folder.name, snapshot=str(folder),
        files=len(files), size=sum(f.stat().st_size for f in files), seconds=time.monotonic() - t0,
        offline=local_only,
    )
    say(f"hub: {model.path} at {revision} is commit {resolved.commit}: {resolved.files} files, "
        f"{resolved.size / 1e6:.1f} MB in {resolved.seconds:.1f} s")
    return resolved


def resolve_models(config: Config, cells: list[Cell], env: Mapping[str, str] | None = None,
                   say: Callable[[str], None] = _say) -> tuple[list[Cell], list[PreflightRecord]]:
    """The cells with every hub-id model's path replaced by its snapshot folder, each hub id
    resolved once; and a `fetch` record per hub id. Cells of local models come back as they are.
    Raises HubError (a ConfigError) before anything is started."""
    env = os.environ if env is None else env
    keys = {m.name: f"models.{i}" for i, m in enumerate(config.models)}
    cache_dir = cache_folder(config.server.hub_cache, env)
    snapshots: dict[str, Resolved] = {}
    for model in {c.model.name: c.model for c in cells}.values():
        key = keys.get(model.name, "models")
        if not is_hub_id(model.path):
            if model.revision is not None:
                raise HubError(f"{key}.revision: only a hub id has revisions, and {model.path} is not one")
            continue
        snapshots[model.name] = resolve(model, key, cache_dir, env, say)
    out = [
        c.model_copy(update={"model": c.model.model_copy(update={"path": snapshots[c.model.name].snapshot})})
        if c.model.name in snapshots else c
        for c in cells
    ]
    return out, [r.record() for r in snapshots.values()]
