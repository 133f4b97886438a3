"""The sharded-checkpoint gate: a ``model.safetensors.index.json`` checked against its shards.

Hugging Face writes ``{"metadata": {"total_size": N, ...}, "weight_map": {tensor: shard file}}``, where
``total_size`` is the sum of the tensors' storage bytes (numel x element size, shared storage counted
once) — not the sum of file sizes, which also count headers. Transformers 5 also writes
``total_parameters``; it is kept but not checked (it counts parameters, not stored elements).

The work is split into pure steps and one I/O shell:

* :func:`parse_shard_index` — bytes → :class:`ShardIndex` (JSON, types, safe relative shard names);
* :func:`check_shards` — index + parsed shard headers → :class:`ShardedCheckpoint` (every tensor in
  exactly the shard the index names, nothing extra, ``total_size`` equal to the tensor bytes);
* :func:`validate_sharded_checkpoint` — reads the index file and every shard header from disk.

Which shard holds which tensor protects every loader and always refuses. ``total_size`` and
``total_parameters`` are read by no loader (one producer writes the sum of file sizes, others omit
them): a wrong or malformed value goes to the :class:`~shardport.registry.formats.notes.Notes` collector — a
note by default, its error under ``strict`` (a gate called without a collector raises).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import MappingProxyType

from shardport.registry.formats.notes import Notes, collector

from .errors import (
    ShardIndexError,
    ShardMembershipError,
    ShardMissingError,
    TotalSizeMismatchError,
)
from .safetensors_gate import (
    SafetensorsHeader,
    SafetensorsLimits,
    load_json_object,
    parse_safetensors,
)
from .source import FileSource, read_exact, source_size

DEFAULT_MAX_INDEX_BYTES = 64 * 1024 * 1024
"""Default cap on the size of an index JSON file."""

_REMEDY_REINDEX = "regenerate the index (e.g. save_pretrained) from the shards"


@dataclass(frozen=True, slots=True)
class ShardIndex:
    """A parsed, type-checked index: tensor → shard file, and the declared totals."""

    path: str
    weight_map: Mapping[str, str]
    total_size: int | None
    total_parameters: int | None

    @property
    def shard_files(self) -> tuple[str, ...]:
        """The distinct shard files the index names, sorted."""
        return tuple(sorted(set(self.weight_map.values())))


@dataclass(frozen=True, slots=True)
class ShardedCheckpoint:
    """A sharded checkpoint whose index and shards agree.

    ``shards`` follow :attr:`ShardIndex.shard_files` order; ``tensor_bytes`` is the sum of all tensors'
    data bytes (what ``total_size`` must equal when present).
    """

    index: ShardIndex
    shards: tuple[SafetensorsHeader, ...]
    tensor_bytes: int


def _check_shard_name(index_path: str, tensor: str, file: object) -> str:
    if not isinstance(file, str):
        raise ShardIndexError(
            index_path,
            tensor=tensor,
            field="weight_map value",
            expected="a shard file name (string)",
            found=f"a JSON {type(file).__name__}",
            remedy=_REMEDY_REINDEX,
        )
    parts = PurePosixPath(file).parts
    if (
        not file
        or "\\" in file
        or "\x00" in file
        or file.startswith("/")
        or file.endswith("/")
        or any(p in ("", ".", "..") for p in file.split("/"))
        or not parts
    ):
        raise ShardIndexError(
            index_path,
            tensor=tensor,
            field="weight_map value",
            expected="a relative POSIX path without '.', '..' or empty segments",
            found=repr(file)[:120],
            remedy="the index may be hostile; do not load it",
        )
    return file


def _optional_count(index_path: str, metadata: Mapping[str, object], key: str, notes: Notes) -> int | None:
    """``metadata[key]`` as a count; a value that is not one is noted (no loader reads it) and dropped."""
    value = metadata.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer() and 0 <= value <= 2**62:
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2**62:
        return value
    notes.add(
        ShardIndexError(
            index_path,
            field=f"metadata.{key}",
            expected="a non-negative integer",
            found=repr(value)[:80],
            remedy=_REMEDY_REINDEX,
        )
    )
    return None


def parse_shard_index(index_path: str, raw: bytes, notes: Notes | None = None) -> ShardIndex:
    """Parse and type-check the bytes of a ``*.safetensors.index.json`` (pure; no file access).

    A malformed ``total_size`` or ``total_parameters`` goes to ``notes`` (and reads as ``None``).
    """
    notes = collector(notes)
    doc = load_json_object(index_path, raw)
    weight_map = doc.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ShardIndexError(
            index_path,
            field="weight_map",
            expected="a non-empty object of tensor -> shard file",
            found=repr(weight_map)[:80] if not isinstance(weight_map, dict) else "an empty object",
            remedy=_REMEDY_REINDEX,
        )
    metadata = doc.get("metadata", {})
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise ShardIndexError(
            index_path,
            field="metadata",
            expected="an object",
            found=f"a JSON {type(metadata).__name__}",
            remedy=_REMEDY_REINDEX,
        )
    files = {tensor: _check_shard_name(index_path, tensor, file) for tensor, file in weight_map.items()}
    return ShardIndex(
        path=index_path,
        weight_map=MappingProxyType(files),
        total_size=_optional_count(index_path, metadata, "total_size", notes),
        total_parameters=_optional_count(index_path, metadata, "total_parameters", notes),
    )


def check_shards(
    index: ShardIndex, shards: Mapping[str, SafetensorsHeader], *, notes: Notes | None = None
) -> ShardedCheckpoint:
    """Prove that ``shards`` (shard file → parsed header) hold exactly the tensors the index maps to them.

    Every shard the index names must be in ``shards`` (else :class:`ShardMissingError`); every tensor
    of a shard must be mapped to that shard, and every mapped tensor must be found in its shard (else
    :class:`ShardMembershipError`). ``total_size``, when present, should equal the sum of the
    tensors' data bytes; when it does not, a :class:`TotalSizeMismatchError` goes to ``notes`` (raised
    when there is no collector or it is strict).
    """
    seen: dict[str, str] = {}
    total = 0
    ordered: list[SafetensorsHeader] = []
    for file in index.shard_files:
        header = shards.get(file)
        if header is None:
            raise ShardMissingError(
                index.path,
                field="weight_map",
                expected=f"shard {file!r} to exist",
                found="no such file",
                remedy="download the missing shard",
            )
        ordered.append(header)
        for rec in header.tensors:
            named = index.weight_map.get(rec.name)
            if named is None:
                raise ShardMembershipError(
                    index.path,
                    tensor=rec.name,
                    field="weight_map",
                    expected="an entry for every stored tensor",
                    found=f"the tensor is in shard {file!r} but not in the index",
                    remedy=_REMEDY_REINDEX,
                )
            if named != file:
                raise ShardMembershipError(
                    index.path,
                    tensor=rec.name,
                    field="weight_map",
                    expected=f"the tensor only in shard {named!r}",
                    found=f"it is (also) in shard {file!r}",
                    remedy=_REMEDY_REINDEX,
                )
            seen[rec.name] = file
            total += rec.nbytes
    for tensor, file in index.weight_map.items():
        if tensor not in seen:
            raise ShardMembershipError(
                index.path,
                tensor=tensor,
                field="weight_map",
                expected=f"the tensor in shard {file!r}",
                found="it is not in that shard",
                remedy="re-download the shard or regenerate the index",
            )
    if index.total_size is not None and index.total_size != total:
        collector(notes).add(
            TotalSizeMismatchError(
                index.path,
                field="metadata.total_size",
                expected=f"{total} (the sum of the tensors' data bytes)",
                found=str(index.total_size),
                remedy="no loader reads this field, so a push without --strict records it as a note; "
                "to clear it, regenerate the index from the shards (e.g. save_pretrained)",
            )
        )
    return ShardedCheckpoint(index=index, shards=tuple(ordered), tensor_bytes=total)


def validate_sharded_checkpoint(
    index_path: str | os.PathLike[str],
    limits: SafetensorsLimits | None = None,
    *,
    max_index_bytes: int = DEFAULT_MAX_INDEX_BYTES,
    notes: Notes | None = None,
) -> ShardedCheckpoint:
    """Read an index file and the header of every shard it names (in its directory) and check them.

    Findings in fields no loader reads go to ``notes`` (see :mod:`shardport.registry.formats.notes`).
    """
    name = os.fspath(index_path)
    with FileSource(name) as source:
        size = source_size(source)
        if size > max_index_bytes:
            raise ShardIndexError(
                name,
                field="file size",
                expected=f"at most {max_index_bytes} bytes",
                found=f"{size} bytes",
                remedy="the index is corrupt or hostile: it maps tensor names to files and is small",
            )
        index = parse_shard_index(name, read_exact(source, 0, size, what="index"), notes)
    base = Path(name).parent
    root = base.resolve()
    headers: dict[str, SafetensorsHeader] = {}
    for file in index.shard_files:
        path = base / file
        resolved = path.resolve()
        if not resolved.is_relative_to(root):
            raise ShardIndexError(
                name,
                field="weight_map",
                expected=f"shard {file!r} inside {str(root)!r}",
                found=f"it resolves to {str(resolved)!r}",
                remedy="the index may be hostile; do not load it",
            )
        if not resolved.is_file():
            raise ShardMissingError(
                name,
                field="weight_map",
                expected=f"shard {file!r} to exist",
                found="no such file",
                remedy="download the missing shard",
            )
        headers[file] = parse_safetensors(path, limits, notes=notes)
    return check_shards(index, headers, notes=notes)
