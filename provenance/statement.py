"""in-toto Statement v1: the signed payload that binds a predicate to subject digests."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .canonical import canonical_bytes

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"


@dataclass(frozen=True, slots=True)
class Subject:
    """One subject of a statement: a name and its sha256 digest (hex, no prefix)."""

    name: str
    sha256: str


@dataclass(frozen=True, slots=True)
class Statement:
    """An in-toto Statement v1."""

    subjects: tuple[Subject, ...]
    predicate_type: str
    predicate: dict[str, Any]

    def to_bytes(self) -> bytes:
        """Canonical (RFC 8785) JSON bytes of the statement.

        A NaN or inf anywhere in the predicate is :class:`~.errors.NonFiniteNumberError` (:mod:`.canonical`).
        """
        doc: dict[str, Any] = {
            "_type": STATEMENT_TYPE,
            "subject": [{"name": s.name, "digest": {"sha256": s.sha256}} for s in self.subjects],
            "predicateType": self.predicate_type,
            "predicate": self.predicate,
        }
        return canonical_bytes(doc)

    @classmethod
    def from_bytes(cls, data: bytes) -> Statement:
        """Parse a statement; raises ``ValueError`` naming the field that is wrong."""
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deep, a huge number
            raise ValueError(f"statement is not JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise ValueError("statement is not a JSON object")
        if doc.get("_type") != STATEMENT_TYPE:
            raise ValueError(f"statement _type: expected {STATEMENT_TYPE!r}, found {doc.get('_type')!r}")
        raw_subjects = doc.get("subject")
        if not isinstance(raw_subjects, list) or not raw_subjects:
            raise ValueError("statement subject: expected a non-empty list")
        subjects = []
        for item in raw_subjects:
            digest = item.get("digest") if isinstance(item, dict) else None
            name = item.get("name") if isinstance(item, dict) else None
            sha = digest.get("sha256") if isinstance(digest, dict) else None
            if not isinstance(name, str) or not isinstance(sha, str):
                raise ValueError(f"statement subject entry malformed: {item!r}")
            subjects.append(Subject(name=name, sha256=sha))
        ptype = doc.get("predicateType")
        predicate = doc.get("predicate")
        if not isinstance(ptype, str) or not isinstance(predicate, dict):
            raise ValueError("statement predicateType/predicate missing or of the wrong type")
        return cls(subjects=tuple(subjects), predicate_type=ptype, predicate=predicate)
