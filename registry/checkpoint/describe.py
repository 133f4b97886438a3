"""Describe a checkpoint folder for its manifest: files, container kind, model info, quantization config.

Pure reading of the folder (small JSON files only); file hashing happens in :mod:`push`.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import rfc8785

from shardport.registry.artifact.hashing import digest_bytes
from shardport.registry.artifact.manifest import ContainerInfo, FileEntry, ModelInfo
from shardport.registry.errors import UsageError
from shardport.registry.families.llama import CONFIG_PARAMS

METADATA_DIR = ".shardport"
MODEL_PARAMS = CONFIG_PARAMS
"""config.json keys recorded in ``model.params``: the model family's (a key the config lacks is left out,
so adding one there changes the manifest digest only of checkpoints whose config.json has it)."""


def scan(src: Path) -> list[tuple[str, Path]]:
    """Regular files under ``src`` as (relative POSIX path, absolute path), sorted.

    Symlinks and special files are refused: a manifest records bytes, not links. The top-level
    ``.shardport`` folder (metadata written by pull) is skipped.
    """
    if not src.is_dir():
        raise UsageError(f"{src}: not a directory (push takes a checkpoint folder)")
    out: list[tuple[str, Path]] = []
    stack = [src]
    while stack:
        folder = stack.pop()
        for child in folder.iterdir():
            rel = child.relative_to(src).as_posix()
            if rel == METADATA_DIR:
                continue
            mode = child.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise UsageError(f"{child}: symbolic links are not pushed; copy the target into the folder")
            if stat.S_ISDIR(mode):
                stack.append(child)
            elif stat.S_ISREG(mode):
                out.append((rel, child))
            else:
                raise UsageError(f"{child}: not a regular file")
    if not out:
        raise UsageError(f"{src}: no files to push")
    return sorted(out)


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when it is missing, unreadable or not an object."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):  # RecursionError: nested deeper than Python parses
        return None
    return doc if isinstance(doc, dict) else None


def container_of(paths: list[str]) -> ContainerInfo:
    """Container kind from the file names."""
    if any(p.endswith(".gguf") for p in paths):
        return ContainerInfo(kind="gguf", profile_version=1)
    if any(p.endswith(".safetensors") for p in paths):
        return ContainerInfo(kind="safetensors", profile_version=1)
    return ContainerInfo(kind="other", profile_version=1)


def model_of(src: Path, files: dict[str, FileEntry]) -> ModelInfo:
    """Model info from ``config.json`` (when present) and the tokenizer's digest."""
    config = read_json_object(src / "config.json") or {}
    archs = config.get("architectures")
    params = {k: config[k] for k in MODEL_PARAMS if k in config}
    tokenizer = files.get("tokenizer.json") or files.get("tokenizer.model")
    return ModelInfo(
        architecture=archs[0] if isinstance(archs, list) and archs else config.get("model_type"),
        revision=config.get("_commit_hash") or None,
        tokenizer_digest=tokenizer.digest if tokenizer else None,
        params=params,
    )


def quantization_config(src: Path) -> dict[str, Any] | None:
    """The quantization config: ``config.json``'s ``quantization_config``, else ``quantize_config.json``.

    :func:`shardport.registry.checkpoint.layers.quantization_layer` makes the manifest's section of it.
    """
    config = read_json_object(src / "config.json") or {}
    qc = config.get("quantization_config") or read_json_object(src / "quantize_config.json")
    return qc if isinstance(qc, dict) else None


def source_digest(files: list[FileEntry]) -> str:
    """Digest of the checkpoint as a whole: sha256 of the canonical (path, size, digest) list."""
    return digest_bytes(rfc8785.dumps([[f.path, f.size, f.digest] for f in files]))
