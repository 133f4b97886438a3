"""The one set of rules for checkpoint file paths: manifests (untrusted) and folders being pushed.

A path is accepted only if every file system a checkpoint is pulled onto (Linux, macOS, Windows) can
hold it as exactly one file that reads the same everywhere. Refused:

- empty, longer than :data:`MAX_PATH_BYTES` bytes of UTF-8, or a segment longer than
  :data:`MAX_SEGMENT_BYTES` (the usual ``NAME_MAX``);
- absolute (``/x``, ``C:x``), empty, ``.`` or ``..`` segments, backslashes;
- control characters (C0, DEL, C1), line and paragraph separators, surrogates (undecodable bytes), and
  format characters (Unicode category Cf: the bidirectional controls U+202A to U+202E and U+2066 to U+2069,
  zero-width characters, the byte order mark), which make a name display as another;
- a path that is not in Unicode NFC (macOS and Windows may hand it back in another form);
- the reserved metadata folder ``.shardport/`` (in any case);
- two paths that are one file on a case-insensitive or normalisation-insensitive file system (equal
  after NFC and case folding), and a file that is also another file's folder (same comparison).
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import PurePosixPath

from shardport.registry.checkpoint.describe import METADATA_DIR
from shardport.registry.errors import RegistryError, UnsafePathError

MAX_PATH_BYTES = 1024
MAX_SEGMENT_BYTES = 255
_BIDI = frozenset(range(0x202A, 0x202F)) | frozenset(range(0x2066, 0x206A))
_ASCII_BAD = re.compile(r"[\x00-\x1f\x7f\\]")


def _bad_character(c: str) -> str | None:
    """Why character ``c`` may not appear in a path, or None."""
    code = ord(c)
    if code < 0x20 or 0x7F <= code <= 0x9F:
        return f"control character U+{code:04X}"
    if code in _BIDI:
        return f"bidirectional control U+{code:04X} (it makes the name display as another)"
    category = unicodedata.category(c)
    if category == "Cf":
        return f"invisible format character U+{code:04X}"
    if category == "Cs":
        return f"undecodable byte (surrogate U+{code:04X}); file names must be UTF-8"
    if category in ("Zl", "Zp"):
        return f"line or paragraph separator U+{code:04X}"
    return None


def path_problem(raw: str) -> str | None:
    """Why ``raw`` is not an acceptable checkpoint path, or None (the rules of this module)."""
    if not raw:
        return "empty path"
    ascii_bad = _ASCII_BAD.search(raw)
    if ascii_bad and ascii_bad.group() == "\\":
        return "backslashes are refused (a folder separator on Windows)"
    if ascii_bad:
        return f"{_bad_character(ascii_bad.group())}: control and format characters are refused"
    if not raw.isascii():
        for c in raw:
            bad = _bad_character(c) if ord(c) > 0x7F else None
            if bad:
                return f"{bad}: control and format characters are refused"
    if len(raw.encode()) > MAX_PATH_BYTES:
        return f"longer than {MAX_PATH_BYTES} bytes of UTF-8"
    if raw.startswith("/") or (len(raw) > 1 and raw[1] == ":"):
        return "absolute paths are refused"
    if unicodedata.normalize("NFC", raw) != raw:
        return (
            f"not in Unicode NFC (as NFC: {unicodedata.normalize('NFC', raw)!r}); "
            "rename the file to its NFC form"
        )
    parts = raw.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "empty, '.' or '..' segments would escape the destination"
    long = next((p for p in parts if len(p.encode()) > MAX_SEGMENT_BYTES), None)
    if long is not None:
        return f"segment {long[:40]!r}… is longer than {MAX_SEGMENT_BYTES} bytes of UTF-8"
    if fold(parts[0]) == METADATA_DIR:
        return f"{METADATA_DIR}/ is reserved for shardport metadata"
    return None


def fold(path: str) -> str:
    """The form under which two paths are one file on a case- and normalisation-insensitive system."""
    if path.isascii():
        return path.lower()
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", path).casefold())


def check_paths(
    paths: list[str],
    *,
    source: str,
    error: type[RegistryError] = UnsafePathError,
    what: str = "file path",
) -> list[PurePosixPath]:
    """Return ``paths`` as relative POSIX paths, or raise ``error`` naming ``source`` and the path.

    ``error`` is :class:`UnsafePathError` for a manifest (the store lied) and ``UsageError`` for a
    folder being pushed (the user can rename the file). See the module docstring for the rules.
    """
    seen: dict[str, str] = {}
    out: list[PurePosixPath] = []
    for raw in paths:
        where = f"{source}: {what} {raw!r}"
        problem = path_problem(raw)
        if problem:
            raise error(f"{where}: {problem}")
        key = fold(raw)
        if key in seen:
            other = seen[key]
            if other == raw:
                raise error(f"{where}: listed twice")
            raise error(
                f"{where}: differs from {other!r} only in case or Unicode form; the two would be one "
                "file on macOS and Windows"
            )
        seen[key] = raw
        out.append(PurePosixPath(raw))
    for key, raw in seen.items():
        cut = key.rfind("/")
        while cut > 0:
            folder = seen.get(key[:cut])
            if folder is not None:
                raise error(f"{source}: {folder!r} is both a file and the folder of {raw!r}")
            cut = key.rfind("/", 0, cut)
    return out
