"""The safetensors gate: parse and validate a safetensors header without trusting any of it.

Layout of a safetensors file: an 8-byte little-endian header length ``n``, ``n`` bytes of UTF-8 JSON,
then the data region. Each JSON entry maps a tensor name to ``{"dtype", "shape", "data_offsets"}``
(offsets relative to the data region); the optional ``__metadata__`` entry maps strings to strings.

What the gate proves before it returns a :class:`SafetensorsHeader`:

* the header length is at most the cap and fits in the file (checked before anything is allocated);
* the header is UTF-8, is a JSON object, has no duplicate keys, no NaN/Infinity, no unknown fields;
* every dtype is on the allow-list of safetensors 0.8 (sub-byte types F4, F6_* included);
* for every tensor, the element count and bit size stay under :data:`SIZE_BOUND` at every step, the
  bit size is a whole number of bytes, and it equals the length of the offset interval;
* sorted by offset, the intervals tile the data region exactly: no overlap, no hole, nothing after
  the last tensor, nothing outside the file.

This is stricter than ``safetensors`` itself, which accepts duplicate keys and unknown fields. A
duplicate key always refuses (two parsers may keep different entries); an unknown field in a tensor
entry is read by no loader, so it goes to the :class:`~shardport.registry.formats.notes.Notes` collector — a
note by default, :class:`TensorEntryError` under ``strict`` or without a collector.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NoReturn

from shardport.registry.formats.notes import Notes, collector

from .elements import ELEMENTS, SAFETENSORS_DTYPES
from .errors import (
    DuplicateKeyError,
    HeaderEncodingError,
    HeaderJSONError,
    HeaderLengthError,
    HeaderNotObjectError,
    HeaderTooLargeError,
    MetadataTypeError,
    ShapeOverflowError,
    TensorEntryError,
    TensorGapError,
    TensorOutOfBoundsError,
    TensorOverlapError,
    TensorSizeMismatchError,
    TrailingBytesError,
    TruncatedFileError,
    UnknownDtypeError,
)
from .source import ByteSource, FileSource, read_exact, source_size

SIZE_BOUND = 2**62
"""Upper bound on any element count, byte count or offset; every product is checked against it."""

DEFAULT_MAX_HEADER_BYTES = 100 * 1024 * 1024
"""Default cap on the safetensors JSON header (the reference implementation uses 100 MB)."""

DTYPE_BITS: Mapping[str, int] = MappingProxyType(
    {name: ELEMENTS[name].block_bits for name in SAFETENSORS_DTYPES}
)
"""Bits per element of every dtype safetensors 0.8 accepts (its ``Dtype`` enum)."""

_METADATA_KEY = "__metadata__"
_TENSOR_FIELDS = frozenset({"dtype", "shape", "data_offsets"})
_MAX_NDIM = 64
_MAX_INT_DIGITS = 24
_LONG_DIGITS = re.compile(rb"[0-9]{%d}" % (_MAX_INT_DIGITS + 1))
_BITS = dict(DTYPE_BITS)
_REMEDY_RESAVE = "re-export the checkpoint with safetensors.save_file"
_REMEDY_METADATA = "store non-string metadata as JSON-encoded strings"


@dataclass(frozen=True, slots=True)
class SafetensorsLimits:
    """Caps the safetensors gate enforces (``max_header_bytes`` bounds every read and allocation)."""

    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    max_ndim: int = _MAX_NDIM


@dataclass(frozen=True, slots=True)
class TensorRecord:
    """One tensor of a container: name, dtype, numpy-order shape and absolute byte range ``[start, end)``."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        """The length of the tensor's byte range."""
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class SafetensorsHeader:
    """A validated safetensors header.

    ``data_offset`` is ``8 + header_length``; ``tensors`` are ordered by ``start`` (ties, which only
    zero-size tensors can have, by name) and their offsets are absolute file offsets. ``metadata`` is
    a read-only view of ``__metadata__`` (empty when absent or null).
    """

    path: str
    file_size: int
    header_length: int
    data_offset: int
    metadata: Mapping[str, str]
    tensors: tuple[TensorRecord, ...]

    def tensor_map(self) -> dict[str, TensorRecord]:
        """Return a fresh name → record dict."""
        return {t.name: t for t in self.tensors}


def parse_safetensors(
    path: str | os.PathLike[str], limits: SafetensorsLimits | None = None, *, notes: Notes | None = None
) -> SafetensorsHeader:
    """Open ``path`` and validate its safetensors header (see :func:`parse_safetensors_source`)."""
    with FileSource(path) as source:
        return parse_safetensors_source(source, limits, notes=notes)


