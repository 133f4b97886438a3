"""References: ``NAME:TAG`` and ``NAME@sha256:HEX``, with validated repository names."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardport.registry.artifact.hashing import DIGEST_FORM, is_digest
from shardport.registry.errors import UsageError

if TYPE_CHECKING:
    from shardport.registry.artifact.digests import Digest

# Whole-string matches only (``fullmatch``): ``re.match`` with ``$`` accepts a trailing newline.
_SEGMENT = re.compile(r"[a-z0-9][a-z0-9._-]*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
RESERVED_SEGMENTS = frozenset({"tags", "referrers"})


def validate_name(name: str) -> str:
    """Return ``name`` if it is a valid repository name, else raise :class:`UsageError`.

    Lowercase letters, digits and ``._-`` in ``/``-separated segments; no empty, dot-only or reserved
    (``tags``, ``referrers``) segments.
    """
    if not name or len(name) > 255:
        raise UsageError(f"repository name {name!r}: expected 1-255 characters")
    for seg in name.split("/"):
        if not _SEGMENT.fullmatch(seg) or set(seg) == {"."}:
            raise UsageError(
                f"repository name {name!r}: segment {seg!r} must be lowercase letters, digits and "
                "'._-', starting with a letter or digit"
            )
        if seg in RESERVED_SEGMENTS:
            raise UsageError(f"repository name {name!r}: segment {seg!r} is reserved")
    return name


def validate_tag(tag: str) -> str:
    """Return ``tag`` if valid (letters, digits, ``._-``, at most 128), else raise :class:`UsageError`."""
    if not _TAG.fullmatch(tag):
        raise UsageError(f"tag {tag!r}: expected letters, digits and '._-', at most 128 characters")
    return tag


def validate_digest(digest: str) -> Digest:
    """Return ``digest`` if it is ``sha256:<64 lowercase hex>``, else raise :class:`UsageError`."""
    if not is_digest(digest):
        raise UsageError(f"digest {digest!r}: expected {DIGEST_FORM}")
    return digest


@dataclass(frozen=True, slots=True)
class Ref:
    """A parsed reference: a repository plus either a tag or a manifest digest."""

    name: str
    tag: str | None = None
    digest: Digest | None = None

    def __str__(self) -> str:
        return f"{self.name}@{self.digest}" if self.digest else f"{self.name}:{self.tag}"


def parse_ref(text: str, *, require_tag: bool = False) -> Ref:
    """Parse ``NAME:TAG`` or ``NAME@sha256:HEX``."""
    if "@" in text:
        if require_tag:
            raise UsageError(f"reference {text!r}: this command needs NAME:TAG, not a digest")
        name, _, digest = text.partition("@")
        return Ref(name=validate_name(name), digest=validate_digest(digest))
    name, sep, tag = text.rpartition(":")
    if not sep or "/" in tag:
        raise UsageError(f"reference {text!r}: expected NAME:TAG or NAME@sha256:HEX")
    return Ref(name=validate_name(name), tag=validate_tag(tag))
