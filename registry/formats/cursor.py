"""A bounded forward cursor over the header of a :class:`ByteSource`.

The cursor buffers the file from offset 0 as parsing advances, growing the buffer geometrically (so a
range-read source sees a handful of reads), and never past ``min(size, cap)``: a header that needs
more than the cap raises :class:`HeaderTooLargeError`, one that needs more than the file raises
:class:`TruncatedFileError`, both *before* any read or allocation of that size.
"""

from __future__ import annotations

import struct
from typing import cast

from shardport.registry.formats.notes import Notes

from .errors import (
    HeaderEncodingError,
    HeaderTooLargeError,
    StringLengthError,
    TruncatedFileError,
)
from .source import ByteSource, read_exact, source_size

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_MIN_READ = 64 * 1024


class HeaderCursor:
    """Reads little-endian scalars and length-prefixed strings, checking every length first."""

    __slots__ = ("_buf", "_cap", "_limit", "_source", "name", "pos", "size")

    def __init__(self, source: ByteSource, cap: int) -> None:
        self._source = source
        self.name = source.name
        self.size = source_size(source)
        self._cap = cap
        self._limit = min(self.size, cap)
        self._buf = bytearray()
        self.pos = 0

    @property
    def bytes_read(self) -> int:
        """How many bytes have been read from the source so far."""
        return len(self._buf)

    def _fill(self, end: int, what: str) -> None:
        if end > self.size:
            raise TruncatedFileError(
                self.name,
                field=what,
                expected=f"{end - self.pos} bytes at offset {self.pos}",
                found=f"{self.size - self.pos} bytes left in the {self.size}-byte file",
                remedy="re-download the file",
            )
        if end > self._cap:
            raise HeaderTooLargeError(
                self.name,
                field=what,
                expected=f"a header within the first {self._cap} bytes",
                found=f"a header reaching offset {end}",
                remedy="the header is corrupt or hostile: shardport reads no GGUF header past this cap",
            )
        have = len(self._buf)
        new_end = min(max(end, 2 * have, _MIN_READ), self._limit)
        self._buf.extend(read_exact(self._source, have, new_end - have, what=what))

    def _ensure(self, n: int, what: str) -> int:
        start = self.pos
        if start + n > len(self._buf):
            self._fill(start + n, what)
        self.pos = start + n
        return start

    def take(self, n: int, what: str) -> bytes:
        """Return the next ``n`` bytes."""
        start = self._ensure(n, what)
        return bytes(self._buf[start : start + n])

    def skip(self, n: int, what: str) -> None:
        """Advance ``n`` bytes (they are still bounds-checked and buffered)."""
        self._ensure(n, what)

    def u32(self, what: str) -> int:
        """Read a u32."""
        return cast(int, _U32.unpack_from(self._buf, self._ensure(4, what))[0])

    def u64(self, what: str) -> int:
        """Read a u64."""
        return cast(int, _U64.unpack_from(self._buf, self._ensure(8, what))[0])

    def fields(self, layout: struct.Struct, what: str) -> tuple[int, ...]:
        """Read one fixed record of integers described by ``layout``."""
        return cast(tuple[int, ...], layout.unpack_from(self._buf, self._ensure(layout.size, what)))

    def scalars(self, fmt: str, count: int, item_size: int, what: str) -> tuple[int | float, ...]:
        """Read ``count`` little-endian scalars of struct format ``fmt`` (``item_size`` bytes each)."""
        start = self._ensure(count * item_size, what)
        return cast(tuple[int | float, ...], struct.unpack_from(f"<{count}{fmt}", self._buf, start))

    def _string_length(self, cap: int, what: str) -> int:
        n = self.u64(f"{what} length")
        left = self.size - self.pos
        if n > cap or n > left:
            raise StringLengthError(
                self.name,
                field=f"{what} length",
                expected=f"at most {min(cap, left)} bytes (cap {cap}, {left} bytes left in the file)",
                found=str(n),
                remedy="the file is truncated or hostile",
            )
        return n

    def text(self, cap: int, what: str, notes: Notes | None = None) -> str:
        """Read a length-prefixed UTF-8 string of at most ``cap`` bytes.

        Invalid UTF-8 raises :class:`HeaderEncodingError`; with ``notes`` (a value, not a name) the
        error goes there instead and the text is decoded with U+FFFD for each bad byte.
        """
        raw = self.take(self._string_length(cap, what), what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            error = HeaderEncodingError(
                self.name,
                field=what,
                expected="UTF-8 text",
                found=f"invalid byte at position {exc.start}",
                remedy="re-convert the model with a current llama.cpp / gguf-py",
            )
            if notes is None:
                raise error from exc
            notes.add(error)
            return raw.decode("utf-8", errors="replace")

    def skip_strings(self, count: int, cap: int, what: str) -> None:
        """Bounds-check and skip ``count`` length-prefixed strings without decoding them.

        The loop is the hot path of a GGUF header (tokenizer vocabularies); strings wholly inside the
        buffer take the fast branch, anything else goes through the checked :meth:`_string_length`.
        """
        buf, unpack = self._buf, _U64.unpack_from
        p, end = self.pos, len(buf)
        for _ in range(count):
            if p + 8 <= end:
                n = unpack(buf, p)[0]
                q = p + 8 + n
                if q <= end and n <= cap:
                    p = q
                    continue
            self.pos = p
            self.skip(self._string_length(cap, what), what)
            p, end = self.pos, len(buf)
        self.pos = p