def parse_safetensors_source(
    source: ByteSource, limits: SafetensorsLimits | None = None, *, notes: Notes | None = None
) -> SafetensorsHeader:
    """Validate the safetensors header of ``source``; reads at most ``8 + limits.max_header_bytes`` bytes.

    Raises a :class:`~shardport.registry.formats.errors.ContainerError` subclass on any defect;
    unknown fields in tensor entries go to ``notes`` (raised without a collector).
    """
    limits = limits or SafetensorsLimits()
    name = source.name
    size = source_size(source)
    if size < 8:
        raise TruncatedFileError(
            name,
            field="header length prefix",
            expected="at least 8 bytes",
            found=f"a {size}-byte file",
            remedy="re-download the file",
        )
    (n,) = struct.unpack("<Q", read_exact(source, 0, 8, what="header length prefix"))
    if n > limits.max_header_bytes:
        raise HeaderTooLargeError(
            name,
            field="header length",
            expected=f"at most {limits.max_header_bytes} bytes",
            found=f"{n} bytes",
            remedy="the file is corrupt or hostile: safetensors itself refuses headers over 100 MB",
        )
    if n < 2 or 8 + n > size:
        raise HeaderLengthError(
            name,
            field="header length",
            expected=f"2..{max(size - 8, 0)} bytes (inside the {size}-byte file)",
            found=f"{n} bytes",
            remedy="the file is truncated or not safetensors; re-download it",
        )
    raw = read_exact(source, 8, n, what="header")
    entries = load_json_object(name, raw)
    # a lone surrogate can only come from a \u escape; without one, every name is valid Unicode
    metadata, tensors = _check_entries(name, entries, 8 + n, limits, b"\\u" in raw, collector(notes))
    _check_tiling(name, tensors, 8 + n, size)
    return SafetensorsHeader(
        path=name,
        file_size=size,
        header_length=n,
        data_offset=8 + n,
        metadata=MappingProxyType(metadata),
        tensors=tuple(tensors),
    )


