"""Canonical JSON (RFC 8785) of a document to be signed, refusing NaN and ±inf by their place.

JCS has no NaN or infinity: ``rfc8785`` raises an untyped error deep inside serialisation, which a
caller would report as an internal bug. :func:`nonfinite_paths` finds every non-finite float of a
document (by JSON pointer); :func:`canonical_bytes` refuses such a document with
:class:`~.errors.NonFiniteNumberError` naming them, before anything is serialised or signed. Every
statement is canonicalised here (:meth:`.statement.Statement.to_bytes`), so no field, present or
added later, can carry a NaN into a signed document; a producer that measures values (the bring-up's
evidence) catches the error and records the values as failing measurements instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import rfc8785

from .errors import NonFiniteNumberError

#: How a non-finite float is written where a document records one as a failed measurement (JSON has
#: no NaN; Python's ``float`` and JavaScript's ``Number`` read these back).
NONFINITE_TEXT = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def finite_text(doc: Any) -> Any:
    """A copy of ``doc``: each non-finite float as its text (:data:`NONFINITE_TEXT`), tuples as lists."""
    if isinstance(doc, float):
        if math.isfinite(doc):
            return doc
        return NONFINITE_TEXT["nan" if math.isnan(doc) else "inf" if doc > 0 else "-inf"]
    if isinstance(doc, Mapping):
        return {k: finite_text(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [finite_text(v) for v in doc]
    return doc


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def nonfinite_paths(doc: Any, at: str = "") -> list[str]:
    """The JSON pointers (RFC 6901) of every NaN or infinite float in ``doc``, in document order."""
    if isinstance(doc, float):
        return [] if math.isfinite(doc) else [at]
    if isinstance(doc, Mapping):
        return [p for k, v in doc.items() for p in nonfinite_paths(v, f"{at}/{_escape(str(k))}")]
    if isinstance(doc, list | tuple):
        return [p for i, v in enumerate(doc) for p in nonfinite_paths(v, f"{at}/{i}")]
    return []


def check_finite(doc: Any) -> None:
    """Raise :class:`NonFiniteNumberError` when ``doc`` holds a NaN or an infinity anywhere."""
    paths = nonfinite_paths(doc)
    if paths:
        raise NonFiniteNumberError(paths)


def canonical_bytes(doc: Any) -> bytes:
    """RFC 8785 bytes of ``doc``; a NaN or infinity anywhere is :class:`NonFiniteNumberError`."""
    check_finite(doc)
    return rfc8785.dumps(doc)
