"""A real Hugging Face hub cache, built here from a local checkpoint: nothing is fetched from a hub.

huggingface_hub's own cache layout, as `snapshot_download` leaves it:
  <cache>/models--org--name/                  huggingface_hub.file_download.repo_folder_name
      blobs/<sha256>                          an LFS file's content (the weights), named by its sha256
      blobs/<git sha1>                        a small file's content, named by its git blob hash
                                              (huggingface_hub.utils.sha.git_hash)
      snapshots/<commit>/<file>               a relative link to ../../blobs/<hash>
      refs/<revision>                         the commit a branch or tag points at
      trees/<commit>.json                     the commit's file listing (huggingface_hub's tree cache,
                                              which tells a complete snapshot from a partial one)
written with huggingface_hub's own helpers wherever it has them. tests/test_hub.py proves the
layout right by resolving it with huggingface_hub itself, offline.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub._tree_cache import TreeCacheEntry, write_tree_cache
from huggingface_hub.file_download import _cache_commit_hash_for_specific_revision, repo_folder_name
from huggingface_hub.utils.sha import git_hash

# What the hub's default .gitattributes stores with LFS, of the files a checkpoint has.
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5", ".onnx")


@dataclass(frozen=True)
class Snapshot:
    repo_id: str
    commit: str
    path: Path  # <cache>/models--org--name/snapshots/<commit>
    repo_folder: Path  # <cache>/models--org--name


def add_revision(cache: Path, repo_id: str, source: Path, revision: str = "main",
                 changes: dict[str, bytes] | None = None) -> Snapshot:
    """Puts `source`'s files (with `changes`: file name → new content) into the hub cache under
    `cache` as one commit of `repo_id`, and points `revision` (a branch or tag) at it. Called
    again with other changes, it adds another commit beside the first, sharing the blobs."""
    repo_folder = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    blobs = repo_folder / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    contents = {f.name: f.read_bytes() for f in sorted(source.iterdir()) if f.is_file()}
    contents.update(changes or {})
    entries: dict[str, TreeCacheEntry] = {}
    for name, data in contents.items():
        blob_id = git_hash(data)
        if name.endswith(LFS_SUFFIXES):
            sha = hashlib.sha256(data).hexdigest()
            entries[name] = TreeCacheEntry(size=len(data), blob_id=blob_id, lfs_sha256=sha, lfs_size=len(data))
        else:
            entries[name] = TreeCacheEntry(size=len(data), blob_id=blob_id)
    # A commit id of this content: 40 hex digits like the hub's, different for different trees.
    listing = json.dumps({n: e.to_json() for n, e in sorted(entries.items())}, sort_keys=True)
    commit = git_hash(listing.encode())
    snapshot = repo_folder / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    # In the source's listing order: a checkpoint's directory order is part of what it tests.
    for name in [f.name for f in source.iterdir() if f.name in contents] + [n for n in contents if not (source / n).exists()]:
        entry = entries[name]
        blob = blobs / (entry.lfs_sha256 or entry.blob_id)
        if not blob.exists():
            tmp = blob.with_name(blob.name + ".incomplete")  # as huggingface_hub downloads: then renamed
            tmp.write_bytes(contents[name])
            os.replace(tmp, blob)
        link = snapshot / name
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(blob, snapshot))
    write_tree_cache(str(repo_folder), commit, entries)
    _cache_commit_hash_for_specific_revision(str(repo_folder), revision, commit)
    return Snapshot(repo_id, commit, snapshot, repo_folder)


def hub_cache(cache: Path, repo_id: str, source: Path) -> Snapshot:
    """A fresh hub cache folder holding `source` as `repo_id` at main."""
    if cache.exists():
        shutil.rmtree(cache)
    return add_revision(cache, repo_id, source)