def load_json_object(name: str, raw: bytes) -> dict[str, object]:
    """Decode ``raw`` as a UTF-8 JSON object with no duplicate keys and no NaN/Infinity."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeaderEncodingError(
            name,
            field="header",
            expected="UTF-8 text",
            found=f"invalid byte at position {exc.start}",
            remedy=_REMEDY_RESAVE,
        ) from exc

    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        obj = dict(items)
        if len(obj) != len(items):
            seen: set[str] = set()
            for key, _ in items:
                if key in seen:
                    raise DuplicateKeyError(
                        name,
                        field="JSON key",
                        expected="unique keys",
                        found=f"{key!r} twice",
                        remedy=_REMEDY_RESAVE,
                    )
                seen.add(key)
        return obj

    def constant(token: str) -> NoReturn:
        raise ValueError(f"non-finite number {token}")

    def integer(token: str) -> int:
        if len(token) > _MAX_INT_DIGITS:
            raise ValueError(f"an integer literal with {len(token)} digits")
        return int(token)

    # int() of a huge literal is quadratic; only pay for the checking hook when a long digit run exists
    parse_int = integer if _LONG_DIGITS.search(raw) else None
    try:
        value = json.loads(text, object_pairs_hook=pairs, parse_constant=constant, parse_int=parse_int)
    except (ValueError, RecursionError) as exc:
        raise HeaderJSONError(
            name,
            field="header",
            expected="valid JSON",
            found=f"{type(exc).__name__}: {str(exc)[:200]}",
            remedy=_REMEDY_RESAVE,
        ) from exc
    if not isinstance(value, dict):
        raise HeaderNotObjectError(
            name,
            field="header",
            expected="a JSON object",
            found=f"a JSON {type(value).__name__}",
            remedy=_REMEDY_RESAVE,
        )
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_text(name: str, text: str, field: str, tensor: str | None = None) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise HeaderEncodingError(
            name,
            field=field,
            tensor=tensor,
            expected="valid Unicode",
            found=f"a lone surrogate at position {exc.start}",
            remedy=_REMEDY_RESAVE,
        ) from exc


def _check_metadata(name: str, value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MetadataTypeError(
            name,
            field=_METADATA_KEY,
            expected="an object of string → string",
            found=f"a JSON {type(value).__name__}",
            remedy=_REMEDY_METADATA,
        )
    for key, item in value.items():
        if not isinstance(item, str):
            raise MetadataTypeError(
                name,
                field=f"{_METADATA_KEY}[{key!r}]",
                expected="a string",
                found=f"a JSON {type(item).__name__}",
                remedy=_REMEDY_METADATA,
            )
        _check_text(name, key, f"{_METADATA_KEY} key")
        _check_text(name, item, f"{_METADATA_KEY}[{key!r}]")
    return dict(value)


def _check_entries(
    name: str,
    entries: dict[str, object],
    data_offset: int,
    limits: SafetensorsLimits,
    may_have_surrogates: bool,
    notes: Notes,
) -> tuple[dict[str, str], list[TensorRecord]]:
    metadata: dict[str, str] = {}
    tensors: list[TensorRecord] = []
    max_ndim = limits.max_ndim
    for key, entry in entries.items():
        if key == _METADATA_KEY:
            metadata = _check_metadata(name, entry)
            continue
        if may_have_surrogates:
            _check_text(name, key, "tensor name", key)
        record = _accept_tensor(key, entry, data_offset, max_ndim)
        tensors.append(record or _check_tensor(name, key, entry, data_offset, limits, notes))
    return metadata, tensors


def _accept_tensor(tensor: str, entry: object, data_offset: int, max_ndim: int) -> TensorRecord | None:
    """Fast path: the record if ``entry`` passes every check of :func:`_check_tensor`, else ``None``.

    It accepts exactly what ``_check_tensor`` accepts (a property test holds them together); on
    ``None`` the caller runs ``_check_tensor``, which finds the failing check and raises its error.
    """
    if type(entry) is not dict or len(entry) != 3:
        return None
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if type(dtype) is not str:
        return None
    bits = _BITS.get(dtype)
    if bits is None or type(shape) is not list or len(shape) > max_ndim or type(offsets) is not list:
        return None
    count = 1
    for dim in shape:
        if type(dim) is not int or not 0 <= dim <= SIZE_BOUND:
            return None
        count *= dim
        if count > SIZE_BOUND:
            return None
    if len(offsets) != 2:
        return None
    begin, end = offsets
    if type(begin) is not int or type(end) is not int or not 0 <= begin <= end <= SIZE_BOUND:
        return None
    if count > SIZE_BOUND // bits or (count * bits) & 7 or end - begin != (count * bits) >> 3:
        return None
    return TensorRecord(tensor, dtype, tuple(shape), data_offset + begin, data_offset + end)


def _check_tensor(
    name: str, tensor: str, entry: object, data_offset: int, limits: SafetensorsLimits, notes: Notes
) -> TensorRecord:
    fields = _entry_fields(name, tensor, entry, notes)
    dtype, dims = _dtype_and_shape(name, tensor, fields["dtype"], fields["shape"], limits)
    nbytes = _tensor_bytes(name, tensor, dtype, dims)
    begin, end = _offsets(name, tensor, fields["data_offsets"], nbytes, dtype, dims)
    return TensorRecord(tensor, dtype, tuple(dims), data_offset + begin, data_offset + end)


def _entry_fields(name: str, tensor: str, entry: object, notes: Notes) -> dict[str, object]:
    """The entry as an object with dtype, shape and data_offsets (unknown extra fields: a note)."""
    if not isinstance(entry, dict):
        raise TensorEntryError(
            name,
            tensor=tensor,
            field="entry",
            expected='an object {"dtype", "shape", "data_offsets"}',
            found=f"a JSON {type(entry).__name__}",
            remedy=_REMEDY_RESAVE,
        )
    keys = set(entry)
    if keys != _TENSOR_FIELDS:
        missing, extra = sorted(_TENSOR_FIELDS - keys), sorted(keys - _TENSOR_FIELDS)
        error = TensorEntryError(
            name,
            tensor=tensor,
            field="entry fields",
            expected="exactly dtype, shape, data_offsets",
            found=f"missing {missing}, unknown {extra}",
            remedy=_REMEDY_RESAVE,
        )
        if missing:
            raise error
        notes.add(error)  # unknown fields only: no loader reads them
    return entry


def _dtype_and_shape(
    name: str, tensor: str, dtype: object, shape: object, limits: SafetensorsLimits
) -> tuple[str, list[int]]:
    """A known dtype and a list of at most ``max_ndim`` integer dims."""
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise UnknownDtypeError(
            name,
            tensor=tensor,
            field="dtype",
            expected=f"one of {', '.join(DTYPE_BITS)}",
            found=repr(dtype)[:80],
            remedy="convert the tensor to a supported dtype",
        )
    if not isinstance(shape, list) or len(shape) > limits.max_ndim or not all(_is_int(d) for d in shape):
        raise TensorEntryError(
            name,
            tensor=tensor,
            field="shape",
            expected=f"a list of at most {limits.max_ndim} integers",
            found=repr(shape)[:80],
            remedy=_REMEDY_RESAVE,
        )
    return dtype, shape


def _tensor_bytes(name: str, tensor: str, dtype: str, dims: list[int]) -> int:
    """Byte size of ``dims`` elements of ``dtype``, in checked arithmetic (≤ 2**62 bits, whole bytes)."""
    count = 1
    for dim in dims:
        if dim < 0 or dim > SIZE_BOUND or (dim and count > SIZE_BOUND // dim):
            raise ShapeOverflowError(
                name,
                tensor=tensor,
                field="shape",
                expected="non-negative dims with a product ≤ 2**62",
                found=repr(dims)[:120],
            )
        count *= dim
    bits = DTYPE_BITS[dtype]
    if count > SIZE_BOUND // bits:
        raise ShapeOverflowError(
            name,
            tensor=tensor,
            field="shape x dtype",
            expected="at most 2**62 bits",
            found=f"{count} elements of {bits} bits",
        )
    if (count * bits) % 8:
        raise TensorSizeMismatchError(
            name,
            tensor=tensor,
            field="shape x dtype",
            expected="a whole number of bytes",
            found=f"{count} elements x {bits} bits = {count * bits} bits",
            remedy="pad the packed tensor",
        )
    return count * bits // 8


def _offsets(
    name: str, tensor: str, offsets: object, nbytes: int, dtype: str, dims: list[int]
) -> tuple[int, int]:
    """``data_offsets`` as ``[begin, end]`` within 2**62, spanning exactly ``nbytes``."""
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_int(o) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= SIZE_BOUND
    ):
        raise TensorEntryError(
            name,
            tensor=tensor,
            field="data_offsets",
            expected="[begin, end] with 0 ≤ begin ≤ end ≤ 2**62",
            found=repr(offsets)[:80],
            remedy=_REMEDY_RESAVE,
        )
    begin, end = offsets
    if end - begin != nbytes:
        raise TensorSizeMismatchError(
            name,
            tensor=tensor,
            field="data_offsets",
            expected=f"an interval of {nbytes} bytes ({dtype} {dims})",
            found=f"[{begin}, {end}] ({end - begin} bytes)",
            remedy=_REMEDY_RESAVE,
        )
    return begin, end


def _check_tiling(name: str, tensors: list[TensorRecord], data_offset: int, size: int) -> None:
    """Sort ``tensors`` in place by offset and prove they tile ``[data_offset, size)`` exactly."""
    for rec in tensors:
        if rec.end > size:
            raise TensorOutOfBoundsError(
                name,
                tensor=rec.name,
                field="data_offsets",
                expected=f"an end within the data region (≤ {size - data_offset})",
                found=f"end {rec.end - data_offset}",
                remedy="the file is truncated or its header lies",
            )
    tensors.sort(key=lambda t: (t.start, t.end, t.name))
    cursor = data_offset
    previous: TensorRecord | None = None
    for rec in tensors:
        if rec.start < cursor:
            other = previous.name if previous is not None else "?"
            raise TensorOverlapError(
                name,
                tensor=rec.name,
                field="data_offsets",
                expected=f"begin ≥ {cursor - data_offset} (end of {other!r})",
                found=f"begin {rec.start - data_offset}: it overlaps {other!r}",
                remedy=_REMEDY_RESAVE,
            )
        if rec.start > cursor:
            raise TensorGapError(
                name,
                tensor=rec.name,
                field="data_offsets",
                expected=f"begin {cursor - data_offset} (no unowned bytes)",
                found=f"begin {rec.start - data_offset}: a {rec.start - cursor}-byte hole",
                remedy=_REMEDY_RESAVE,
            )
        cursor = rec.end
        if rec.end > rec.start:
            previous = rec
    if cursor != size:
        raise TrailingBytesError(
            name,
            field="data region",
            expected=f"{cursor - data_offset} bytes (the tensors' total)",
            found=f"{size - data_offset} bytes: {size - cursor} trailing bytes",
            remedy=_REMEDY_RESAVE,
        )
