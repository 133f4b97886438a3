"""The GGUF gate: a bounded GGUF v2/v3 header parser that distrusts every byte.

Layout (little-endian): magic ``GGUF``, u32 version, u64 tensor count, u64 KV count, the KV pairs
(string key, u32 value type, value), the tensor infos (string name, u32 n_dims, n_dims x u64 dims with
ne0 first, u32 ggml type, u64 offset relative to the data region), padding to ``general.alignment``
(default 32), then the data region.

What the gate proves before it returns a :class:`GGUFHeader`:

* magic and version (2 or 3; big-endian files are recognised and refused); counts under their caps
  and under what the remaining bytes could hold;
* every length (string, array) is checked against its cap and the remaining bytes *before* reading;
  the parser never reads past ``max_header_bytes`` (a range-read source sees only header reads);
* keys and tensor names are UTF-8 and unique; value types are known; arrays nest at most
  ``max_array_depth`` deep; ``general.alignment`` is a UINT32 power of two;
  ``general.quantization_version``, when present, is a UINT32 in :data:`QUANTIZATION_VERSIONS`;
* per tensor: n_dims in 0..4, the element and byte counts stay under 2**62, the ggml type is in the
  table of ``gguf.constants.GGML_QUANT_SIZES`` (unknown numbers are refused by number), ne0 is a
  multiple of the block size, the offset is aligned, the extent lies inside the file;
* no two tensors share bytes, and (``strict_layout``, the rule llama.cpp applies) each offset equals
  the previous tensor's end padded to the alignment, in info order.

A KV string value that is not UTF-8 is informative to every runtime (llama.cpp keeps strings as bytes):
it goes to the :class:`~shardport.registry.formats.notes.Notes` collector (kept with U+FFFD for each bad
byte;
:class:`HeaderEncodingError` under ``strict`` or without a collector). Keys and tensor names name
things and always refuse.

KV values are kept as Python values (int, float, bool, str). Arrays are :class:`GGUFArray`; those
longer than ``max_kept_array_len`` (tokenizer vocabularies, scores, merges) keep only their item type
and length, after every element has been bounds-checked (their strings are not decoded).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeAlias

from gguf.constants import GGML_QUANT_VERSION

from shardport.registry.formats.notes import Notes, collector

from .cursor import HeaderCursor
from .elements import GGML_BY_ID
from .errors import (
    AlignmentError,
    ArrayLengthError,
    BadMagicError,
    BlockSizeError,
    CountLimitError,
    DimensionError,
    DuplicateKeyError,
    MisalignedTensorError,
    QuantizationVersionError,
    ShapeOverflowError,
    TensorLayoutError,
    TensorOutOfBoundsError,
    TensorOverlapError,
    UnknownGGMLTypeError,
    UnsupportedVersionError,
    ValueTypeError,
)
from .source import ByteSource, FileSource

QUANTIZATION_VERSIONS: frozenset[int] = frozenset({GGML_QUANT_VERSION})
"""The ``general.quantization_version`` values whose block layouts the decoders read (gguf's current)."""
SIZE_BOUND = 2**62
DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4

GGML_TYPES: Mapping[int, tuple[str, int, int]] = MappingProxyType(
    {type_id: (e.name, e.block, e.block_bits // 8) for type_id, e in GGML_BY_ID.items()}
)
"""ggml type number → (name, block size in elements, bytes per block)."""

# value type number → (name, struct format or "" for string/array, size in bytes or minimum size)
_VALUE_TYPES: dict[int, tuple[str, str, int]] = {
    0: ("UINT8", "B", 1),
    1: ("INT8", "b", 1),
    2: ("UINT16", "H", 2),
    3: ("INT16", "h", 2),
    4: ("UINT32", "I", 4),
    5: ("INT32", "i", 4),
    6: ("FLOAT32", "f", 4),
    7: ("BOOL", "B", 1),
    8: ("STRING", "", 8),
    9: ("ARRAY", "", 12),
    10: ("UINT64", "Q", 8),
    11: ("INT64", "q", 8),
    12: ("FLOAT64", "d", 8),
}
_STRING, _ARRAY, _BOOL = 8, 9, 7
_INFO_TAILS = tuple(struct.Struct(f"<{n}QIQ") for n in range(GGML_MAX_DIMS + 1))  # dims, type, offset
_MIN_KV_BYTES = 8 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8
_REMEDY_RECONVERT = "re-convert the model with a current llama.cpp / gguf-py"


@dataclass(frozen=True, slots=True)
class GGUFArray:
    """A GGUF array value; ``values`` is ``None`` when it was longer than ``max_kept_array_len``."""

    item_type: str
    length: int
    values: tuple[GGUFValue, ...] | None


GGUFValue: TypeAlias = int | float | bool | str | GGUFArray
"""A KV value: a scalar, a string or an array."""


@dataclass(frozen=True, slots=True)
class GGUFLimits:
    """Caps the GGUF gate enforces; ``max_header_bytes`` bounds every read and allocation."""

    max_header_bytes: int = 128 * 1024 * 1024
    max_tensor_count: int = 65536
    max_kv_count: int = 65536
    max_key_bytes: int = 65535
    max_tensor_name_bytes: int = 256
    max_string_bytes: int = 16 * 1024 * 1024
    max_array_depth: int = 2
    max_kept_array_len: int = 64
    strict_layout: bool = True


@dataclass(frozen=True, slots=True)
class GGUFTensorRecord:
    """One GGUF tensor and its absolute byte range ``[start, end)``.

    ``dims`` are as in the file (ne0 first); ``shape`` is the numpy order (``dims`` reversed).
    """

    name: str
    ggml_type: str
    ggml_type_id: int
    dims: tuple[int, ...]
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        """The length of the tensor's byte range."""
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class GGUFHeader:
    """A validated GGUF header; ``tensors`` are in file (info) order, offsets absolute.

    ``kv_end``: the offset just past the last key/value pair; bytes ``[0, kv_end)`` (magic, version,
    counts and every KV pair, tokenizer included) are what the manifest's header digest covers.
    """

    path: str
    file_size: int
    version: int
    alignment: int
    data_offset: int
    kv: Mapping[str, GGUFValue]
    kv_types: Mapping[str, str]
    tensors: tuple[GGUFTensorRecord, ...]
    kv_end: int = 0

    def tensor_map(self) -> dict[str, GGUFTensorRecord]:
        """Return a fresh name → record dict."""
        return {t.name: t for t in self.tensors}


def parse_gguf(
    path: str | os.PathLike[str], limits: GGUFLimits | None = None, *, notes: Notes | None = None
) -> GGUFHeader:
    """Open ``path`` and validate its GGUF header (see :func:`parse_gguf_source`)."""
    with FileSource(path) as source:
        return parse_gguf_source(source, limits, notes=notes)


def parse_gguf_source(
    source: ByteSource, limits: GGUFLimits | None = None, *, notes: Notes | None = None
) -> GGUFHeader:
    """Validate the GGUF header of ``source``, reading at most ``limits.max_header_bytes`` bytes.

    Raises a :class:`~shardport.registry.formats.errors.ContainerError` subclass on any defect;
    KV string values that are not UTF-8 go to ``notes`` (raised without a collector).
    """
    return _Parser(source, limits or GGUFLimits(), collector(notes)).parse()


@dataclass(frozen=True, slots=True)
class GGUFMetadata:
    """A GGUF file's key/value pairs alone (read from its header bytes ``[0, kv_end)``)."""

    path: str
    version: int
    kv: Mapping[str, GGUFValue]
    kv_types: Mapping[str, str]
    kv_end: int


def parse_gguf_metadata(
    source: ByteSource, limits: GGUFLimits | None = None, *, notes: Notes | None = None
) -> GGUFMetadata:
    """The key/value pairs of ``source``, which may hold only the header bytes ``[0, kv_end)``.

    The same bounded reads as :func:`parse_gguf_source`, stopping after the last KV pair (the tensor
    infos are not read, so a range read of the manifest's ``gguf_header.end`` bytes suffices). Arrays up
    to ``limits.max_kept_array_len`` items keep their values (raise it to read a tokenizer vocabulary).
    """
    return _Parser(source, limits or GGUFLimits(), collector(notes)).metadata()


class _Parser:
    def __init__(self, source: ByteSource, limits: GGUFLimits, notes: Notes) -> None:
        self.cur = HeaderCursor(source, limits.max_header_bytes)
        self.name = source.name
        self.limits = limits
        self.notes = notes

    def parse(self) -> GGUFHeader:
        cur = self.cur
        version, n_tensors, n_kv = self.preamble()
        kv, kv_types = self._read_kvs(n_kv)
        kv_end = cur.pos
        self._quantization_version(kv, kv_types)
        alignment = self._alignment(kv, kv_types)
        infos = [self._read_tensor_info(i, alignment) for i in range(n_tensors)]
        data_offset = -(-cur.pos // alignment) * alignment
        tensors = self._place(infos, data_offset, alignment)
        return GGUFHeader(
            path=self.name,
            file_size=cur.size,
            version=version,
            alignment=alignment,
            data_offset=data_offset,
            kv=MappingProxyType(kv),
            kv_types=MappingProxyType(kv_types),
            tensors=tuple(tensors),
            kv_end=kv_end,
        )

    def metadata(self) -> GGUFMetadata:
        version, _n_tensors, n_kv = self.preamble(tensors_follow=False)
        kv, kv_types = self._read_kvs(n_kv)
        return GGUFMetadata(
            path=self.name,
            version=version,
            kv=MappingProxyType(kv),
            kv_types=MappingProxyType(kv_types),
            kv_end=self.cur.pos,
        )

    def preamble(self, *, tensors_follow: bool = True) -> tuple[int, int, int]:
        """Magic, version and the two counts, checked against the bytes left.

        ``tensors_follow``: the tensor infos are in the bytes too (a header-only read holds just the KV
        pairs).
        """
        cur, name = self.cur, self.name
        magic = cur.take(4, "magic")
        if magic != b"GGUF":
            raise BadMagicError(
                name, field="magic", expected="b'GGUF'", found=repr(magic), remedy="this is not a GGUF file"
            )
        version = cur.u32("version")
        if version not in (2, 3):
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            raise UnsupportedVersionError(
                name,
                field="version",
                expected="2 or 3 (little-endian)",
                found=f"{version}" + (" (a big-endian GGUF)" if swapped in (2, 3) else ""),
                remedy=_REMEDY_RECONVERT,
            )
        n_tensors, n_kv = cur.u64("tensor count"), cur.u64("KV count")
        self._check_counts(n_tensors, n_kv, tensors_follow)
        return version, n_tensors, n_kv

    def _check_counts(self, n_tensors: int, n_kv: int, tensors_follow: bool = True) -> None:
        remaining = self.cur.size - self.cur.pos
        tensor_unit = _MIN_TENSOR_INFO_BYTES if tensors_follow else 0
        for what, count, cap, unit in (
            ("tensor count", n_tensors, self.limits.max_tensor_count, tensor_unit),
            ("KV count", n_kv, self.limits.max_kv_count, _MIN_KV_BYTES),
        ):
            if count > cap or count * unit > remaining:
                raise CountLimitError(
                    self.name,
                    field=what,
                    expected=f"at most {cap} and at most {remaining // unit} ({remaining} bytes left)",
                    found=str(count),
                    remedy="the header is corrupt or hostile: no GGUF model holds that many entries",
                )
        if n_tensors * tensor_unit + n_kv * _MIN_KV_BYTES > remaining:
            raise CountLimitError(
                self.name,
                field="tensor count + KV count",
                expected=f"entries that fit in {remaining} bytes",
                found=f"{n_tensors} tensors and {n_kv} KV pairs",
                remedy="the header is corrupt or hostile",
            )

    def _read_kvs(self, n_kv: int) -> tuple[dict[str, GGUFValue], dict[str, str]]:
        kv: dict[str, GGUFValue] = {}
        kv_types: dict[str, str] = {}
        for i in range(n_kv):
            key = self.cur.text(self.limits.max_key_bytes, f"KV #{i} key")
            if key in kv:
                raise DuplicateKeyError(
                    self.name,
                    field="KV key",
                    expected="unique keys",
                    found=f"{key!r} twice",
                    remedy=_REMEDY_RECONVERT,
                )
            vtype = self.cur.u32(f"KV {key!r} type")
            kv_types[key] = self._type_name(vtype, f"KV {key!r} type")
            kv[key] = self._read_value(vtype, key, 0)
        return kv, kv_types

    def _type_name(self, vtype: int, field: str) -> str:
        entry = _VALUE_TYPES.get(vtype)
        if entry is None:
            raise ValueTypeError(
                self.name,
                field=field,
                expected="a GGUF value type 0..12",
                found=str(vtype),
                remedy=_REMEDY_RECONVERT,
            )
        return entry[0]

    def _read_value(self, vtype: int, key: str, depth: int) -> GGUFValue:
        cur = self.cur
        _name, fmt, size = _VALUE_TYPES[vtype]
        if vtype == _STRING:
            return cur.text(self.limits.max_string_bytes, f"KV {key!r} value", self.notes)
        if vtype == _ARRAY:
            return self._read_array(key, depth)
        (value,) = cur.scalars(fmt, 1, size, f"KV {key!r} value")
        return self._bool(value, key) if vtype == _BOOL else value

    def _bool(self, value: int | float, key: str) -> bool:
        if value not in (0, 1):
            raise ValueTypeError(
                self.name,
                field=f"KV {key!r} value",
                expected="a BOOL byte 0 or 1",
                found=repr(value),
                remedy=_REMEDY_RECONVERT,
            )
        return value == 1

    def _read_array(self, key: str, depth: int) -> GGUFArray:
        cur, limits = self.cur, self.limits
        field = f"KV {key!r} array"
        item_type = cur.u32(f"{field} item type")
        item_name = self._type_name(item_type, f"{field} item type")
        if item_type == _ARRAY and depth + 1 >= limits.max_array_depth:
            raise ValueTypeError(
                self.name,
                field=f"{field} item type",
                expected=f"arrays nested at most {limits.max_array_depth} deep",
                found=f"depth {depth + 2}",
                remedy=_REMEDY_RECONVERT,
            )
        length = cur.u64(f"{field} length")
        _name, fmt, item_size = _VALUE_TYPES[item_type]
        remaining = cur.size - cur.pos
        if length * item_size > remaining:
            raise ArrayLengthError(
                self.name,
                field=f"{field} length",
                expected=f"at most {remaining // item_size} {item_name} items ({remaining} bytes left)",
                found=str(length),
                remedy="the file is truncated or hostile",
            )
        keep = length <= limits.max_kept_array_len
        if fmt:
            if not keep:
                cur.skip(length * item_size, f"{field} data")
                return GGUFArray(item_name, length, None)
            values = cur.scalars(fmt, length, item_size, f"{field} data")
            if item_type == _BOOL:
                return GGUFArray(item_name, length, tuple(self._bool(v, key) for v in values))
            return GGUFArray(item_name, length, tuple(values))
        if item_type == _STRING and not keep:
            cur.skip_strings(length, limits.max_string_bytes, f"{field} item")
            return GGUFArray(item_name, length, None)
        if not keep:  # walk and bounds-check every item, keep none (memory stays O(1) per item)
            for _ in range(length):
                self._read_value(item_type, key, depth + 1)
            return GGUFArray(item_name, length, None)
        kept = tuple(self._read_value(item_type, key, depth + 1) for _ in range(length))
        return GGUFArray(item_name, length, kept)

    def _alignment(self, kv: Mapping[str, GGUFValue], kv_types: Mapping[str, str]) -> int:
        if "general.alignment" not in kv:
            return DEFAULT_ALIGNMENT
        value, vtype = kv["general.alignment"], kv_types["general.alignment"]
        if vtype != "UINT32" or not isinstance(value, int) or value <= 0 or value & (value - 1):
            raise AlignmentError(
                self.name,
                field="general.alignment",
                expected="a UINT32 power of two (default 32)",
                found=f"{vtype} {value!r}",
                remedy=_REMEDY_RECONVERT,
            )
        return value

    def _quantization_version(self, kv: Mapping[str, GGUFValue], kv_types: Mapping[str, str]) -> None:
        key = "general.quantization_version"
        if key not in kv:
            return
        value, vtype = kv[key], kv_types[key]
        if vtype != "UINT32" or isinstance(value, bool) or value not in QUANTIZATION_VERSIONS:
            raise QuantizationVersionError(
                self.name,
                field=key,
                expected=f"a UINT32 in {sorted(QUANTIZATION_VERSIONS)} (the ggml quantization versions "
                "whose block layouts this shardport decodes)",
                found=f"{vtype} {value!r}",
                remedy="re-quantize the model with a current llama.cpp",
            )

    def _read_tensor_info(self, i: int, alignment: int) -> tuple[str, int, tuple[int, ...], int, int]:
        cur, name = self.cur, self.name
        tname = cur.text(self.limits.max_tensor_name_bytes, f"tensor #{i} name")
        n_dims = cur.u32(f"tensor {tname!r} n_dims")
        if n_dims > GGML_MAX_DIMS:
            raise DimensionError(
                name,
                tensor=tname,
                field="n_dims",
                expected=f"0..{GGML_MAX_DIMS}",
                found=str(n_dims),
                remedy=_REMEDY_RECONVERT,
            )
        *dim_list, type_id, offset = cur.fields(_INFO_TAILS[n_dims], f"tensor {tname!r} dims, type, offset")
        dims = tuple(dim_list)
        count = 1
        for d in dims:
            if d > SIZE_BOUND or (d and count > SIZE_BOUND // d):
                raise ShapeOverflowError(
                    name, tensor=tname, field="dims", expected="an element count ≤ 2**62", found=repr(dims)
                )
            count *= d
        if type_id not in GGML_TYPES:
            raise UnknownGGMLTypeError(
                name,
                tensor=tname,
                field="ggml type",
                expected=f"one of {sorted(GGML_TYPES)}",
                found=f"type number {type_id}",
                remedy="upgrade shardport's gguf package or re-quantize",
            )
        type_name, block, block_bytes = GGML_TYPES[type_id]
        ne0 = dims[0] if dims else 1
        if ne0 % block:
            raise BlockSizeError(
                name,
                tensor=tname,
                field="ne0",
                expected=f"a multiple of {block} ({type_name} block size)",
                found=str(ne0),
                remedy="pad the row or choose another quantization type",
            )
        if offset % alignment:
            raise MisalignedTensorError(
                name,
                tensor=tname,
                field="offset",
                expected=f"a multiple of {alignment}",
                found=str(offset),
                remedy=_REMEDY_RECONVERT,
            )
        return tname, type_id, dims, offset, count // block * block_bytes

    def _place(
        self, infos: list[tuple[str, int, tuple[int, ...], int, int]], data_offset: int, alignment: int
    ) -> list[GGUFTensorRecord]:
        name, size = self.name, self.cur.size
        records: list[GGUFTensorRecord] = []
        seen: set[str] = set()
        for tname, type_id, dims, offset, nbytes in infos:
            if tname in seen:
                raise DuplicateKeyError(
                    name,
                    tensor=tname,
                    field="tensor name",
                    expected="unique names",
                    found="a second tensor",
                    remedy=_REMEDY_RECONVERT,
                )
            seen.add(tname)
            start = data_offset + offset
            if start + nbytes > size:
                raise TensorOutOfBoundsError(
                    name,
                    tensor=tname,
                    field="offset",
                    expected=f"bytes [{start}, {start + nbytes}) inside the {size}-byte file",
                    found=f"{start + nbytes - size} bytes beyond the end",
                    remedy="the file is truncated or its header lies",
                )
            records.append(
                GGUFTensorRecord(
                    tname, GGML_TYPES[type_id][0], type_id, dims, tuple(reversed(dims)), start, start + nbytes
                )
            )
        last: GGUFTensorRecord | None = None
        for rec in sorted(records, key=lambda r: (r.start, r.end, r.name)):
            if last is not None and rec.start < last.end and rec.end > rec.start:
                raise TensorOverlapError(
                    name,
                    tensor=rec.name,
                    field="offset",
                    expected=f"≥ {last.end - data_offset} (end of {last.name!r})",
                    found=f"{rec.start - data_offset}: it overlaps {last.name!r}",
                    remedy=_REMEDY_RECONVERT,
                )
            if last is None or rec.end >= last.end:
                last = rec
        if self.limits.strict_layout:
            expected = 0
            for rec in records:
                if rec.start - data_offset != expected:
                    raise TensorLayoutError(
                        name,
                        tensor=rec.name,
                        field="offset",
                        expected=f"{expected} (previous tensor's end padded to {alignment})",
                        found=str(rec.start - data_offset),
                        remedy="rewrite the file with gguf-py or llama.cpp",
                    )
                expected = -(-(rec.end - data_offset) // alignment) * alignment
        return records
