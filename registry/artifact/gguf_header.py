"""The GGUF header digest: sha256 of a GGUF file's bytes through its last key/value pair.

Push records, for every GGUF file, :class:`~shardport.registry.artifact.manifest.GgufHeaderDigest` — the end
offset of the key/value section (``GGUFHeader.kv_end``) and the digest of bytes ``[0, end)``: magic,
version, tensor and KV counts and every KV pair, tokenizer vocabulary, scores and merges included. A
consumer that reads only the header (one range read of ``end`` bytes) checks it with
:func:`check_header_bytes`; ``verify`` checks every GGUF file of an artifact with
:func:`check_header_file`. The one hasher is :mod:`shardport.registry.artifact.hashing`.
"""

from __future__ import annotations

from pathlib import Path

from shardport.registry.artifact.hashing import digest_bytes, digest_range
from shardport.registry.artifact.manifest import GgufHeaderDigest
from shardport.registry.errors import HeaderDigestMismatchError
from shardport.registry.formats import GGUFHeader

_REMEDY = "the file's metadata (tokenizer, hyperparameters) changed after it was signed; pull it again"


def header_digest(path: Path, header: GGUFHeader) -> GgufHeaderDigest:
    """The digest of ``path``'s bytes ``[0, header.kv_end)`` (``header`` is its parsed, gated header)."""
    digest, _ = digest_range(path, 0, header.kv_end)
    return GgufHeaderDigest(end=header.kv_end, digest=digest)


def _mismatch(file: str, record: GgufHeaderDigest, found: str) -> HeaderDigestMismatchError:
    return HeaderDigestMismatchError(
        f"{file}: GGUF header bytes [0, {record.end}): expected sha256 {record.digest} (the manifest's "
        f"gguf_header), found {found} (remedy: {_REMEDY})"
    )


def check_header_bytes(record: GgufHeaderDigest, data: bytes, *, file: str) -> None:
    """Check a range read of a GGUF file's first ``record.end`` bytes against the manifest's digest.

    Raises :class:`HeaderDigestMismatchError` naming ``file``, the range, expected and found.
    """
    if len(data) != record.end:
        raise _mismatch(file, record, f"{len(data)} bytes instead of {record.end}")
    got = digest_bytes(data)
    if got != record.digest:
        raise _mismatch(file, record, got)


def check_header_file(path: Path, record: GgufHeaderDigest, *, file: str, kv_end: int | None = None) -> None:
    """Check the header bytes of the GGUF file at ``path`` against the manifest's digest.

    ``kv_end``: where the file's parsed header says its KV pairs end; a record covering another
    range (fewer KV bytes than the file has) is refused too.
    """
    if kv_end is not None and kv_end != record.end:
        raise _mismatch(file, record, f"key/value pairs that end at byte {kv_end}")
    got, size = digest_range(path, 0, record.end)
    if size != record.end:
        raise _mismatch(file, record, f"a file of {size} bytes")
    if got != record.digest:
        raise _mismatch(file, record, got)
